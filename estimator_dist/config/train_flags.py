"""The flags of `estimator_dist.train`, and the `JobConfig` they make.

Every training setting is written once, as a field of `JobConfig` (or of the
`RunConfigOptions` and `StrategyConfig` it nests) that carries its flag:
`define_flags` generates the flags from those fields (docs/flags.md is
generated from the flags), and `job_from_flags` builds the frozen, validated
`JobConfig` the driver receives from the parsed flags, after Model Garden's
flags are mapped onto ours (`garden_flags`), so library code never reads
FLAGS. The launcher, the check and the manifest parse the flags given after
their `--` with `estimator_dist.config.train_args`. No TensorFlow import.
"""

from __future__ import annotations

from absl import flags

from estimator_dist.base import settings
from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import parse_params_flag
from estimator_dist.config import garden_flags
from estimator_dist.config.job import JobConfig
from estimator_dist.hardware.cpus import ONEDNN_SETTINGS

PROGRAM = "estimator_dist.train"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the training flags on `flag_values`: the job's settings, then the task's own."""
    f = flag_values
    settings.define_flags(JobConfig, f, __name__)
    flags.DEFINE_boolean(
        "verbose",
        False,
        "Print everything TensorFlow and absl log on the console too (deprecation warnings, "
        "start-up lines, Estimator's INFO lines). By default a single process shows a progress "
        "line every --log_step_count_steps steps, warnings, errors and the metrics, and writes "
        "the full log to model_dir/logs/<task>.log; under the launcher, pass --verbose to the "
        "launcher; a task of a cluster platform (TF_CONFIG set) prints everything anyway.",
        flag_values=f,
    )
    flags.DEFINE_enum(
        "onednn",
        "auto",
        ONEDNN_SETTINGS,
        "oneDNN kernels (TF_ENABLE_ONEDNN_OPTS): on, off, or auto, which keeps the "
        "environment's TF_ENABLE_ONEDNN_OPTS and otherwise turns them on. TensorFlow 2.15 "
        "leaves them off on CPUs without AVX-512 VNNI/BF16 or AMX, where they train "
        "mnist_cnn 3.1x and ResNet-20 1.9x faster.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.mark_flags_as_mutual_exclusive(["model_fn", "keras_model", "estimator"], flag_values=f)
    garden_flags.define_flags(f)


def job_from_flags(f: flags.FlagValues = flags.FLAGS, read_data: bool = True) -> JobConfig:
    """Turns parsed flags into a validated `JobConfig`.

    Args:
      f: Parsed training flags (`define_flags`).
      read_data: Whether the job's data is on this machine, to be looked at
        for Model Garden's mappings (CIFAR-10's binary release, examples in an
        epoch); False for a manifest, whose data is in the cluster: the
        epoch flags are then mapped by each task.

    Raises:
      UsageError: if the values do not make a valid job.
    """
    try:
        garden = garden_flags.resolve(f, parse_params_flag(f.params), read_data)
        return settings.from_flags(JobConfig, f, garden.settings(), notes=garden.notes)
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from None
