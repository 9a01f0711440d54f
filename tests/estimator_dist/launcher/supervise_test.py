"""Launcher.supervise: how one attempt's task exits become success or a Failure.

No process is started: `launcher.tasks` holds `Task`s with real
`ClusterConfig`s and stand-in processes, and the test puts `(task, code)`
into the launcher's exit queue as the output pumps would. `supervise` runs in
a thread joined with a bound, so a wrong wait fails instead of hanging.
"""

import dataclasses
import io
import os
import queue
import sys
import threading
import time

import pytest

from estimator_dist.base import exit_codes
from estimator_dist.cluster.tf_config import make_local_cluster
from estimator_dist.config.shape import JobShape
from estimator_dist.launcher import supervise
from estimator_dist.launcher.exits import Failure, describe_exit, exit_code_of
from estimator_dist.launcher.local import LocalEngine
from estimator_dist.launcher.plan import Plan
from estimator_dist.launcher.supervise import Launcher, Task
from estimator_dist.launcher.task_start import TaskSpec, start_local_task
from estimator_dist.report import status
from estimator_dist.report.console import PROTOCOL_LINE

pytestmark = pytest.mark.timeout(60)

TRAIN_STEPS = 100
FAR = 60.0


def plan(tmp_path, steps_name="--train_steps"):
    """The plan of an estimator_dist.train job writing to `tmp_path`."""
    return Plan("estimator_dist.train", (), str(tmp_path), steps_name=steps_name)


class Job:
    """A launcher whose tasks are a local cluster's configs, with a settable checkpoint step."""

    def __init__(self, tmp_path, num_workers=2, num_ps=0, evaluator=True, step=TRAIN_STEPS):
        self.step = step
        self.out = io.StringIO()
        engine = LocalEngine(JobShape(num_workers, 0, True))
        self.launcher = Launcher(plan(tmp_path), engine, out=self.out)
        self.launcher.checkpoint_step = lambda: self.step
        ports = list(range(20000, 20000 + num_workers + num_ps))
        cluster = make_local_cluster(num_workers, ports, num_ps=num_ps, evaluator=evaluator)
        self.launcher.tasks = [
            Task(config, process=None, log=io.StringIO()) for config in cluster.tasks
        ]
        self.by_name = {t.name: t for t in self.launcher.tasks}

    def exit(self, name, code):
        self.launcher._exits.put((self.by_name[name], code))

    def supervise(
        self,
        deadline=None,
        finish_timeout=FAR,
        limit=10.0,
        root_cause_secs=0.1,
        evaluator_restarts=0,
    ):
        result = {}

        def target():
            try:
                result["value"] = self.launcher.supervise(
                    deadline, TRAIN_STEPS, finish_timeout, root_cause_secs, evaluator_restarts
                )
            except BaseException as error:
                result["error"] = error

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(timeout=limit)
        assert not thread.is_alive(), f"supervise did not return within {limit} s"
        if "error" in result:
            raise result["error"]
        return result["value"]


# --- success ------------------------------------------------------------------


def test_every_task_finishing_at_the_last_step_is_success(tmp_path):
    job = Job(tmp_path)
    for name in ("worker-0", "chief", "evaluator"):
        job.exit(name, 0)
    assert job.supervise() is None
    for name in ("worker-0", "chief", "evaluator"):
        assert f"[launcher] {name} finished\n" in job.out.getvalue()


def test_success_with_a_deadline_still_in_the_future(tmp_path):
    job = Job(tmp_path)
    for name in ("chief", "worker-0", "evaluator"):
        job.exit(name, 0)
    assert job.supervise(deadline=time.monotonic() + FAR, finish_timeout=5) is None


def test_success_does_not_wait_for_ps_tasks(tmp_path):
    job = Job(tmp_path, num_ps=1)
    for name in ("chief", "worker-0", "evaluator"):
        job.exit(name, 0)
    assert job.supervise() is None
    assert "ps-0 finished" not in job.out.getvalue()


def test_success_past_the_last_step(tmp_path):
    job = Job(tmp_path, step=TRAIN_STEPS + 1, evaluator=False)
    job.exit("chief", 0)
    job.exit("worker-0", 0)
    assert job.supervise() is None


def test_evaluator_must_finish_too(tmp_path):
    job = Job(tmp_path)
    job.exit("chief", 0)
    job.exit("worker-0", 0)
    failure = job.supervise(finish_timeout=0.3)
    assert failure is not None
    assert failure.cause.startswith("evaluator did not finish within 0.3 s")


# --- early exits --------------------------------------------------------------


def test_worker_exiting_0_before_the_last_step_fails(tmp_path):
    job = Job(tmp_path, step=40)
    job.exit("worker-0", 0)
    failure = job.supervise()
    assert isinstance(failure, Failure)
    assert failure.exit_code == exit_codes.INPUT_EXHAUSTED
    assert not failure.retryable
    assert failure.cause.startswith("worker-0 exited with code 0")
    assert "step 40, before --train_steps=100" in failure.cause


def test_chief_exiting_0_before_the_last_step_fails(tmp_path):
    job = Job(tmp_path, step=0)
    job.exit("chief", 0)
    failure = job.supervise()
    assert failure.exit_code == exit_codes.INPUT_EXHAUSTED
    assert failure.cause.startswith("chief exited with code 0")
    assert "before --train_steps=100" in failure.cause


def test_first_exit_decides_even_if_others_follow(tmp_path):
    job = Job(tmp_path)
    job.exit("worker-0", exit_codes.PEER_FAILURE)
    job.exit("chief", 0)
    job.exit("evaluator", 0)
    failure = job.supervise()
    assert failure.cause.startswith("worker-0 ")
    assert failure.exit_code == exit_codes.PEER_FAILURE


@pytest.mark.parametrize(
    "code, cause",
    [
        (exit_codes.STALLED, "worker-0 exited with code 152 (STALLED)"),
        (-9, "worker-0 was killed by SIGKILL"),
        (0, "worker-0 exited with code 0 while the latest checkpoint is at step 40"),
    ],
)
def test_a_lost_peer_exit_names_the_task_that_left_first(tmp_path, code, cause):
    # The leaving task aborted the chief's collective; its own exit comes later.
    job = Job(tmp_path, step=40)
    job.exit("chief", exit_codes.PEER_FAILURE)
    job.exit("evaluator", 0)
    job.exit("worker-0", code)
    failure = job.supervise(root_cause_secs=FAR)
    assert failure.cause.startswith(cause), failure.cause
    assert "(chief exited first, with code 150, as it lost this peer)" in failure.cause
    assert failure.exit_code == (exit_code_of(code) if code else exit_codes.INPUT_EXHAUSTED)


def test_a_lost_peer_exit_waits_for_its_cause_only_so_long(tmp_path):
    job = Job(tmp_path)
    job.exit("chief", exit_codes.PEER_FAILURE)
    job.exit("worker-0", exit_codes.PEER_FAILURE)
    started = time.monotonic()
    failure = job.supervise(root_cause_secs=0.5)
    assert failure == Failure("chief exited with code 150 (PEER_FAILURE)", 150, "chief")
    assert time.monotonic() - started >= 0.5


def test_exit_150_is_a_retryable_peer_failure(tmp_path):
    job = Job(tmp_path)
    job.exit("chief", 0)
    job.exit("worker-0", 150)
    failure = job.supervise(root_cause_secs=0.1)
    assert failure == Failure("worker-0 exited with code 150 (PEER_FAILURE)", 150, "worker-0")
    assert "PEER_FAILURE" in failure.cause
    assert failure.retryable


@pytest.mark.parametrize(
    "code, name",
    [
        (exit_codes.CLUSTER_TIMEOUT, "CLUSTER_TIMEOUT"),
        (exit_codes.STALLED, "STALLED"),
        (exit_codes.SESSION_RECOVERY, "SESSION_RECOVERY"),
        (exit_codes.PORT_IN_USE, "PORT_IN_USE"),
    ],
)
def test_retryable_codes_keep_their_code_and_name(tmp_path, code, name):
    job = Job(tmp_path)
    job.exit("chief", code)
    failure = job.supervise()
    assert failure.exit_code == code
    assert failure.cause == f"chief exited with code {code} ({name})"
    assert failure.retryable


@pytest.mark.parametrize("code, name", [(1, "FAILURE"), (2, "USAGE"), (4, "CLUSTER_MISMATCH")])
def test_codes_below_128_are_not_retryable(tmp_path, code, name):
    job = Job(tmp_path)
    job.exit("worker-0", code)
    failure = job.supervise()
    assert failure.exit_code == code
    assert failure.cause == f"worker-0 exited with code {code} ({name})"
    assert not failure.retryable


def test_killed_by_sigkill_is_retryable_137(tmp_path):
    job = Job(tmp_path)
    job.exit("worker-0", -9)
    failure = job.supervise()
    assert failure.cause == "worker-0 was killed by SIGKILL"
    assert failure.exit_code == 137
    assert failure.retryable


def test_evaluator_failing_fails_the_attempt(tmp_path):
    job = Job(tmp_path)
    job.exit("evaluator", 1)
    failure = job.supervise()
    assert failure == Failure("evaluator exited with code 1 (FAILURE)", 1, "evaluator")


@pytest.mark.parametrize("code", [exit_codes.USER_CODE, exit_codes.EVAL_UNENDING])
def test_an_evaluator_failing_the_same_way_again_is_not_restarted_alone(tmp_path, code):
    job = Job(tmp_path)
    job.exit("evaluator", code)
    failure = job.supervise(evaluator_restarts=3)
    assert failure.exit_code == code and not failure.retryable, failure
    assert job.launcher.evaluator_restarts == []


def test_ps_exiting_0_fails_the_attempt(tmp_path):
    job = Job(tmp_path, num_ps=1)
    job.exit("ps-0", 0)
    failure = job.supervise()
    assert failure == Failure("ps-0 exited before training ended", exit_codes.STALLED, "ps-0")
    assert failure.retryable


def test_ps_killed_fails_the_attempt(tmp_path):
    job = Job(tmp_path, num_ps=1)
    job.exit("chief", 0)
    job.exit("ps-0", -15)
    failure = job.supervise()
    assert failure == Failure("ps-0 was killed by SIGTERM", 143, "ps-0", "was killed by SIGTERM")


# --- deadlines ----------------------------------------------------------------


def test_deadline_passed_with_nothing_exiting_times_out(tmp_path):
    job = Job(tmp_path)
    started = time.monotonic()
    failure = job.supervise(deadline=started + 0.3)
    elapsed = time.monotonic() - started
    assert failure.exit_code == exit_codes.FAILURE
    assert not failure.retryable
    assert failure.cause == "timed out (--timeout_secs) waiting for chief, worker-0, evaluator"
    assert 0.25 <= elapsed < 5


def test_deadline_already_passed_times_out_at_once(tmp_path):
    job = Job(tmp_path)
    started = time.monotonic()
    failure = job.supervise(deadline=started - 1)
    assert failure.cause.startswith("timed out (--timeout_secs)")
    assert time.monotonic() - started < 2


def test_timeout_names_only_the_tasks_still_running(tmp_path):
    job = Job(tmp_path, num_workers=3)
    job.exit("evaluator", 0)
    failure = job.supervise(deadline=time.monotonic() + 0.3)
    assert failure.cause == "timed out (--timeout_secs) waiting for chief, worker-0, worker-1"


def test_worker_not_finishing_after_the_chief_fails(tmp_path):
    job = Job(tmp_path, evaluator=False)
    job.exit("chief", 0)
    started = time.monotonic()
    failure = job.supervise(finish_timeout=0.3)
    elapsed = time.monotonic() - started
    assert failure == Failure(
        "worker-0 did not finish within 0.3 s after the first training task finished",
        exit_codes.STALLED,
    )
    assert failure.retryable
    assert 0.25 <= elapsed < 5


def test_finish_timeout_before_deadline_reports_finish(tmp_path):
    job = Job(tmp_path)
    job.exit("worker-0", 0)
    failure = job.supervise(deadline=time.monotonic() + FAR, finish_timeout=0.3)
    assert failure.cause.startswith("chief, evaluator did not finish within 0.3 s")
    assert failure.exit_code == exit_codes.STALLED


def test_deadline_before_finish_timeout_reports_timeout(tmp_path):
    job = Job(tmp_path)
    job.exit("chief", 0)
    failure = job.supervise(deadline=time.monotonic() + 0.3, finish_timeout=FAR)
    assert failure == Failure(
        "timed out (--timeout_secs) waiting for worker-0, evaluator", exit_codes.FAILURE
    )


def test_finish_timeout_starts_at_the_first_training_task(tmp_path):
    # The evaluator finishing first does not start the finish timeout.
    job = Job(tmp_path)
    job.exit("evaluator", 0)
    failure = job.supervise(deadline=time.monotonic() + 0.5, finish_timeout=0.1)
    assert failure.cause.startswith("timed out (--timeout_secs)")


# --- describe_exit and _exit_code_of ------------------------------------------


@pytest.mark.parametrize(
    "code, description",
    [
        (0, "exited with code 0 (OK)"),
        (1, "exited with code 1 (FAILURE)"),
        (150, "exited with code 150 (PEER_FAILURE)"),
        (154, "exited with code 154 (PORT_IN_USE)"),
        (7, "exited with code 7 (COLLECTIVE_MISMATCH)"),
        (99, "exited with code 99"),
        (-15, "was killed by SIGTERM"),
        (-9, "was killed by SIGKILL"),
    ],
)
def test_describe_exit(code, description):
    assert describe_exit(code) == description


@pytest.mark.parametrize("code, expected", [(-9, 137), (-15, 143), (-2, 130), (0, 0), (150, 150)])
def testexit_code_of(code, expected):
    assert exit_code_of(code) == expected


def test_task_names():
    cluster = make_local_cluster(3, [1, 2, 3, 4], num_ps=1, evaluator=True)
    names = [Task(config, None, None).name for config in cluster.tasks]
    assert names == ["chief", "worker-0", "worker-1", "ps-0", "evaluator"]


def test_describe_exit_of_a_real_time_signal():
    """BUG: signals without a name in `signal.Signals` (35 to 63 on Linux) raise ValueError.

    `supervise` then raises instead of returning a Failure, and the launcher
    dies without stopping the other tasks.
    """
    description = describe_exit(-40)
    assert description.startswith("was killed by")
    assert "40" in description


@pytest.mark.multiprocess
def test_supervise_reports_a_task_killed_by_a_real_time_signal(tmp_path):
    job = Job(tmp_path)
    job.exit("worker-0", -40)
    failure = job.supervise()
    assert failure.cause.startswith("worker-0 was killed by")
    assert failure.exit_code == 168
    assert failure.retryable


# --- what the launcher learns from a task: its status events only -----------------------

#: A task's output: TensorFlow's noise, the lines meant for people, its failure.
TASK_LINES = [
    "2026-11-24 02:17:55.123395: E external/cuda_dnn.cc:9261] Unable to register cuDNN factory",
    "W1124 02:17:59.867113 1404 deprecation.py:50] From x.py:3: Estimator is deprecated",
    "W1124 02:17:59.867113 1404 deprecation.py:50] Instructions for updating:",
    "I1124 02:18:03.626438 1404 watchdog.py:226] estimator_dist: task chief-0 "
    "ran its first step (global step 0).",
    "I1124 02:18:03.626610 1404 basic_session_run_hooks.py:265] loss = 2.3114226, step = 0",
    "I1124 02:18:06.459632 1404 roles.py:228] [ 50%] loss = 0.2320, "
    "step = 200/400, 6,830 examples/s, ~2 s left",
    "E1124 02:18:07.000000 1404 watchdog.py:84] estimator_dist: task chief-0 "
    "failed (exit 152): the global step stayed at 200",
    "estimator_dist: task chief-0 failed (exit 152): the global step stayed at 200",
]
#: What the same task says on its status channel.
TASK_EVENTS = [
    status.Started(task="chief-0", pid=1404),
    status.FirstStep(step=0),
    status.Progress(200, 400, 0.232, 6830.0, 100, 2.9),
    status.Exiting(exit_code=152, cause="the global step stayed at 200"),
]
#: Lines a user's model_fn or script may print that the launcher once read as facts.
MIMICS = [
    "global step 999",
    "INFO:tensorflow:loss = 0.41, step = 999 (0.512 sec)",
    "estimator_dist: task chief-0 ran its first step (global step 999).",
    "estimator_dist: task chief failed (exit 150): fake",
    "estimator_dist.train: error: fake",
    "estimator_dist.script: training to max_steps=999 in model_dir /tmp (task chief-0)",
    PROTOCOL_LINE,
]


class FakeProcess:
    """A finished task: its output lines, its status lines, its exit code."""

    pid = 1404

    def __init__(self, lines=(), events=(), code=0, status_lines=()):
        self.stdout = [f"{line}\n" for line in lines]
        self.status = [*status_lines, *(status.encode(event) for event in events)]
        self.code = code

    def wait(self, timeout=None):
        return self.code


def pump(tmp_path, lines, events=(), verbose=False, role="chief-0", process=None):
    """Runs a task's output and status lines through the launcher's pump.

    Returns:
      The launcher, the task, what it put in the exits queue (the release of
      the evaluator, then the exit), what the console shows of the task, and
      the task's log.
    """
    out = io.StringIO()
    engine = LocalEngine(JobShape(2, 0, False))
    launcher = Launcher(plan(tmp_path), engine, out=out, verbose=verbose)
    configs = {c.role: c for c in make_local_cluster(2, [20001, 20002]).tasks}
    task = Task(configs[role], process or FakeProcess(lines, events), open(tmp_path / "t.log", "w"))
    launcher.tasks = [task]
    exits = queue.Queue()
    launcher._pump(task, exits)
    queued = [exits.get_nowait() for _ in range(exits.qsize())]
    assert queued[-1] == (task, task.process.wait())
    prefix = f"[{task.name}] "
    echoed = [line for line in out.getvalue().splitlines(True) if line.startswith(prefix)]
    launcher_lines = [line for line in out.getvalue().splitlines() if line.startswith("[launcher]")]
    return Pumped(
        launcher,
        task,
        queued[:-1],
        "".join(echoed),
        launcher_lines,
        (tmp_path / "t.log").read_text(),
    )


@dataclasses.dataclass
class Pumped:
    launcher: Launcher
    task: Task
    queued: list
    shown: str
    said: list
    log: str


@pytest.mark.multiprocess
def test_a_locally_started_task_gives_the_launcher_its_output_and_its_events(tmp_path, monkeypatch):
    (tmp_path / "fake_task.py").write_text(
        "import sys\n"
        "from estimator_dist.report import status\n"
        "status.emit(status.FirstStep(step=7))\n"
        "print('global step 999')\n"
        "status.emit(status.Exiting(exit_code=152, cause='stalled'))\n"
        "sys.exit(152)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    config = make_local_cluster(2, [20001, 20002]).tasks[0]
    process = start_local_task(TaskSpec("fake_task", (), config, None))
    pumped = pump(tmp_path, (), process=process)
    assert pumped.task.detail == "stalled"
    assert pumped.launcher.last_step_seen == 7
    assert pumped.queued == [(supervise._RELEASE, None)]
    assert pumped.shown == "[chief] global step 999\n"


def test_a_task_that_says_so_shows_only_what_people_need_and_logs_everything(tmp_path):
    pumped = pump(tmp_path, [PROTOCOL_LINE, *TASK_LINES], TASK_EVENTS)
    assert pumped.shown == (
        "[chief] estimator_dist: task chief-0 ran its first step (global step 0).\n"
        "[chief] [ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left\n"
        "[chief] estimator_dist: task chief-0 failed (exit 152): the global step stayed at 200\n"
    )
    assert pumped.log == "\n".join([PROTOCOL_LINE, *TASK_LINES]) + "\n"
    assert pumped.task.detail == "the global step stayed at 200"
    assert pumped.launcher.last_step_seen == 200
    assert pumped.queued == [(supervise._RELEASE, None)]
    assert pumped.said[0].startswith("[launcher] first training step ")


def test_verbose_shows_every_line(tmp_path):
    pumped = pump(tmp_path, [PROTOCOL_LINE, *TASK_LINES], TASK_EVENTS, verbose=True)
    assert pumped.shown == "".join(f"[chief] {line}\n" for line in TASK_LINES)
    assert pumped.log == "\n".join([PROTOCOL_LINE, *TASK_LINES]) + "\n"


def test_a_task_that_does_not_say_so_shows_every_line(tmp_path):
    pumped = pump(tmp_path, TASK_LINES, TASK_EVENTS)
    assert pumped.shown == "".join(f"[chief] {line}\n" for line in TASK_LINES)


def test_lines_that_mimic_the_old_markers_decide_nothing(tmp_path):
    pumped = pump(tmp_path, [PROTOCOL_LINE, *MIMICS])
    assert pumped.task.detail is None
    assert pumped.launcher.last_step_seen == 0
    assert pumped.launcher.reported_steps is None
    assert pumped.queued == []  # No release of the evaluator.
    assert pumped.said == []
    # Only the first line switches the console's filter on: the mimic is shown as printed.
    assert pumped.shown.splitlines()[-1] == f"[chief] {PROTOCOL_LINE}"


def test_a_worker_first_step_releases_nothing_and_a_chief_resumed_says_so(tmp_path):
    pumped = pump(tmp_path, (), [status.FirstStep(step=5)], role="worker-0")
    assert (pumped.queued, pumped.said, pumped.launcher.last_step_seen) == ([], [], 5)
    out = io.StringIO()
    launcher = Launcher(plan(tmp_path), LocalEngine(JobShape(1, 0, False)), out=out)
    launcher.failed_at = time.monotonic()
    task = Task(make_local_cluster(1, [20001]).tasks[0], None, None)
    exits = queue.Queue()
    launcher._on_event(task, status.FirstStep(step=300), exits)
    assert out.getvalue().startswith("[launcher] training resumed ")
    assert exits.get_nowait() == (supervise._RELEASE, None)


@pytest.mark.parametrize(
    "how, reported",
    [
        (status.MAX_STEPS, 321),
        (status.INPUTS_COUNTED, 321),
        (status.INPUT_ENDED, 321),
        (status.EARLY_STOPPING, 321),
        (status.PREEMPTION, None),  # A decided stop, ahead of the steps run: not the last step.
    ],
)
def test_the_last_step_comes_from_a_stop_step_event_not_a_preemption(tmp_path, how, reported):
    pumped = pump(tmp_path, (), [status.StopStep(step=321, how=how)], role="worker-0")
    assert pumped.launcher.reported_steps == reported
    assert pumped.launcher.last_step_seen == 0


def test_a_malformed_status_line_is_said_once_and_ignored(tmp_path):
    process = FakeProcess(
        events=[status.FirstStep(step=4)],
        status_lines=["global step 999\n", '{"v": 1, "kind": "first_step"}\n'],
    )
    pumped = pump(tmp_path, (), process=process, role="worker-0")
    assert pumped.said == [
        "[launcher] worker-0 sent a status line that is no event "
        "(not JSON: Expecting value: line 1 column 1 (char 0)), ignored: 'global step 999'"
    ]
    assert pumped.launcher.last_step_seen == 4


def test_the_exit_waits_for_the_events_written_before_it(tmp_path):
    """The exit is queued only once the status channel ended, so its cause is known."""
    exited = threading.Event()

    class Exiting(FakeProcess):
        def wait(self, timeout=None):
            exited.set()
            return self.code

    def channel():  # Read only after the exit was seen, as when the status thread lags.
        assert exited.wait(5)
        yield status.encode(status.Exiting(exit_code=3, cause="a bad record"))

    process = Exiting(code=3)
    process.status = channel()
    pumped = pump(tmp_path, (), process=process, role="worker-0")
    assert pumped.task.detail == "a bad record"


# --- the console: the job's progress once ------------------------------------------------

PROGRESS_LINE = (
    "I1124 02:18:06.459632 1404 roles.py:228] [ 50%] loss = 0.2320, "
    "step = 200/400, 6,830 examples/s, ~2 s left"
)


@pytest.mark.parametrize("role, shown", [("chief-0", True), ("worker-0", False)])
def test_only_the_chief_progress_line_reaches_the_console(tmp_path, role, shown):
    pumped = pump(tmp_path, [PROTOCOL_LINE, PROGRESS_LINE, "a warning"], role=role)
    name = "chief" if role == "chief-0" else role
    expected = f"[{name}] [ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left\n"
    assert (expected in pumped.shown) == shown
    assert pumped.shown.endswith(f"[{name}] a warning\n")
    assert PROGRESS_LINE in pumped.log


FIRST_STEP_LINE = (
    "I1124 02:18:03.626438 1404 watchdog.py:271] estimator_dist: task worker-0 "
    "ran its first step (global step 0)."
)


@pytest.mark.parametrize("role, shown", [("chief-0", True), ("worker-0", False)])
def test_only_the_chiefs_first_step_line_reaches_the_console(tmp_path, role, shown):
    pumped = pump(tmp_path, [PROTOCOL_LINE, FIRST_STEP_LINE], role=role)
    assert ("ran its first step" in pumped.shown) == shown
    assert FIRST_STEP_LINE in pumped.log


def test_verbose_shows_the_workers_progress_lines_too(tmp_path):
    pumped = pump(tmp_path, [PROTOCOL_LINE, PROGRESS_LINE], role="worker-0", verbose=True)
    assert "[worker-0] I1124" in pumped.shown


def progress(step, rate=8000.0):
    return status.Progress(step, 400, 0.1, rate, 100, 1.0)


def test_a_worker_that_lags_the_chief_is_said_once(tmp_path):
    job = Job(tmp_path)
    chief, worker = job.by_name["chief"], job.by_name["worker-0"]
    exits = queue.Queue()
    for task, event in [
        (chief, progress(100)),
        (worker, progress(100)),
        (chief, progress(200)),
        (chief, progress(300)),  # The worker's 200 is late: two intervals behind.
        (worker, progress(200)),
        (chief, progress(400)),
        (worker, progress(300)),
    ]:
        job.launcher._on_event(task, event, exits)
    assert job.out.getvalue() == (
        "[launcher] worker-0 lags the chief: at step 100 while the chief is at step 300 "
        "(a progress line every 100 steps)\n"
    )
    assert job.launcher.last_step_seen == 400


def test_a_worker_much_slower_at_the_same_step_is_said(tmp_path):
    job = Job(tmp_path, num_workers=3)
    exits = queue.Queue()
    job.launcher._on_event(job.by_name["chief"], progress(200, 8000.0), exits)
    job.launcher._on_event(job.by_name["worker-0"], progress(200, 7000.0), exits)
    assert job.out.getvalue() == ""
    job.launcher._on_event(job.by_name["worker-1"], progress(200, 3000.0), exits)
    assert job.out.getvalue() == (
        "[launcher] worker-1 lags the chief: at step 200 at 3,000 examples/s, "
        "the chief at 8,000 examples/s\n"
    )


def test_the_protocol_line_after_a_start_up_warning_still_switches_the_filter_on(tmp_path):
    warning = "/usr/lib/python3/site.py:1: DeprecationWarning: something is deprecated"
    pumped = pump(tmp_path, [warning, "  import thing", PROTOCOL_LINE, *TASK_LINES], TASK_EVENTS)
    assert pumped.shown == (
        f"[chief] {warning}\n"
        "[chief]   import thing\n"
        "[chief] estimator_dist: task chief-0 ran its first step (global step 0).\n"
        "[chief] [ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left\n"
        "[chief] estimator_dist: task chief-0 failed (exit 152): the global step stayed at 200\n"
    )
    assert pumped.log == "\n".join([warning, "  import thing", PROTOCOL_LINE, *TASK_LINES]) + "\n"


def test_the_protocol_line_counts_only_among_the_first_lines(tmp_path):
    early = [f"line {i}" for i in range(supervise.PROTOCOL_LINES)]
    pumped = pump(tmp_path, [*early, PROTOCOL_LINE, *TASK_LINES], TASK_EVENTS)
    shown = [*early, PROTOCOL_LINE, *TASK_LINES]
    assert pumped.shown == "".join(f"[chief] {line}\n" for line in shown)


# --- a silent evaluator -------------------------------------------------------------


class Running:
    """A task's process that runs, silent, until killed; its kill is its exit, as the pump's."""

    pid = 1405

    def __init__(self, exits=None, task=None):
        self.code = None
        self._exits, self._task = exits, task
        self.stdout, self.status = [], []

    def poll(self):
        return self.code

    def kill(self):
        self.code = -9
        if self._exits is not None:
            self._exits.put((self._task, -9))


def silent_job(tmp_path, now):
    """A job whose tasks all run silent, on a clock the test sets (`now[0]`)."""
    job = Job(tmp_path)
    job.launcher._clock = lambda: now[0]
    for task in job.launcher.tasks:
        task.process = Running(job.launcher._exits, task)
    return job


def test_an_evaluator_silent_for_the_bound_is_killed_and_one_that_beats_is_not(tmp_path):
    now = [0.0]
    job = silent_job(tmp_path, now)
    evaluator = job.by_name["evaluator"]
    now[0] = 29.9
    job.launcher._kill_silent_evaluator(30.0)
    assert evaluator.process.code is None
    job.launcher._on_event(evaluator, status.Heartbeat(), queue.Queue())  # heard at 29.9
    now[0] = 59.8
    job.launcher._kill_silent_evaluator(30.0)
    assert evaluator.process.code is None
    now[0] = 60.0
    job.launcher._kill_silent_evaluator(30.0)
    assert evaluator.process.code == -9
    assert evaluator.detail.startswith("it sent nothing on its status channel for 30 s")
    # Training tasks, as silent for longer, are the heartbeat between tasks' to judge.
    assert [job.by_name[n].process.code for n in ("chief", "worker-0")] == [None, None]


def test_an_evaluator_that_said_it_exits_is_not_killed_for_its_silence(tmp_path):
    # Its final evaluation done, an evaluator's interpreter shutting TensorFlow down sends no
    # heartbeat (over 30 s on a loaded machine): killing it then failed a finished job.
    now = [0.0]
    job = silent_job(tmp_path, now)
    evaluator = job.by_name["evaluator"]
    job.launcher._on_event(evaluator, status.Exiting(exit_code=0), queue.Queue())
    now[0] = 600.0
    job.launcher._kill_silent_evaluator(30.0)
    assert evaluator.process.code is None


def test_a_silent_evaluator_is_restarted_alone_while_training_goes_on(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    now = [100.0]
    job = silent_job(tmp_path, now)
    started = []

    def start_task(spec):  # The restarted evaluator: evaluates, then finishes.
        started.append(spec.config.role)
        return FakeProcess(events=[status.Heartbeat()], code=0)

    monkeypatch.setattr(job.launcher._engine, "start_task", start_task)
    job.exit("chief", 0)
    job.exit("worker-0", 0)
    assert job.supervise(evaluator_restarts=1) is None
    assert started == ["evaluator-0"]
    said = job.out.getvalue()
    assert (
        "[launcher] evaluator was killed by SIGKILL: it sent nothing on its status channel for "
        "100 s (no heartbeat, expected every 2 s): frozen (stopped by a signal, a paused "
        "machine) or hung in start-up; killed; restarting the evaluator alone from checkpoint "
        f"step {TRAIN_STEPS} (evaluator restart 1); training goes on\n"
    ) in said
    assert "[launcher] evaluator finished\n" in said
