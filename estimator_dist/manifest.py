"""Print a Kubeflow TFJob that runs `estimator_dist.train` on every replica.

  python -m estimator_dist.manifest --name=mnist --image=registry.example.com/trainer:1.0 \\
      --num_workers=4 --evaluator -- --model_dir=gs://bucket/mnist --train_steps=5000 \\
      | kubectl apply -f -

Everything after `--` is the training job's flags, the same on every replica;
they are checked here as every task would check them (an unknown flag, a bad
value, a strategy that does not fit the replicas, a global batch that does not
divide), so a mistake exits 2 here and not in the cluster. `--num_workers`
counts training tasks the way the launcher's does: the chief and N-1 workers.
`--model_dir` must be shared by every pod: a remote URL, or a path under a
PersistentVolumeClaim mounted with `--pvc=CLAIM:/mount/path`. Warnings go to
standard error, the YAML to standard output. What each field means and how the
operator treats the job: docs/kubernetes.md.
"""

from __future__ import annotations

import os
import sys
from typing import List, Sequence, Tuple

from absl import flags

from estimator_dist import tfjob, train_args, train_flags
from estimator_dist.base import cli
from estimator_dist.base.errors import Error, UsageError

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


def generate(f: flags.FlagValues, train_args: Sequence[str]) -> Tuple[str, List[str]]:
    """The TFJob's YAML and the warnings for it, from parsed manifest flags.

    Raises:
      UsageError: for a bad flag of either program, or a job that cannot run.
      Error: if the Kubeflow Training SDK is missing.
    """
    parsed = parse_train_args(train_args)
    job = train_flags.job_from_flags(parsed)
    settings = tfjob.TFJobSettings(
        name=f.name,
        image=f.image,
        num_workers=f.num_workers,
        model_dir=job.run.model_dir,
        train_args=tuple(train_args),
        preemption_grace_secs=job.preemption_grace_secs,
        strategy=job.strategy.name,
        communication=job.strategy.communication if parsed["communication"].present else None,
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
