"""Print a Kubernetes job that runs `estimator_dist.train` (or a script) on every pod.

  python -m estimator_dist.manifest --kind=jobset --name=mnist \\
      --image=registry.example.com/trainer:1.0 --num_workers=4 --evaluator \\
      -- --model_dir=gs://bucket/mnist --train_steps=5000 | kubectl apply -f -
  python -m estimator_dist.manifest --name=census --image=IMAGE --num_workers=2 \\
      --module=trainer.task [--package_path=/app] -- --job-dir=gs://bucket/census

`--kind` chooses what is printed: `tfjob` (the default: a Kubeflow TFJob for
training-operator v1), `trainjob` (a Kubeflow Trainer v2 TrainJob and the
TrainingRuntime it runs), `jobset` (a JobSet) or `indexed-job` (a headless
Service and Indexed Jobs, for a cluster with no operator); in the last three
each pod builds its TF_CONFIG itself. Every document is checked against its
kind's schema before anything is printed.

Everything after `--` is the training job's flags, the same on every replica;
they are checked here as every task would check them (an unknown flag, a bad
value, a strategy that does not fit the replicas, a global batch that does not
divide), so a mistake exits 2 here and not in the cluster. `--num_workers`
counts training tasks the way the launcher's does: the chief and N-1 workers.
`--model_dir` must be shared by every pod: a remote URL, or a path under a
PersistentVolumeClaim mounted with `--pvc=CLAIM:/mount/path`. Warnings go to
standard error, the YAML to standard output. Which kind to use, what each
field means and what restarts what: docs/kubernetes.md.

With `--script=PATH` or `--module=PACKAGE.MODULE` every replica runs
`python -m estimator_dist.script [its flags] ... -- [the program's arguments]`
instead, and everything after `--` is the program's own arguments. The
program is inside the image: its path, and `--package_path` (default: the
image's working directory), are paths in the image, checked only for their
form here; the model_dir is `--model_dir` or the program's `--model_dir`,
`--job-dir`, ... argument. Nothing here imports TensorFlow (estimator_dist.kubernetes.manifest
does the work).
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import flags

from estimator_dist.base import settings
from estimator_dist.base.errors import Error, UsageError
from estimator_dist.kubernetes import manifest
from estimator_dist.kubernetes.job_settings import ManifestSettings
from estimator_dist.programs import config as script_config
from estimator_dist.report import cli

PROGRAM = "estimator_dist.manifest"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the manifest's flags on `flag_values`: the job's settings, then the program's."""
    f = flag_values
    settings.define_flags(ManifestSettings, f, __name__)
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


def main(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """Prints the manifest for the parsed flags and the training flags after `--`."""
    try:
        text, warnings = manifest.generate(flag_values, argv[1:])
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
    define_flags()
    cli.run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
