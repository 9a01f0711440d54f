"""Print a Kubeflow TFJob that runs `estimator_dist.train` (or a script) on every replica.

  python -m estimator_dist.manifest --name=mnist --image=registry.example.com/trainer:1.0 \\
      --num_workers=4 --evaluator -- --model_dir=gs://bucket/mnist --train_steps=5000 \\
      | kubectl apply -f -
  python -m estimator_dist.manifest --name=census --image=IMAGE --num_workers=2 \\
      --module=trainer.task [--package_path=/app] -- --job-dir=gs://bucket/census

Everything after `--` is the training job's flags, the same on every replica;
they are checked here as every task would check them (an unknown flag, a bad
value, a strategy that does not fit the replicas, a global batch that does not
divide), so a mistake exits 2 here and not in the cluster. `--num_workers`
counts training tasks the way the launcher's does: the chief and N-1 workers.
`--model_dir` must be shared by every pod: a remote URL, or a path under a
PersistentVolumeClaim mounted with `--pvc=CLAIM:/mount/path`. Warnings go to
standard error, the YAML to standard output. What each field means and how the
operator treats the job: docs/kubernetes.md.

With `--script=PATH` or `--module=PACKAGE.MODULE` every replica runs
`python -m estimator_dist.script [its flags] ... -- [the program's arguments]`
instead, and everything after `--` is the program's own arguments. The
program is inside the image: its path, and `--package_path` (default: the
image's working directory), are paths in the image, checked only for their
form here; the model_dir is `--model_dir` or the program's `--model_dir`,
`--job-dir`, ... argument. Nothing here imports TensorFlow in that form.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import List, Sequence, Tuple

from absl import flags

from estimator_dist.base import cli
from estimator_dist.base.errors import Error, UsageError
from estimator_dist.config import train_args, train_flags
from estimator_dist.kubernetes import tfjob
from estimator_dist.programs import config as script_config

PROGRAM = "estimator_dist.manifest"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the manifest's flags on `flag_values`."""
    f = flag_values
    flags.DEFINE_string(
        "name",
        None,
        "The TFJob's name: a DNS-1035 label; pods and services are NAME-<type>-<index>.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "image", None, "Container image with estimator-dist and the model code.", flag_values=f
    )
    flags.DEFINE_integer(
        "num_workers",
        None,
        "Training tasks, the chief included: a Chief replica and NUM_WORKERS-1 Worker replicas.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_boolean(
        "evaluator",
        False,
        "Add an Evaluator replica, which evaluates each checkpoint and writes the final "
        "metrics; cleanPodPolicy becomes None so that the chief's success does not end it.",
        flag_values=f,
    )
    flags.DEFINE_integer(
        "num_ps",
        0,
        "PS replicas (with --distribution_strategy=parameter_server after '--').",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "gpus_per_worker",
        0,
        "nvidia.com/gpu limit of the chief and each worker; the training flags get "
        "--communication=NCCL unless they choose the collectives themselves.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_string("namespace", "default", "Kubernetes namespace of the TFJob.", flag_values=f)
    flags.DEFINE_multi_string(
        "pvc",
        [],
        "CLAIM:/mount/path: mount this PersistentVolumeClaim at that path in every pod; a "
        "local --model_dir must be under one.",
        flag_values=f,
    )
    flags.DEFINE_multi_string(
        "env", [], "KEY=VALUE environment variable of every container.", flag_values=f
    )
    flags.DEFINE_multi_string(
        "label", [], "KEY=VALUE label of the TFJob and its pods.", flag_values=f
    )
    flags.DEFINE_multi_string(
        "annotation",
        [],
        "KEY=VALUE annotation of the TFJob and its pods.",
        flag_values=f,
    )
    flags.DEFINE_integer(
        "backoff_limit",
        3,
        "runPolicy.backoffLimit: retries before the job fails. Training-operator 1.9 "
        "does not count ExitCode pod re-creations against it (docs/kubernetes.md); "
        "--active_deadline_secs bounds a job that keeps failing.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "active_deadline_secs",
        None,
        "runPolicy.activeDeadlineSeconds: fail the job after this many seconds.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "ttl_secs_after_finished",
        None,
        "runPolicy.ttlSecondsAfterFinished: delete the TFJob and its pods this many "
        "seconds after it finished.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_string(
        "script",
        None,
        "Run this script, a path inside the image, with estimator_dist.script on every "
        "replica; the arguments after `--` are then the script's own (docs/scripts.md).",
        flag_values=f,
    )
    script_config.define_flags(
        f,
        "With --module: the directory inside the image holding the module's top-level "
        "package (default: the image's working directory).",
    )
    flags.mark_flags_as_required(["name", "image", "num_workers"], flag_values=f)


def parse_train_args(args: Sequence[str]) -> flags.FlagValues:
    """Parses the training flags as `estimator_dist.train` does, absl's own flags included.

    Raises:
      UsageError: for an unknown flag, a bad value, a missing --model_dir or a
        positional argument.
    """
    if not any(arg == "--model_dir" or arg.startswith("--model_dir=") for arg in args):
        raise UsageError(
            "the training flags after '--' set no --model_dir: every replica needs the same "
            "shared one, e.g. `-- --model_dir=gs://bucket/run1`, or a path under a --pvc "
            "mount, e.g. `--pvc=shared-runs:/mnt/runs -- --model_dir=/mnt/runs/run1`."
        )
    return train_args.parse_args(args)


def _pairs(flag: str, items: Sequence[str]) -> Tuple[Tuple[str, str], ...]:
    """Parses repeated `KEY=VALUE` values of `flag`."""
    pairs = []
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise UsageError(f"{flag}={item}: expected KEY=VALUE, such as {flag}=team=vision.")
        pairs.append((key, value))
    return tuple(pairs)


def _common(f: flags.FlagValues) -> dict:
    """The TFJob settings that do not depend on the program."""
    return dict(
        name=f.name,
        image=f.image,
        num_workers=f.num_workers,
        namespace=f.namespace,
        evaluator=f.evaluator,
        num_ps=f.num_ps,
        gpus_per_worker=f.gpus_per_worker,
        mounts=tuple(tfjob.Mount.parse(text) for text in f.pvc),
        env=_pairs("--env", f.env),
        labels=_pairs("--label", f.label),
        annotations=_pairs("--annotation", f.annotation),
        backoff_limit=f.backoff_limit,
        active_deadline_secs=f.active_deadline_secs,
        ttl_secs_after_finished=f.ttl_secs_after_finished,
    )


def _script_settings(f: flags.FlagValues, args: Sequence[str]) -> tfjob.TFJobSettings:
    """The TFJob of a `--script` or `--module` job, checked without TensorFlow.

    Raises:
      UsageError: for a bad flag, program name, no model_dir, or ps replicas.
    """
    config = script_config.config_from_flags(f, f.script, args, resolve=False)
    program = f"--module={config.module}" if config.module else f"--script={config.path}"
    if f.num_ps:
        raise UsageError(
            f"--num_ps={f.num_ps} with {program}: its replicas train with the strategy "
            "the program's RunConfig sets, or MultiWorkerMirroredStrategy, and a script's "
            "parameter servers need its own ParameterServerStrategy; leave --num_ps out."
        )
    model_dir = config.model_dir or script_config.model_dir_of(args)
    if not model_dir:
        raise UsageError(
            f"{program} needs the shared directory its estimator writes to, and none of "
            f"its arguments after '--' names it ({', '.join(script_config.MODEL_DIR_ARGS)}). "
            "Pass it as --model_dir=DIR before '--', and give the program the same one."
        )
    chosen = f["communication"].present
    communication = "NCCL" if f.gpus_per_worker and not chosen else config.communication
    config = dataclasses.replace(config, model_dir=model_dir, communication=communication)
    return tfjob.TFJobSettings(
        model_dir=model_dir,
        train_args=tuple(config.to_args()),
        preemption_grace_secs=config.preemption_grace_secs,
        communication=config.communication if chosen else None,
        program=script_config.PROGRAM,
        **_common(f),
    )


def generate(f: flags.FlagValues, train_args: Sequence[str]) -> Tuple[str, List[str]]:
    """The TFJob's YAML and the warnings for it, from parsed manifest flags.

    Raises:
      UsageError: for a bad flag of either program, or a job that cannot run.
      Error: if the Kubeflow Training SDK is missing.
    """
    if f.script or f.module or f.package_path is not None:
        settings = _script_settings(f, train_args)
        return tfjob.to_yaml(tfjob.build_tfjob(settings)), settings.warnings()
    given = [name for name in script_config.FLAG_NAMES if f[name].present]
    if given:
        raise UsageError(
            f"--{given[0]} is a flag of --script and --module jobs; for an "
            f"estimator_dist.train job give it after '--' (e.g. `-- --{given[0]}=...`)."
        )
    parsed = parse_train_args(train_args)
    job = train_flags.job_from_flags(parsed)
    settings = tfjob.TFJobSettings(
        model_dir=job.run.model_dir,
        train_args=tuple(train_args),
        preemption_grace_secs=job.preemption_grace_secs,
        strategy=job.strategy.name,
        communication=job.strategy.communication if parsed["communication"].present else None,
        **_common(f),
    )
    tfjob.check_train_job(settings, job)
    return tfjob.to_yaml(tfjob.build_tfjob(settings)), settings.warnings()


def main(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """Prints the TFJob for the parsed flags and the training flags after `--`."""
    try:
        text, warnings = generate(flag_values, argv[1:])
    except UsageError as error:
        cli.usage_exit(PROGRAM, str(error))
    except Error as error:
        sys.stderr.write(f"{PROGRAM}: error: {error}\n")
        return error.exit_code
    for warning in warnings:
        sys.stderr.write(f"{PROGRAM}: warning: {warning}\n")
    sys.stdout.write(text)
    return 0


def run() -> None:
    """Console-script entry point."""
    # Checking the training flags imports TensorFlow, whose C++ start-up lines would bury
    # the warnings on standard error; this process runs no TensorFlow op.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    define_flags()
    cli.run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
