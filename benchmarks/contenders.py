"""What is measured: one training configuration, run in fresh processes, in examples/s.

A `Config` names the contender and everything that decides its speed; `measure`
runs it once, each worker in its own process pinned to one core of its own
where cores allow (`one_core_each`), and returns global examples
per second (all workers together), timed between two step counts at the
chief after a warm-up, never including start-up.

Contenders:

* `package`: `python -m estimator_dist.train` on every task, with the
  package's defaults unless `flags` says otherwise;
* `handwritten`: `benchmarks.handwritten`, the tutorial's Estimator script
  with the same model_fn, data, batch and session settings;
* `keras`: `benchmarks.keras_fit`, Keras `model.fit` under the same strategy
  (`flags` may set its `steps_per_execution`);
* `horovod`: `benchmarks.horovod_estimator`, the same Estimator training with
  Horovod's `DistributedOptimizer` over Gloo instead of a strategy;
* `independent`: `workers` separate one-worker package jobs at once, each on
  its own core, that never talk: the sum of their speeds is what the cores
  can give with no synchronisation at all, the ceiling of any scaling.

Every contender reads 1024 random images held in memory, so input costs
nothing, and runs with the same oneDNN setting and thread pools.

>>> Config("package", workers=2).global_batch
128
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Dict, List, Sequence, Tuple

from benchmarks import NEVER_STEPS, common
from estimator_dist.hardware.cpus import allowed_cores, split_cores

CONTENDERS = ("package", "handwritten", "keras", "horovod", "independent")
MODELS = {"mnist_cnn": "28x28x1", "resnet_cifar": "32x32x3", "mobilenet_v2": "96x96x3"}
#: Steps per run, and steps skipped before timing, per model (about 8-10 s timed).
STEPS = {"mnist_cnn": (1000, 200), "resnet_cifar": (80, 20), "mobilenet_v2": (100, 20)}
#: Models the package alone trains here: MobileNetV2 as `--keras_model`, at the
#: width and classes of the *speedup* section (`benchmarks.speedup`).
PACKAGE_ONLY = {"mobilenet_v2": ("--keras_model=mobilenet_v2", "num_classes=2,alpha=0.35")}
#: Speed summaries (global_step/sec) written over the timed steps.
SUMMARIES = 10


@dataclasses.dataclass(frozen=True)
class Config:
    """One measured configuration.

    Attributes:
      contender: One of `CONTENDERS`.
      model: One of `MODELS`.
      workers: Training processes.
      per_worker_batch: Examples per worker per step (per micro-batch with
        gradient accumulation).
      communication: RING or AUTO.
      flags: Extra `estimator_dist.train` flags (package only), as
        `(name, value)` pairs, such as `(("gradient_wire_dtype", "bfloat16"),)`.
      pin: Pin each worker to its own share of the cores.
      onednn: `TF_ENABLE_ONEDNN_OPTS` for every process.
      steps_factor: Multiplies the default number of steps (accumulation
        runs count updates, which hold several micro-batches).
    """

    contender: str = "package"
    model: str = "mnist_cnn"
    workers: int = 1
    per_worker_batch: int = 64
    communication: str = "RING"
    flags: Tuple[Tuple[str, str], ...] = ()
    pin: bool = True
    onednn: bool = True
    steps_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.contender not in CONTENDERS:
            raise ValueError(f"contender must be one of {CONTENDERS}, received {self.contender!r}.")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {tuple(MODELS)}, received {self.model!r}.")
        if self.model in PACKAGE_ONLY and self.contender not in ("package", "independent"):
            raise ValueError(f"{self.model} is trained by the package only, not {self.contender}.")

    @property
    def global_batch(self) -> int:
        """Examples of one step over all workers."""
        return self.per_worker_batch * self.workers

    @property
    def accumulation(self) -> int:
        """Micro-batches per update (`--gradient_accumulation_steps`)."""
        return int(dict(self.flags).get("gradient_accumulation_steps", 1))

    def steps(self) -> Tuple[int, int]:
        """(Steps to run, steps to skip before timing)."""
        total, warmup = STEPS[self.model]
        factor = self.steps_factor / self.accumulation
        return max(20, int(total * factor)), max(5, int(warmup * factor))

    def label(self) -> str:
        """A short unique name, for tables and logs."""
        parts = [self.contender, self.model, f"{self.workers}w", f"b{self.per_worker_batch}"]
        parts += [self.communication] + [f"{name}={value}" for name, value in self.flags]
        parts += [] if self.pin else ["unpinned"]
        parts += [] if self.onednn else ["no-onednn"]
        return " ".join(parts)


def one_core_each(workers: int) -> List[frozenset]:
    """One core per worker, round-robin when workers outnumber cores.

    Unlike the launcher, which divides all cores among its tasks, a benchmark
    gives one worker one core whatever the count, so that N workers get N
    times the hardware of one.
    """
    return split_cores(workers, allowed_cores()[:workers])


def _env(config: Config) -> Dict[str, str]:
    return {"TF_ENABLE_ONEDNN_OPTS": "1" if config.onednn else "0"}


def _read_result(path: str, config: Config) -> float:
    with open(path, encoding="utf-8") as stream:
        result = json.load(stream)
    if result["onednn"] != config.onednn:
        raise common.BenchmarkError(
            f"{config.label()} ran with oneDNN {result['onednn']}, expected {config.onednn}."
        )
    return float(result["examples_per_second"])


def horovod_command(workers: int, python: str, args: Sequence[str]) -> List[str]:
    """Runs `benchmarks.horovod_estimator` on `workers` local ranks with `python`'s horovodrun.

    horovodrun starts the ranks with Gloo over loopback; each rank pins its threads to
    its own core.
    """
    horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
    module = "benchmarks.horovod_estimator"
    hosts = f"localhost:{workers}"
    return [horovodrun, "--gloo", "-np", str(workers), "-H", hosts, python, "-m", module, *args]


def _log_steps(steps: int, warmup: int) -> int:
    return max(1, (steps - warmup) // SUMMARIES)


def package_args(config: Config, model_dir: str, steps: int, warmup: int) -> List[str]:
    """`estimator_dist.train` flags that run `config` on one task of its cluster."""
    model, params = PACKAGE_ONLY.get(config.model, (f"--model_fn={config.model}", ""))
    extra = f",{params}" if params else ""
    return [
        f"--model_dir={model_dir}",
        model,
        "--input_fn=synthetic",
        f"--params=image_shape={MODELS[config.model]},num_examples=1024{extra}",
        f"--batch_size={config.global_batch}",
        f"--train_steps={steps}",
        f"--log_step_count_steps={_log_steps(steps, warmup)}",
        f"--save_checkpoints_steps={NEVER_STEPS}",
        f"--save_summary_steps={NEVER_STEPS}",
        "--export=",
        "--eval_steps=1",
        f"--communication={config.communication}",
        *[f"--{name}={value}" for name, value in config.flags],
    ]


def measure(config: Config, horovod_python: str = "", timeout: float = 900) -> float:
    """Runs `config` once; returns global examples per second.

    Its checkpoints and logs live in a temporary directory, removed afterwards
    (a failure's message carries the logs' tails).

    Raises:
      BenchmarkError: if a process fails or the time runs out.
    """
    with tempfile.TemporaryDirectory(prefix="bench-") as directory:
        return _measure_in(directory, config, horovod_python, timeout)


def _measure_in(directory: str, config: Config, horovod_python: str, timeout: float) -> float:
    model_dir = os.path.join(directory, "model")
    steps, warmup = config.steps()
    cores = one_core_each(config.workers) if config.pin else [None] * config.workers
    result = os.path.join(directory, "result.json")
    common_args = [f"--per_worker_batch={config.per_worker_batch}", f"--model={config.model}"]
    if config.contender == "horovod":
        args = [*common_args, f"--steps={steps}", f"--warmup_steps={warmup}", f"--result={result}"]
        command = horovod_command(config.workers, horovod_python, args)
        common.run_tasks([command], [_env(config)], [None], directory, timeout)
        return _read_result(result, config)
    if config.contender == "independent":
        alone = dataclasses.replace(config, contender="package", workers=1)
        model_dirs = [os.path.join(directory, f"model-{i}") for i in range(config.workers)]
        commands = [
            common.python_module("estimator_dist.train", *package_args(alone, d, steps, warmup))
            for d in model_dirs
        ]
        common.run_tasks(commands, [_env(config)] * config.workers, cores, directory, timeout)
        examples = config.per_worker_batch * config.accumulation
        return sum(common.step_rate(d, warmup) * examples for d in model_dirs)
    configs = common.tf_configs(config.workers)
    envs = [{**_env(config), "TF_CONFIG": tf_config} for tf_config in configs]
    if config.contender == "keras":
        args = [
            *common_args,
            f"--communication={config.communication}",
            f"--steps={steps}",
            f"--warmup_steps={warmup}",
            f"--result={result}",
            *[f"--{name}={value}" for name, value in config.flags],
        ]
        commands = [common.python_module("benchmarks.keras_fit", *args)] * config.workers
        common.run_tasks(commands, envs, cores, directory, timeout)
        return _read_result(result, config)
    if config.contender == "handwritten":
        args = [
            *common_args,
            f"--model_dir={model_dir}",
            f"--steps={steps}",
            f"--log_step_count_steps={_log_steps(steps, warmup)}",
            f"--communication={config.communication}",
            *[f"--{name}={value}" for name, value in config.flags],
        ]
        commands = [common.python_module("benchmarks.handwritten", *args)] * config.workers
    else:
        args = package_args(config, model_dir, steps, warmup)
        commands = [common.python_module("estimator_dist.train", *args)] * config.workers
    common.run_tasks(commands, envs, cores, directory, timeout)
    updates_per_second = common.step_rate(model_dir, warmup)
    return updates_per_second * config.global_batch * config.accumulation
