"""Run entry points as real subprocesses, always bounded, never left behind.

Each command runs in a new session; on timeout its whole process group is
killed. A failed run raises with the command's output and every task log
found under `model_dir/logs`, so a red test shows what each worker said.

Every failure message states its cause on its first line, then only the last
`TAIL_LINES` lines of each task (`report`): a CI log cut short, or pytest's
one-line summary, still says why the test failed.

The end-to-end set-ups the tests share are here too: a cluster of tasks on free
loopback ports started by hand (`local_cluster`, `tasks`), waiting for a
training step or a checkpoint instead of sleeping (`wait_for_step`,
`wait_for_checkpoint`), the pids a launcher started and whether they still run
(`started_pids`, `alive`), and what the checkpoints hold (`checkpoint_step`,
`read_every_checkpoint`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Union

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Lines of each task's output that a failure message shows: the last ones, where the cause is.
TAIL_LINES = 60
#: A launcher's line of a task's output: `[chief] ...`, `[worker-0] ...`, `[launcher] ...`.
_TASK_LINE = re.compile(r"^\[([a-z]+(?:-\d+)?)\] ")
#: A task's own log line of a training step (`loss = ..., step = N`), group 1 the step.
TASK_STEP_LINE = r"^I.*\] loss = .*step = (\d+)"
#: The same line of the chief as a launcher shows it.
CHIEF_STEP_LINE = r"^\[chief\] .*\] loss = .*step = (\d+)"


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `text`, after a line counting the ones left out."""
    kept = text.splitlines()
    if len(kept) <= lines:
        return "\n".join(kept)
    return "\n".join([f"[... {len(kept) - lines} earlier lines left out ...]", *kept[-lines:]])


def by_task(output: str) -> dict:
    """Groups a launcher's output by its `[task] ` prefixes; other lines go under `output`.

    >>> by_task("[chief] a\\nexited with 9\\n[worker-0] b\\n[chief] c\\n")
    {'chief': 'a\\nc', 'output': 'exited with 9', 'worker-0': 'b'}
    """
    groups: dict = {}
    for line in output.splitlines():
        match = _TASK_LINE.match(line)
        name, text = (match.group(1), line[match.end() :]) if match else ("output", line)
        groups.setdefault(name, []).append(text)
    return {name: "\n".join(lines) for name, lines in sorted(groups.items())}


def report(cause: str, output: Union[str, Mapping[str, Any]] = "", lines: int = TAIL_LINES) -> str:
    """A failure message: `cause` on the first line, then the end of what each task printed.

    Args:
      cause: What was expected and what happened, e.g. "chief-0 exited 1, expected 150".
      output: One process's output (a launcher's is split by task prefix), or task
        name to output (a string or anything with an `output` attribute, such as
        `Background`).
      lines: How many of each task's last lines to show.
    """
    if isinstance(output, str):
        groups = by_task(output) if output else {}
    else:
        groups = {name: getattr(o, "output", o) for name, o in output.items()}
    parts = [cause]
    for name, text in groups.items():
        parts.append(f"----- {name}: last lines -----\n{tail(text, lines)}")
    return "\n".join(parts)


def measured(name: str, **fields: object) -> str:
    """Prints one `MEASURED name key=value ...` line, a figure a closing note quotes; returns it.

    Values must hold no spaces, so that the line splits on them.

    >>> _ = measured("sigkill", tasks=3, last_exit_secs="0.41")
    MEASURED sigkill tasks=3 last_exit_secs=0.41
    """
    line = " ".join([f"MEASURED {name}", *(f"{key}={value}" for key, value in fields.items())])
    print(line, flush=True)
    return line


def measured_exits(name: str, engine: str, pids: Sequence[int], ended: Dict[int, float]) -> str:
    """Prints the MEASURED line of tasks ending after a kill: how many ended, and when.

    Args:
      name: The figure's name.
      engine: Which launcher engine started the tasks.
      pids: Every task's pid.
      ended: Seconds from the kill to each ended task's exit, by pid.
    """
    return measured(
        name,
        engine=engine,
        tasks=f"{len(ended)}/{len(pids)}",
        exit_secs=",".join(f"{secs:.2f}" for secs in sorted(ended.values())),
        last_exit_secs=f"{max(ended.values(), default=float('nan')):.2f}",
    )


@dataclasses.dataclass
class Run:
    """A finished command."""

    args: Sequence[str]
    returncode: int
    output: str
    model_dir: Optional[str]

    def logs(self) -> str:
        """Returns the task logs the launcher wrote, each under a header."""
        return "\n".join(f"===== {name} =====\n{text}" for name, text in self._logs().items())

    def _logs(self) -> dict:
        if not self.model_dir:
            return {}
        logs = {}
        for path in sorted(glob.glob(os.path.join(self.model_dir, "logs", "*.log"))):
            with open(path, errors="replace") as stream:
                logs[os.path.basename(path)] = stream.read()
        return logs

    def describe(self) -> str:
        """The exit code and command first, then the end of the output and of each task log."""
        return report(
            f"exited {self.returncode}: {' '.join(self.args)}",
            {"output": self.output, **self._logs()},
        )

    def json(self, name: str) -> dict:
        with open(os.path.join(self.model_dir, name)) as stream:
            return json.load(stream)


def start_module(
    module: str, args: Sequence[str], env: Optional[dict] = None, prefix: Sequence[str] = ()
) -> subprocess.Popen:
    """Starts `python -m module args...` from the repository root in a new session.

    TF_CONFIG is removed from the environment unless `env` gives it; `prefix`
    runs the command under another one, such as `ip netns exec NAME`.
    """
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    environ.update({"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"})
    environ.update(env or {})
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", module, *args],
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # A shell starts background jobs with SIGINT ignored, and children inherit
        # that; the tasks under test get SIGINT's default, as from a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def run_module(
    module: str,
    args: Sequence[str],
    timeout: float,
    env: Optional[dict] = None,
    model_dir: Optional[str] = None,
    check: bool = True,
) -> Run:
    """Runs `python -m module args...` in its own process group.

    Args:
      module: e.g. `estimator_dist.launch`.
      args: Command-line arguments.
      timeout: Seconds before the whole process group is killed.
      env: Extra environment variables; TF_CONFIG is removed unless given.
      model_dir: Where to look for task logs when reporting a failure.
      check: Raise AssertionError with all logs unless the exit code is 0.

    Returns:
      The finished `Run`.
    """
    process = start_module(module, args, env)
    command = process.args
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        run = Run(command, process.returncode, output, model_dir)
        raise AssertionError(f"timed out after {timeout} s and killed; {run.describe()}") from None
    finally:
        _kill_group(process.pid)
    run = Run(command, process.returncode, output, model_dir)
    if check and run.returncode != 0:
        raise AssertionError(run.describe())
    return run


def run_modules(
    commands: Sequence[tuple], timeout: float, start_after: Optional[Callable[[], bool]] = None
) -> list:
    """Runs several `(module, args, model_dir)` commands at once; fails if any fails.

    Each command gets `timeout` and its own process group. With
    `start_after`, the first command starts alone and the others once the
    condition holds (checked every 0.2 s, failing if the first command ends
    or `timeout` passes first). When any run fails, the error shows every
    run's output and task logs.
    """
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:

        def submit(module: str, args: Sequence[str], model_dir: Optional[str]) -> Any:
            return pool.submit(run_module, module, args, timeout, model_dir=model_dir, check=False)

        futures = [submit(*commands[0])]
        if start_after is not None:
            deadline = time.monotonic() + timeout
            while not start_after():
                if futures[0].done() or time.monotonic() > deadline:
                    run = futures[0].result()
                    raise AssertionError(f"the condition to go on never held; {run.describe()}")
                time.sleep(0.2)
        futures += [submit(*command) for command in commands[1:]]
        runs = [future.result() for future in futures]
    failed = [run for run in runs if run.returncode != 0]
    if failed:
        codes = ", ".join(str(run.returncode) for run in runs)
        raise AssertionError(
            f"{len(failed)} of {len(runs)} commands failed (exit codes {codes}); "
            + "\n\n".join(run.describe() for run in runs)
        )
    return runs


def _kill_group(pgid: int) -> None:
    """Kills whatever is left of the group: nothing, unless something leaked."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Background:
    """A module run in the background in its own process group, read line by line.

    Use as a context manager: on exit the whole group is killed, whatever
    happened, and the output so far is kept in `lines`.
    """

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        env: Optional[dict] = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.lines: list = []
        self._queue: queue.Queue[Optional[str]] = queue.Queue()
        self.process = start_module(module, args, env, prefix)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """Returns the first match of `pattern` in a new output line; fails at timeout or EOF."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise AssertionError(
                    report(f"no line matching {pattern!r} in {timeout} s", self.output)
                ) from None
            if line is None:
                try:
                    state = f"exit code {self.process.wait(timeout=5)}"
                except subprocess.TimeoutExpired:
                    state = "still running"
                raise AssertionError(
                    report(
                        f"output ended ({state}) before a line matching {pattern!r}", self.output
                    )
                )
            self.lines.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def wait(self, timeout: float) -> int:
        """Waits for the process to exit and drains its output; returns the exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(report(f"still running after {timeout} s", self.output)) from None
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self) -> str:
        """Everything read so far."""
        return "".join(self.lines)

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc_info: object) -> None:
        _kill_group(self.process.pid)
        self.process.wait()


# --- clusters of tasks started by hand ------------------------------------------


def free_ports(count: int) -> list:
    """`count` loopback ports that nobody listens on now."""
    import portpicker

    return [portpicker.pick_unused_port() for _ in range(count)]


def local_cluster(num_workers: int, num_ps: int = 0, evaluator: bool = False) -> Any:
    """A chief + workers (+ ps, + evaluator) `LocalCluster` on free loopback ports."""
    from estimator_dist.cluster.tf_config import make_local_cluster

    ports = free_ports(num_workers + num_ps)
    return make_local_cluster(num_workers, ports=ports, num_ps=num_ps, evaluator=evaluator)


def local_tf_configs(num_workers: int) -> dict:
    """TF_CONFIG of each task of a chief + workers cluster on free loopback ports, by role."""
    return local_cluster(num_workers).tf_configs()


@contextlib.contextmanager
def tasks(
    environments: Mapping[str, Union[str, Mapping[str, str]]],
    args: Sequence[str],
    prefixes: Optional[Mapping[str, Sequence[str]]] = None,
    module: str = "estimator_dist.train",
) -> Iterator[Dict[str, Background]]:
    """Starts one `python -m module args...` per task; kills every process group on exit.

    Args:
      environments: Task name to its TF_CONFIG, or to its extra environment variables.
      args: The command line of every task.
      prefixes: Task name to a command to run it under (`ip netns exec NAME`).
      module: The entry point.

    Yields:
      Task name to its `Background`, in the order of `environments`.
    """
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(
                Background(
                    module,
                    args,
                    env={"TF_CONFIG": env} if isinstance(env, str) else dict(env),
                    prefix=(prefixes or {}).get(name, ()),
                )
            )
            for name, env in environments.items()
        }


def all_output(processes: Mapping[str, Background]) -> str:
    """Every task's output so far, each under a header."""
    return "\n".join(f"===== {name} =====\n{p.output}" for name, p in processes.items())


def wait_all(processes: Mapping[str, Background], names: Sequence[str], timeout: float) -> dict:
    """Waits for the tasks `names` to exit; returns their exit codes, by name."""
    return {name: processes[name].wait(timeout=timeout) for name in names}


def wait_for_step(
    process: Background, step: int, timeout: float, pattern: str = TASK_STEP_LINE
) -> int:
    """Waits for a training log line of step N >= `step` (group 1 of `pattern`); returns N."""
    deadline = time.monotonic() + timeout
    while True:
        found = int(process.wait_for_line(pattern, deadline - time.monotonic()).group(1))
        if found >= step:
            return found


def wait_for_log_line(path: Union[str, os.PathLike], pattern: str, timeout: float) -> str:
    """Waits for a line matching `pattern` in a task's log file (`model_dir/logs/<task>.log`).

    For what the launcher keeps off its console, such as a worker's progress lines.
    """
    deadline = time.monotonic() + timeout
    while True:
        if os.path.exists(path):
            with open(path) as stream:
                for line in stream:
                    if re.search(pattern, line):
                        return line
        assert time.monotonic() < deadline, f"no line matching {pattern!r} in {path} in {timeout} s"
        time.sleep(0.1)


# --- what a launcher started, and what is left --------------------------------------


def started_pids(output: str, name: str = r"\S+") -> list:
    """The pids of the tasks a launcher said it started (`started NAME (pid N)`), in order."""
    return [int(pid) for pid in re.findall(rf"started {name} \(pid (\d+)\)", output)]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, which nobody here may reap, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- checkpoints ------------------------------------------------------------------


def checkpoint_step(model_dir: str) -> int:
    """The global step of the latest checkpoint in `model_dir`, read from the checkpoint."""
    import tensorflow as tf

    return int(tf.train.load_checkpoint(str(model_dir)).get_tensor("global_step"))


def wait_for_checkpoint(directory: str, step: int, timeout: float) -> str:
    """Waits for a whole checkpoint of `step` or later in `directory`; returns its path.

    Saver lists a checkpoint before it writes its .meta file, which comes last.
    """
    import tensorflow as tf

    deadline = time.monotonic() + timeout
    while True:
        latest = tf.train.latest_checkpoint(directory)
        if latest and int(latest.rsplit("-", 1)[1]) >= step and os.path.exists(f"{latest}.meta"):
            return latest
        assert time.monotonic() < deadline, f"no checkpoint of step {step} in {timeout} s"
        time.sleep(0.05)


def read_every_checkpoint(directory: str) -> list:
    """Reads every tensor of every checkpoint the checkpoint list names; returns their steps."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(directory)
    steps = []
    for listed in state.all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(os.path.join(directory, os.path.basename(listed)))
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        steps.append(int(reader.get_tensor("global_step")))
    return steps
