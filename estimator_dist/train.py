"""Train and evaluate a model on this task of a (possibly multi-worker) job.

Run the same command on every task; TF_CONFIG tells each one its role:

  TF_CONFIG='{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"]},
              "task": {"type": "chief", "index": 0}}' \\
  python -m estimator_dist.train --model_dir=/shared/run1 --train_steps=1000

Without TF_CONFIG (or Vertex AI's CLUSTER_SPEC, read when TF_CONFIG names no
cluster) it trains and evaluates in this one process. Usage errors
(bad flags, TF_CONFIG or data paths) exit with code 2; bad data found while
training (a corrupt, truncated or mistyped record) exits with code 3: do not
retry, fix the data or skip bad records.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import flags

from estimator_dist.config.train_flags import PROGRAM, define_flags, job_from_flags
from estimator_dist.hardware.cpus import configure_onednn
from estimator_dist.report import console, status
from estimator_dist.report.cli import run_program, usage_exit


def main(argv: Sequence[str]) -> int:
    """Entry point: flags and TF_CONFIG in, one library call, metrics out."""
    console.start_task(flags.FLAGS.verbose)  # Before TensorFlow is imported.
    if len(argv) > 1:
        usage_exit(
            PROGRAM, f"unexpected positional arguments {list(argv[1:])}; every setting is a --flag."
        )
    from estimator_dist.base.errors import Error, UsageError
    from estimator_dist.cluster.platform_env import cluster_from_environment

    try:
        cluster = cluster_from_environment(os.environ)
        # TensorFlow reads it when imported, which building the job config does.
        configure_onednn(flags.FLAGS.onednn)
        job = job_from_flags(flags.FLAGS)
        from estimator_dist.base import files
        from estimator_dist.task import driver

        metrics = driver.train_and_evaluate(job, cluster)
    except UsageError as error:
        usage_exit(PROGRAM, str(error))
    except Error as error:
        from estimator_dist.guards.watchdog import fail

        fail(cluster.role, error.exit_code, str(error), type(error).__name__)
    if metrics is not None:
        print(f"Final evaluation: {files.format_metrics(metrics)}", flush=True)
    status.emit(status.Exiting(exit_code=0))
    return 0


def run() -> None:
    """Console-script entry point."""
    define_flags()
    run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
