"""Start a local multi-worker cluster on this machine, supervise it, restart it.

  python -m estimator_dist.launch --num_workers=2 --evaluator -- \\
      --model_dir=/tmp/run1 --train_steps=500 --communication=RING

Everything after `--` is passed to `estimator_dist.train` on every task; it
is validated once here first, so a bad flag fails before any process starts.

With `--script`, every task runs a whole legacy training script instead, one
that builds its own Estimator and calls `tf.estimator.train_and_evaluate`
(see docs/scripts.md); everything after `--` is then the script's own
arguments:

  python -m estimator_dist.launch --num_workers=2 --evaluator --script=train.py \\
      --communication=RING -- --model_dir=/tmp/run1 --max_steps=500

Each task runs `python -m estimator_dist.script` on it, which gives the
estimator the strategy its role needs. The launcher's `--model_dir` is the
directory the script's estimator writes to (where `logs/` goes and the
checkpoint step is read); by default it is the value of the script's own
`--model_dir` (or `--model-dir`, `--job-dir`) argument, and every task fails
at once (exit 2) if its estimator writes elsewhere. The last step is the
`max_steps` of the script's TrainSpec, which each task prints.

The launcher runs the cluster inside a private network namespace when the
system allows it (no port reachable from outside), picks free loopback
ports, starts one process per task with its own TF_CONFIG, prefixes every
output line with the task (`[worker-0]`) and appends it to
`model_dir/logs/<task>.log`.

When any task ends before the job is done, with any exit code, even 0, it
stops every task (SIGTERM, then SIGKILL after --grace_secs). The cause it
reports is that task's, except that a task which only lost a peer (exit
150) makes it wait up to `ROOT_CAUSE_SECS` for the exit of the peer. For a
retryable cause (a signal, or an exit code of 128 or more, see
`estimator_dist.exit_codes`) it restarts the whole cluster, which resumes from
the latest checkpoint in the shared model_dir, up to --max_restarts times with
exponential backoff. It gives up at once when the same cause (pids, ports,
timings and steps aside) ends two attempts at the same checkpoint step: a
restart would fail the same way. A training task that exits 0 before the last
step ran out of input (exit 6, not retried). On success it removes the
workers' `tmp_worker_*` directories and prints the final metrics and each
restart with its cause. Ctrl-C stops every task.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Callable, List, Optional, Sequence, Set, Tuple

import portpicker
from absl import app, flags

from estimator_dist import exit_codes, netns, pitfalls, train
from estimator_dist import script as script_lib
from estimator_dist.cluster import CHIEF, EVALUATOR, PS, WORKER, ClusterConfig, make_local_cluster
from estimator_dist.cpus import split_cores
from estimator_dist.errors import Error, UsageError

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
_NETWORK_ISOLATION = flags.DEFINE_boolean(
    "network_isolation",
    True,
    "Run the cluster in a private network namespace, so that no task port is reachable "
    "from outside; if the system refuses, warn and run in the host's network. Turn off "
    "when the tasks must reach the network (remote data or model_dir).",
)
_MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts",
    3,
    "Whole-cluster restarts from the latest checkpoint after a retryable failure.",
    lower_bound=0,
)
_FINISH_TIMEOUT = flags.DEFINE_float(
    "finish_timeout_secs",
    300,
    "After the first training task finishes, seconds the others (and the evaluator's "
    "final evaluation) may take before the job fails.",
    lower_bound=1,
)
_TIMEOUT = flags.DEFINE_float(
    "timeout_secs",
    0,
    "Stop the job and fail after this many seconds; 0 means no limit.",
    lower_bound=0,
)
_GRACE = flags.DEFINE_float(
    "grace_secs", 10, "Seconds between SIGTERM and SIGKILL when stopping tasks.", lower_bound=0
)
_PIN_CORES = flags.DEFINE_boolean(
    "pin_cores",
    True,
    "Give each training task its own share of the cores this launcher may use (round-robin "
    "when tasks outnumber cores), so tasks do not fight over cores and TensorFlow sizes each "
    "task's thread pools to its share; the evaluator and ps tasks use every core. Run the "
    "launcher under `taskset -c ...` to give the job fewer cores.",
)

_SCRIPT = flags.DEFINE_string(
    "script",
    None,
    "A whole training script that builds its own Estimator and calls "
    "tf.estimator.train_and_evaluate; every task runs it (via estimator_dist.script) with "
    "the arguments after `--`, which are then the script's own. See docs/scripts.md.",
)
# The flags of estimator_dist.script, which the launcher passes on to every task.
script_lib.define_flags(flags.FLAGS)

#: First line of a launcher whose cluster runs in a private network namespace.
ISOLATED_MESSAGE = (
    "network: private network namespace; the job's ports cannot be reached from "
    "outside this launcher"
)
#: First line of a launcher whose cluster runs in the host's network.
EXPOSED_MESSAGE = (
    "WARNING: network: the host's network ({reason}); TensorFlow's gRPC servers "
    "listen on all interfaces without authentication while the job runs"
)


#: Seconds a task's lost-peer exit (150) waits for the exit of the peer it lost.
ROOT_CAUSE_SECS = 2.0
#: The one line a task prints when it fails on purpose; its cause joins the launcher's.
_FAILURE_LINE = re.compile(
    r"(?:estimator_dist: task \S+ failed \(exit \d+\)|estimator_dist\.\w+: error): (.*)"
)
#: The line a script task prints with the step training ends at.
_MAX_STEPS_LINE = re.compile(re.escape(script_lib.MAX_STEPS_MARKER) + r"(\d+)")
#: What `_cause_behind` appends when a lost-peer exit came before its cause.
_LOST_PEER = " ({reporter} exited first, with code 150, as it lost this peer)"
#: Parts of a cause that differ between two attempts failing the same way.
_VOLATILE = (
    (re.compile(re.escape(_LOST_PEER).replace(r"\{reporter\}", r"\S+")), ""),
    (re.compile(r"\bpid \d+"), "pid #"),
    (re.compile(r"(?<=[\w\]]):\d{2,5}\b"), ":#"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x#"),
    (re.compile(r"\bsteps? \d+"), "step #"),
    (re.compile(r"\b\d+(?:\.\d+)?(?= ?(?:ms|s|sec|secs|seconds|minutes)\b)"), "#"),
    (re.compile(r"\b\d+\.\d+\b"), "#"),
)


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why an attempt ended early.

    Attributes:
      cause: One line naming the task and what happened.
      exit_code: The code the launcher exits with if it gives up.
    """

    cause: str
    exit_code: int

    @property
    def retryable(self) -> bool:
        """Whether a restart of the whole cluster may succeed."""
        return exit_codes.is_retryable(self.exit_code)


def normalise_cause(cause: str) -> str:
    """The cause without what differs between two attempts that fail the same way.

    Pids, ports, durations, step numbers (the checkpoint step is compared on
    its own) and which task reported a lost peer first are replaced.

    >>> normalise_cause("chief exited with code 150 (PEER_FAILURE): AbortedError at "
    ...                 "global step 57 after 12.3 s (peer localhost:41234, pid 812)")[43:]
    'AbortedError at global step # after # s (peer localhost:#, pid #)'
    """
    for pattern, replacement in _VOLATILE:
        cause = pattern.sub(replacement, cause)
    return cause


class RestartPolicy:
    """Decides after each failed attempt whether the whole cluster is restarted.

    Args:
      max_restarts: Restarts allowed in all.

    >>> policy = RestartPolicy(max_restarts=3)
    >>> lost = Failure("worker-0 exited with code 150 (PEER_FAILURE)", 150)
    >>> policy.give_up(lost, step=100) is None
    True
    >>> print(policy.give_up(lost, step=100))  # doctest: +NORMALIZE_WHITESPACE
    the same failure (worker-0 exited with code 150 (PEER_FAILURE)) at checkpoint step 100 twice:
    not retrying
    """

    def __init__(self, max_restarts: int) -> None:
        self._max_restarts = max_restarts
        self._attempts = 0
        self._seen: Set[Tuple[str, int]] = set()

    def give_up(self, failure: Failure, step: int) -> Optional[str]:
        """Records a failed attempt; returns why not to restart, or None to restart.

        Args:
          failure: Why the attempt ended.
          step: The latest checkpoint's step once every task stopped.
        """
        self._attempts += 1
        key = (normalise_cause(failure.cause), step)
        repeated = key in self._seen
        self._seen.add(key)
        if not failure.retryable:
            return "not retryable"
        if repeated:
            return (
                f"the same failure ({failure.cause}) at checkpoint step {step} twice: not retrying"
            )
        if self._attempts > self._max_restarts:
            return "no restarts left"
        return None


@dataclasses.dataclass
class Task:
    """One task: its configuration, and its process and log file once started.

    Attributes:
      detail: The cause in the last failure line the task printed, if any.
    """

    config: ClusterConfig
    process: Optional[subprocess.Popen]
    log: Optional[IO[str]]
    detail: Optional[str] = None

    @property
    def name(self) -> str:
        """`chief`, `evaluator`, or `worker-<i>` / `ps-<i>`."""
        config = self.config
        return config.task_type if config.task_type in (CHIEF, EVALUATOR) else config.role


def describe_exit(code: int) -> str:
    """Returns a readable cause for a process return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    names = {
        value: name
        for name, value in vars(exit_codes).items()
        if name.isupper() and isinstance(value, int)
    }
    return f"exited with code {code}" + (f" ({names[code]})" if code in names else "")


def _exit_code_of(code: int) -> int:
    return 128 - code if code < 0 else code


class Launcher:
    """Starts the tasks of a local cluster and supervises one attempt at a time.

    Tasks stay in the launcher's process group, so Ctrl-C in a terminal, or a
    signal to the group, reaches every one of them too.

    Args:
      train_args: Arguments of `module`, the same on every task.
      model_dir: The job's model_dir, where `logs/` goes.
      checkpoint_step: Returns the global step of the latest checkpoint.
      pin_cores: Run each training task on its own share of the cores.
      started: Monotonic time the launcher started, for the time to the
        first training step.
      out: Where prefixed task output is printed.
      module: What each task runs: `estimator_dist.train`, or
        `estimator_dist.script` for a legacy script.
      steps_name: How messages name the setting of the last step.
    """

    def __init__(
        self,
        train_args: Sequence[str],
        model_dir: str,
        checkpoint_step: Callable[[], int],
        pin_cores: bool = False,
        started: Optional[float] = None,
        out: IO[str] = sys.stdout,
        module: str = train.PROGRAM,
        steps_name: str = "--train_steps",
    ) -> None:
        self._module = module
        self._steps_name = steps_name
        #: The last step a script task printed, for jobs that do not name it.
        self.reported_steps: Optional[int] = None
        self._train_args = list(train_args)
        self._model_dir = model_dir
        self._checkpoint_step = checkpoint_step
        self._pin_cores = pin_cores
        self._started = time.monotonic() if started is None else started
        self._out = out
        self._print_lock = threading.Lock()
        self._exits: queue.Queue = queue.Queue()
        self._spawn_lock = threading.Lock()
        self._held: List[Task] = []
        self._stopping = False
        self._attempt = 0
        self._cores: dict = {}
        self.tasks: List[Task] = []
        self.failed_at: Optional[float] = None

    def say(self, message: str) -> None:
        """Prints a launcher line."""
        with self._print_lock:
            self._out.write(f"[launcher] {message}\n")
            self._out.flush()

    def start(self, configs: Sequence[ClusterConfig], attempt: int) -> None:
        """Starts one process per task configuration, the evaluator's later.

        The evaluator has nothing to do before the first checkpoint, so it is
        held back until the chief has run its first step (or a training task
        finished), and does not compete for cores while the cluster starts.
        """
        os.makedirs(os.path.join(self._model_dir, "logs"), exist_ok=True)
        self._attempt = attempt
        self._exits = queue.Queue()
        self._stopping = False
        training = [c.role for c in configs if c.task_type in (CHIEF, WORKER)]
        self._cores = dict(zip(training, split_cores(len(training)))) if self._pin_cores else {}
        self.tasks = [Task(config, None, None) for config in configs]
        self._held = [t for t in self.tasks if t.config.task_type == EVALUATOR]
        for task in self.tasks:
            if task.config.task_type != EVALUATOR:
                self._spawn(task)

    def release(self) -> None:
        """Starts the tasks `start` held back (the evaluator), once, unless stopping."""
        with self._spawn_lock:
            if self._stopping:
                return
            held, self._held = self._held, []
            for task in held:
                self._spawn(task)

    def _spawn(self, task: Task) -> None:
        config = task.config
        cores = self._cores.get(config.role)
        task.process = subprocess.Popen(
            [sys.executable, "-m", self._module, *self._train_args],
            env=dict(os.environ, TF_CONFIG=config.to_json(), PYTHONUNBUFFERED="1"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores),
        )
        task.log = open(os.path.join(self._model_dir, "logs", f"{config.role}.log"), "a")
        task.log.write(f"===== attempt {self._attempt} =====\n")
        threading.Thread(target=self._pump, args=(task, self._exits), daemon=True).start()
        on = f" on cores {','.join(map(str, sorted(cores)))}" if cores else ""
        self.say(f"started {task.name} (pid {task.process.pid}){on} TF_CONFIG={config.to_json()}")

    def _pump(self, task: Task, exits: queue.Queue) -> None:
        prefix = f"[{task.name}] "
        for line in task.process.stdout:
            task.log.write(line)
            with self._print_lock:
                self._out.write(prefix + line)
                self._out.flush()
            failed = _FAILURE_LINE.search(line)
            if failed:
                task.detail = failed.group(1).strip()
            steps = _MAX_STEPS_LINE.search(line)
            if steps:
                self.reported_steps = int(steps.group(1))
            first_step = task.config.task_type == CHIEF and exit_codes.FIRST_STEP_MARKER in line
            if first_step and self.failed_at is not None:
                self.say(
                    f"training resumed {time.monotonic() - self.failed_at:.1f} s after the "
                    "failure was detected"
                )
            elif first_step:
                self.say(
                    f"first training step {time.monotonic() - self._started:.1f} s after the "
                    "launcher started"
                )
            if first_step:
                self.release()
        task.log.close()
        exits.put((task, task.process.wait()))

    def supervise(
        self,
        deadline: Optional[float],
        train_steps: Optional[int],
        finish_timeout: float,
        root_cause_secs: float = ROOT_CAUSE_SECS,
    ) -> Optional[Failure]:
        """Waits for this attempt to end.

        Args:
          deadline: `time.monotonic()` value to give up at, or None.
          train_steps: The last step; a training task ending below it failed.
            None: the step the tasks print (`reported_steps`).
          finish_timeout: Seconds the others may take after the first
            training task finished.
          root_cause_secs: Seconds a lost-peer exit (150) waits for the exit of
            the task whose loss it reports.

        Returns:
          None when every training task and the evaluator finished after the
          last step; otherwise the first `Failure`, or the one behind a
          lost-peer exit.
        """
        pending = {id(t): t for t in self.tasks if t.config.task_type != PS}
        finish_by: Optional[float] = None
        while pending:
            limits = [t for t in (deadline, finish_by) if t is not None]
            timeout = max(0.0, min(limits) - time.monotonic()) if limits else None
            try:
                task, code = self._exits.get(timeout=timeout)
            except queue.Empty:
                waiting = ", ".join(t.name for t in pending.values())
                if finish_by is not None and time.monotonic() >= finish_by:
                    return Failure(
                        f"{waiting} did not finish within {finish_timeout:g} s after the "
                        "first training task finished",
                        exit_codes.STALLED,
                    )
                return Failure(
                    f"timed out (--timeout_secs) waiting for {waiting}", exit_codes.FAILURE
                )
            failure = self._failure_of(task, code, train_steps)
            if failure is not None and code == exit_codes.PEER_FAILURE:
                return self._cause_behind(task, failure, train_steps, root_cause_secs)
            if failure is not None:
                return failure
            if task.config.task_type in (CHIEF, WORKER) and finish_by is None:
                finish_by = time.monotonic() + finish_timeout
                self.release()
            del pending[id(task)]
            self.say(f"{task.name} finished")
        return None

    def _failure_of(self, task: Task, code: int, train_steps: Optional[int]) -> Optional[Failure]:
        """The failure one task's exit means, or None if it finished its part."""
        if code != 0:
            detail = f": {task.detail.rstrip('.')}" if task.detail else ""
            return Failure(f"{task.name} {describe_exit(code)}{detail}", _exit_code_of(code))
        if task.config.task_type == PS:
            return Failure(f"{task.name} exited before training ended", exit_codes.STALLED)
        if task.config.task_type not in (CHIEF, WORKER):
            return None
        last = train_steps if train_steps is not None else self.reported_steps
        if last is None:
            return Failure(
                f"{task.name} exited with code 0 without saying which step training ends at "
                "(it never called train_and_evaluate)",
                exit_codes.FAILURE,
            )
        step = self._checkpoint_step()
        if step < last:
            return Failure(
                f"{task.name} exited with code 0 while the latest checkpoint is at step {step}, "
                f"before {self._steps_name}={last}: its training input ran out. Make the "
                f"training input repeat (dataset.repeat()) and let {self._steps_name} end "
                "training; a restart would run out at the same place",
                exit_codes.INPUT_EXHAUSTED,
            )
        return None

    def _cause_behind(
        self, reporter: Task, lost_peer: Failure, train_steps: Optional[int], within: float
    ) -> Failure:
        """Waits up to `within` seconds for the failure that made `reporter` lose a peer.

        A task that leaves early aborts the collectives of the others, and one
        of them may exit 150 before the leaving task's own exit is seen.
        """
        end = time.monotonic() + within
        while True:
            try:
                task, code = self._exits.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return lost_peer
            failure = self._failure_of(task, code, train_steps)
            if failure is not None and code != exit_codes.PEER_FAILURE:
                return Failure(
                    failure.cause + _LOST_PEER.format(reporter=reporter.name), failure.exit_code
                )

    def stop(self, grace_secs: float) -> None:
        """Stops every task still running: SIGTERM, then SIGKILL after `grace_secs`."""
        with self._spawn_lock:
            self._stopping = True
        running = [t for t in self.tasks if t.process is not None and t.process.poll() is None]
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


def _remove_worker_dirs(model_dir: str) -> None:
    for path in glob.glob(os.path.join(model_dir, "tmp_worker_*")):
        shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every task runs, and what the launcher needs to supervise it.

    Attributes:
      module: The module each task runs with `python -m`.
      args: Its arguments, the same on every task.
      model_dir: The job's model_dir: logs, checkpoints, final metrics.
      train_steps: The last step, or None when the tasks print it (a script).
      steps_name: How messages name the setting of the last step.
      report: Pre-flight lines to print before the cluster starts.
    """

    module: str
    args: Tuple[str, ...]
    model_dir: str
    train_steps: Optional[int]
    steps_name: str
    report: Tuple[str, ...]


def _train_plan(train_args: Sequence[str]) -> Plan:
    """Validates the flags of `estimator_dist.train` and runs its pre-flight once.

    Raises:
      UsageError: for a bad flag, a job that does not fit the cluster, or a
        fatal pitfall.
      Error: when the user's model_fn or input_fn raises in the pre-flight.
    """
    from estimator_dist import driver

    given = [name for name in script_lib.FLAG_NAMES if flags.FLAGS[name].present]
    if given:
        raise UsageError(
            f"--{given[0]} is a flag of --script jobs; for an estimator_dist.train job give "
            f"it after '--' (e.g. `-- --{given[0]}=...`), or pass --script=PATH."
        )
    args = list(train_args)
    if not any(arg.startswith("--model_dir") for arg in args):
        args.append(f"--model_dir={tempfile.mkdtemp(prefix='estimator_dist-')}")
    job = train.job_from_args(args, known_only=True)
    if job.batch_size % _NUM_WORKERS.value:
        raise UsageError(
            f"--batch_size={job.batch_size} is the global batch and must divide evenly "
            f"over --num_workers={_NUM_WORKERS.value} workers."
        )
    driver.check_micro_batches(job.batch_size, job.micro_batches, _NUM_WORKERS.value)
    checked = driver.preflight(job, _NUM_WORKERS.value)
    return Plan(
        train.PROGRAM,
        tuple(args),
        job.run.model_dir,
        job.train_steps,
        "--train_steps",
        tuple(pitfalls.format_report(list(checked.pitfalls)).splitlines()),
    )


#: Arguments of a script that name its model_dir, by the conventions scripts follow.
_MODEL_DIR_ARGS = ("--model_dir", "--model-dir", "--job-dir", "--job_dir")


def model_dir_of(script_args: Sequence[str]) -> Optional[str]:
    """The model_dir a script is given by its own arguments, if one of them names it.

    >>> model_dir_of(["--max_steps=10", "--model_dir", "/tmp/run1"])
    '/tmp/run1'
    >>> model_dir_of(["--job-dir=gs://bucket/run"]), model_dir_of(["--steps=1"])
    ('gs://bucket/run', None)
    """
    for index, arg in enumerate(script_args):
        name, equals, value = arg.partition("=")
        if name in _MODEL_DIR_ARGS:
            if equals:
                return value
            if index + 1 < len(script_args):
                return script_args[index + 1]
    return None


def _script_plan(script_args: Sequence[str]) -> Plan:
    """Checks the script and the flags passed on to `estimator_dist.script`.

    Raises:
      UsageError: for a missing or non-Python script, a bad flag, or no way
        to know the script's model_dir.
    """
    config = script_lib.config_from_flags(flags.FLAGS, _SCRIPT.value, script_args)
    model_dir = config.model_dir or model_dir_of(script_args)
    if not model_dir:
        raise UsageError(
            f"--script={_SCRIPT.value} needs the directory its estimator writes to, for the "
            "job's logs/ and checkpoint step, and none of the script's arguments names it "
            f"({', '.join(_MODEL_DIR_ARGS)}). Pass it as --model_dir=DIR before '--', and give "
            "the script the same directory."
        )
    config = dataclasses.replace(config, model_dir=model_dir)
    with open(config.path) as stream:
        source = stream.read()
    verdict = pitfalls.script_verdict(source, _SCRIPT.value)
    found = pitfalls.scan_source(source, _SCRIPT.value)
    return Plan(
        script_lib.PROGRAM,
        tuple(config.to_args()),
        config.model_dir,
        None,
        "max_steps",
        (
            f"{_SCRIPT.value} (read, not run; every task checks it again when it runs): {verdict}",
            *pitfalls.format_report(found).splitlines(),
        ),
    )


def _run_attempts(launcher: Launcher, plan: Plan, deadline: Optional[float]) -> int:
    """Starts the cluster, supervises it and restarts it until it succeeds or gives up."""
    from estimator_dist import driver

    started = time.monotonic()
    policy = RestartPolicy(_MAX_RESTARTS.value)
    restarts: List[str] = []
    for attempt in range(_MAX_RESTARTS.value + 1):
        ports = [portpicker.pick_unused_port() for _ in range(_NUM_WORKERS.value + _NUM_PS.value)]
        cluster = make_local_cluster(
            _NUM_WORKERS.value, ports, _NUM_PS.value, _EVALUATOR.value, _HOST.value
        )
        launcher.start(cluster.tasks, attempt)
        failure = launcher.supervise(deadline, plan.train_steps, _FINISH_TIMEOUT.value)
        launcher.failed_at = time.monotonic()
        launcher.stop(_GRACE.value)
        if failure is None:
            break
        launcher.say(f"attempt {attempt} failed: {failure.cause}; stopped every task")
        restarts.append(f"attempt {attempt}: {failure.cause}")
        step = driver.checkpoint_step(plan.model_dir)
        reason = policy.give_up(failure, step)
        if reason is not None:
            launcher.say(f"job failed ({reason}); {len(restarts)} failed attempt(s)")
            return failure.exit_code
        backoff = min(2.0**attempt, 30.0)
        launcher.say(
            f"restarting the whole cluster from checkpoint step {step} in {backoff:g} s "
            f"(restart {attempt + 1} of at most {_MAX_RESTARTS.value})"
        )
        time.sleep(backoff)
    _remove_worker_dirs(plan.model_dir)
    launcher.say(f"job finished in {time.monotonic() - started:.1f} s")
    for line in restarts:
        launcher.say(f"restart after {line}")
    metrics = driver.read_final_metrics(plan.model_dir)
    if metrics is not None:
        launcher.say(f"final evaluation: {driver.format_metrics(metrics)}")
    elif _EVALUATOR.value:
        launcher.say(f"the evaluator wrote no final metrics to {plan.model_dir}")
        return exit_codes.FAILURE
    return exit_codes.OK


def main(argv: Sequence[str]) -> int:
    """Validates the job once, runs the cluster, prints the final metrics."""
    loopback = _HOST.value in ("localhost", "127.0.0.1", "::1")
    if _NETWORK_ISOLATION.value and loopback:
        reason = netns.enter_private_network()
    else:
        reason = "--nonetwork_isolation" if loopback else f"--host={_HOST.value} is not loopback"
    isolation = ISOLATED_MESSAGE if reason is None else EXPOSED_MESSAGE.format(reason=reason)

    from estimator_dist import driver
    from estimator_dist.startup import process_started

    try:
        plan = _script_plan(argv[1:]) if _SCRIPT.value else _train_plan(argv[1:])
    except UsageError as error:
        train.usage_exit(PROGRAM, str(error))
    except Error as error:
        sys.stderr.write(f"{PROGRAM}: {error}\n")
        return error.exit_code

    launcher = Launcher(
        plan.args,
        plan.model_dir,
        lambda: driver.checkpoint_step(plan.model_dir),
        _PIN_CORES.value,
        process_started(),
        module=plan.module,
        steps_name=plan.steps_name,
    )
    launcher.say(isolation)
    for line in plan.report:
        launcher.say(line)
    launcher.say(
        f"local cluster: {_NUM_WORKERS.value} worker(s), {_NUM_PS.value} ps, evaluator: "
        f"{_EVALUATOR.value}; model_dir {plan.model_dir}"
    )
    deadline = time.monotonic() + _TIMEOUT.value if _TIMEOUT.value else None
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        return _run_attempts(launcher, plan, deadline)
    except KeyboardInterrupt:
        launcher.say("interrupted; stopping every task")
        launcher.stop(_GRACE.value)
        return 130


def run() -> None:
    """Console-script entry point."""
    app.run(main, flags_parser=train.make_flags_parser(PROGRAM))


if __name__ == "__main__":
    run()
