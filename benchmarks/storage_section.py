"""The suite's *storage* section: training with model_dir on S3 against a local model_dir.

One process trains `mnist_cnn` on the embedded digits at the default
checkpoint cadence (every 100 steps; the checkpoint's size is reported), alternately with a local
model_dir and with `--model_dir=s3://...` on moto's S3 server on loopback,
where the chief uploads each checkpoint from its own thread. The server
runs at nice 19, as a store elsewhere would take none of these two cores. The rate is
the chief's `global_step/sec` over the run (`common.step_rate`, the same
clock for both); the ratio is S3's over local's, round by round. Then the
time to resume from the bucket: a fresh process, with no local files,
downloading the latest checkpoint (`restored ... in X s`) and reaching its
first step.

  python -m benchmarks --sections=storage
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from typing import List

from benchmarks import common
from benchmarks.groups import summary

#: The storage section's target: S3 over local training rate, at the default checkpoint cadence.
TARGET = 0.97
_RESTORED = re.compile(r"restored (\S+) from \S+ into \S+ in ([\d.]+) s")
_FIRST_STEP = re.compile(r"ran its first step \(global step (\d+)\)")


def _train(model_dir: str, data_dir: str, steps: int, env: dict) -> str:
    """Runs one training process to the end; returns its output and log lines."""
    return subprocess.run(
        [
            *common.python_module("estimator_dist.train"),
            f"--model_dir={model_dir}",
            f"--data_dir={data_dir}",
            f"--train_steps={steps}",
            "--batch_size=64",
            "--log_step_count_steps=50",
            "--eval_throttle_secs=600",
            "--eval_steps=1",
        ],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # The package's lines (uploads, the restore) are absl's.
        text=True,
        timeout=1800,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
    ).stdout


def measure(rounds: int, steps: int = 10000) -> dict:
    """Rates with local and S3 model_dirs, their ratio, and the time to resume from S3."""
    from input_fns import prepare_input
    from tests.s3_server import S3Server

    local_rates: List[float] = []
    s3_rates: List[float] = []
    uploads: List[float] = []
    size = 0
    # The server runs at the lowest priority: on a real store it would use none of these cores.
    server = S3Server(prefix=("nice", "-n", "19"))
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as scratch, server:
        data_dir = os.path.join(scratch, "data")
        prepare_input("digits", {"data_dir": data_dir})
        for index in range(rounds):
            local = os.path.join(scratch, f"local-{index}")
            _train(local, data_dir, steps, {})
            local_rates.append(common.step_rate(local, 100))
            work = os.path.join(scratch, f"work-{index}")
            env = {**server.env, "ESTIMATOR_DIST_WORK_DIR": work}
            output = _train(f"s3://bucket/run-{index}", data_dir, steps, env)
            chief = os.path.join(work, "s3", "bucket", f"run-{index}", "local")
            s3_rates.append(common.step_rate(chief, 100))
            size = sum(
                os.path.getsize(os.path.join(chief, name))
                for name in os.listdir(chief)
                if name.startswith(f"model.ckpt-{steps}.")
            )
            uploads += [float(s) for s in re.findall(r"uploaded \S+ to \S+ in ([\d.]+) s", output)]
        env = {**server.env, "ESTIMATOR_DIST_WORK_DIR": os.path.join(scratch, "resume")}
        started = time.monotonic()
        output = _train("s3://bucket/run-0", data_dir, steps + 100, env)
        wall = time.monotonic() - started
    restored = _RESTORED.search(output)
    first = _FIRST_STEP.search(output)
    return {
        "steps": steps,
        "local": summary(local_rates),
        "s3": summary(s3_rates),
        "ratio": summary([s / r for s, r in zip(s3_rates, local_rates)]),
        "upload_secs": summary(uploads) if uploads else None,
        "checkpoint_bytes": size,
        "resume": {
            "checkpoint": restored.group(1) if restored else None,
            "download_secs": float(restored.group(2)) if restored else None,
            "first_step": int(first.group(1)) if first else None,
            "wall_secs": wall,
        },
        "target": TARGET,
    }


def table(results: dict) -> List[str]:
    """The section's lines in the report."""
    resume = results["resume"]
    ratios = ", ".join(f"{r:.3f}" for r in results["ratio"]["samples"])
    return [
        f"mnist_cnn, one process, {results['steps']} steps, a checkpoint every 100 steps "
        f"({results['checkpoint_bytes'] / 2**20:.1f} MiB each):",
        "",
        "| model_dir | steps/s (median) |",
        "|---|---|",
        f"| local | {results['local']['median']:.2f} |",
        f"| s3:// (moto on loopback) | {results['s3']['median']:.2f} |",
        "",
        f"S3 / local: {results['ratio']['median']:.3f} (rounds: {ratios}; target >= "
        f"{results['target']}). Resume from the bucket: {resume['checkpoint']} downloaded in "
        f"{resume['download_secs']} s, first step {resume['first_step']}, the whole run "
        f"{resume['wall_secs']:.1f} s.",
    ]
