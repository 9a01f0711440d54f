"""Start a local multi-worker cluster on this machine and supervise it.

  python -m estimator_dist.launch --num_workers=2 --evaluator -- \\
      --model_dir=/tmp/run1 --train_steps=500 --communication=RING

Everything after `--` is passed to `estimator_dist.train` on every task; it
is validated once here first, so a bad flag fails before any process starts.
The launcher picks free loopback ports, starts one process per task with its
own TF_CONFIG, prefixes every output line with the task (`[worker-0]`) and
also writes it to `model_dir/logs/<task>.log`. If any task fails, it stops
all of them and exits non-zero; otherwise it waits for the evaluator's final
evaluation and prints the final metrics. Ctrl-C stops every task.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, List, Optional, Sequence

import portpicker
from absl import app, flags

from estimator_dist import train
from estimator_dist.cluster import EVALUATOR, PS, ClusterConfig, make_local_cluster
from estimator_dist.errors import UsageError

PROGRAM = "estimator_dist.launch"

_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 2, "Training tasks, the chief included.", lower_bound=1
)
_NUM_PS = flags.DEFINE_integer(
    "num_ps",
    0,
    "Parameter server tasks (with --distribution_strategy=parameter_server).",
    lower_bound=0,
)
_EVALUATOR = flags.DEFINE_boolean(
    "evaluator",
    True,
    "Run an evaluator task, which evaluates each checkpoint and writes the final metrics.",
)
_HOST = flags.DEFINE_string("host", "localhost", "Address the tasks use to reach each other.")
_TIMEOUT = flags.DEFINE_float(
    "timeout_secs",
    0,
    "Stop the job and fail after this many seconds; 0 means no limit.",
    lower_bound=0,
)
_GRACE = flags.DEFINE_float(
    "grace_secs", 10, "Seconds between SIGTERM and SIGKILL when stopping tasks.", lower_bound=0
)


class JobFailed(Exception):
    """A task failed, or the job ran out of time; the message says which."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass
class Task:
    """One running task: its configuration, process and log file."""

    config: ClusterConfig
    process: subprocess.Popen
    log: IO[str]

    @property
    def name(self) -> str:
        config = self.config
        return config.task_type if config.task_type in ("chief", EVALUATOR) else config.role


class Launcher:
    """Starts the tasks of a local cluster and supervises them until the job ends.

    Tasks stay in the launcher's process group, so Ctrl-C in a terminal, or a
    signal to the group, reaches every one of them too.

    Args:
      train_args: Flags for `estimator_dist.train`, the same on every task.
      model_dir: The job's model_dir, where `logs/` goes.
      out: Where prefixed task output is printed.
    """

    def __init__(
        self, train_args: Sequence[str], model_dir: str, out: IO[str] = sys.stdout
    ) -> None:
        self._train_args = list(train_args)
        self._model_dir = model_dir
        self._out = out
        self._print_lock = threading.Lock()
        self._exits: queue.Queue[tuple] = queue.Queue()
        self.tasks: List[Task] = []

    def say(self, message: str) -> None:
        """Prints a launcher line."""
        with self._print_lock:
            self._out.write(f"[launcher] {message}\n")
            self._out.flush()

    def start(self, configs: Sequence[ClusterConfig]) -> None:
        """Starts one process per task configuration."""
        log_dir = os.path.join(self._model_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        for config in configs:
            env = dict(os.environ, TF_CONFIG=config.to_json(), PYTHONUNBUFFERED="1")
            process = subprocess.Popen(
                [sys.executable, "-m", "estimator_dist.train", *self._train_args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            log = open(os.path.join(log_dir, f"{config.role}.log"), "w")
            task = Task(config, process, log)
            self.tasks.append(task)
            threading.Thread(target=self._pump, args=(task,), daemon=True).start()
            self.say(f"started {task.name} (pid {process.pid}) TF_CONFIG={config.to_json()}")

    def _pump(self, task: Task) -> None:
        prefix = f"[{task.name}] "
        for line in task.process.stdout:
            task.log.write(line)
            with self._print_lock:
                self._out.write(prefix + line)
                self._out.flush()
        task.log.close()
        self._exits.put((task, task.process.wait()))

    def supervise(self, deadline: Optional[float]) -> None:
        """Waits until training and evaluation end; parameter servers are then stopped.

        Raises:
          JobFailed: when a task exits non-zero or the deadline passes.
        """
        pending = {id(t) for t in self.tasks if t.config.task_type != PS}
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                task, code = self._exits.get(timeout=timeout)
            except queue.Empty:
                waiting = ", ".join(t.name for t in self.tasks if id(t) in pending)
                raise JobFailed(f"timed out (--timeout_secs) waiting for {waiting}") from None
            if code != 0:
                raise JobFailed(
                    f"{task.name} exited with code {code}; see its log "
                    f"{os.path.join(self._model_dir, 'logs', task.config.role + '.log')}",
                    exit_code=code if 0 < code < 128 else 1,
                )
            if task.config.task_type == PS:
                raise JobFailed(f"{task.name} exited before training ended")
            pending.discard(id(task))
            self.say(f"{task.name} finished")

    def stop(self, grace_secs: float) -> None:
        """Stops every task still running: SIGTERM, then SIGKILL after `grace_secs`."""
        running = [t for t in self.tasks if t.process.poll() is None]
        for task in running:
            task.process.terminate()
        end = time.monotonic() + grace_secs
        for task in running:
            try:
                task.process.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                task.process.kill()
                task.process.wait()


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str]) -> int:
    """Validates the training flags, runs the cluster, prints the final metrics."""
    from estimator_dist import driver

    train_args = list(argv[1:])
    train_flags = flags.FlagValues()
    train.define_flags(train_flags)
    if not any(arg.startswith("--model_dir") for arg in train_args):
        train_args.append(f"--model_dir={tempfile.mkdtemp(prefix='estimator_dist-')}")
    try:
        train_flags([train.PROGRAM, *train_args], known_only=True)
        job = train.job_from_flags(train_flags)
        if job.batch_size % _NUM_WORKERS.value:
            raise UsageError(
                f"--batch_size={job.batch_size} is the global batch and must divide evenly "
                f"over --num_workers={_NUM_WORKERS.value} workers."
            )
        driver.preflight(job)
    except flags.Error as error:
        train.usage_exit(PROGRAM, f"training flag after '--': {error}")
    except UsageError as error:
        train.usage_exit(PROGRAM, str(error))

    model_dir = job.run.model_dir
    ports = [portpicker.pick_unused_port() for _ in range(_NUM_WORKERS.value + _NUM_PS.value)]
    cluster = make_local_cluster(
        _NUM_WORKERS.value,
        ports,
        num_ps=_NUM_PS.value,
        evaluator=_EVALUATOR.value,
        host=_HOST.value,
    )
    launcher = Launcher(train_args, model_dir)
    launcher.say(
        f"local cluster: {_NUM_WORKERS.value} worker(s), {_NUM_PS.value} ps, evaluator: "
        f"{_EVALUATOR.value}; model_dir {model_dir}"
    )
    deadline = time.monotonic() + _TIMEOUT.value if _TIMEOUT.value else None
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    started = time.monotonic()
    try:
        launcher.start(cluster.tasks)
        launcher.supervise(deadline)
    except JobFailed as failure:
        launcher.say(f"job failed: {failure}; stopping every task")
        launcher.stop(_GRACE.value)
        return failure.exit_code
    except KeyboardInterrupt:
        launcher.say("interrupted; stopping every task")
        launcher.stop(_GRACE.value)
        return 130
    launcher.stop(_GRACE.value)
    launcher.say(f"job finished in {time.monotonic() - started:.1f} s")
    metrics = driver.read_final_metrics(model_dir)
    if metrics is not None:
        launcher.say(f"final evaluation: {driver.format_metrics(metrics)}")
    elif _EVALUATOR.value:
        launcher.say(f"the evaluator wrote no final metrics to {model_dir}")
        return 1
    return 0


def run() -> None:
    """Console-script entry point."""
    app.run(main, flags_parser=train.make_flags_parser(PROGRAM))


if __name__ == "__main__":
    run()
