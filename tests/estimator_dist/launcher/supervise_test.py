"""Launcher.supervise: how one attempt's task exits become success or a Failure.

No process is started: `launcher.tasks` holds `Task`s with real
`ClusterConfig`s and stand-in processes, and the test puts `(task, code)`
into the launcher's exit queue as the output pumps would. `supervise` runs in
a thread joined with a bound, so a wrong wait fails instead of hanging.
"""

import io
import queue
import subprocess
import sys
import threading
import time

import pytest

from estimator_dist.base import exit_codes
from estimator_dist.base.cluster import make_local_cluster
from estimator_dist.base.console import PROTOCOL_LINE
from estimator_dist.launcher import supervise
from estimator_dist.launcher.exits import Failure, describe_exit, exit_code_of
from estimator_dist.launcher.supervise import Launcher, Task

pytestmark = pytest.mark.timeout(60)

TRAIN_STEPS = 100
FAR = 60.0


class Job:
    """A launcher whose tasks are a local cluster's configs, with a settable checkpoint step."""

    def __init__(self, tmp_path, num_workers=2, num_ps=0, evaluator=True, step=TRAIN_STEPS):
        self.step = step
        self.out = io.StringIO()
        self.launcher = Launcher(
            train_args=[],
            model_dir=str(tmp_path),
            checkpoint_step=lambda: self.step,
            out=self.out,
        )
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
    assert failure == Failure("chief exited with code 150 (PEER_FAILURE)", 150)
    assert time.monotonic() - started >= 0.5


def test_exit_150_is_a_retryable_peer_failure(tmp_path):
    job = Job(tmp_path)
    job.exit("chief", 0)
    job.exit("worker-0", 150)
    failure = job.supervise(root_cause_secs=0.1)
    assert failure == Failure("worker-0 exited with code 150 (PEER_FAILURE)", 150)
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
    assert failure == Failure("evaluator exited with code 1 (FAILURE)", 1)


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
    assert failure == Failure("ps-0 exited before training ended", exit_codes.STALLED)
    assert failure.retryable


def test_ps_killed_fails_the_attempt(tmp_path):
    job = Job(tmp_path, num_ps=1)
    job.exit("chief", 0)
    job.exit("ps-0", -15)
    failure = job.supervise()
    assert failure == Failure("ps-0 was killed by SIGTERM", 143)


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


# --- what the console shows of a task's output -----------------------------------------

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


def pump(tmp_path, lines, verbose=False):
    """Runs a real process printing `lines` through the launcher's pump.

    Returns:
      What the console shows of the task, and the task's log.
    """
    out = io.StringIO()
    launcher = Launcher([], str(tmp_path), lambda: 0, out=out, verbose=verbose)
    config = make_local_cluster(1, [20001]).tasks[0]
    script = "import sys\nfor line in sys.argv[1:]:\n    print(line)\n"
    process = subprocess.Popen(
        [sys.executable, "-c", script, *lines], stdout=subprocess.PIPE, text=True
    )
    task = Task(config, process, open(tmp_path / "chief-0.log", "w"))
    exits = queue.Queue()
    launcher._pump(task, exits)
    events = [exits.get_nowait() for _ in range(exits.qsize())]
    assert events[-1] == (task, 0)  # After the evaluator's release at the first step.
    assert task.detail == "the global step stayed at 200"
    assert launcher.last_step_seen == 200
    echoed = [line for line in out.getvalue().splitlines(True) if line.startswith("[chief] ")]
    return "".join(echoed), (tmp_path / "chief-0.log").read_text()


@pytest.mark.multiprocess
def test_a_task_that_says_so_shows_only_what_people_need_and_logs_everything(tmp_path):
    shown, log = pump(tmp_path, [PROTOCOL_LINE, *TASK_LINES])
    assert shown == (
        "[chief] estimator_dist: task chief-0 ran its first step (global step 0).\n"
        "[chief] [ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left\n"
        "[chief] estimator_dist: task chief-0 failed (exit 152): the global step stayed at 200\n"
    )
    assert log == "\n".join([PROTOCOL_LINE, *TASK_LINES]) + "\n"


@pytest.mark.multiprocess
def test_verbose_shows_every_line(tmp_path):
    shown, log = pump(tmp_path, [PROTOCOL_LINE, *TASK_LINES], verbose=True)
    assert shown == "".join(f"[chief] {line}\n" for line in TASK_LINES)
    assert log == "\n".join([PROTOCOL_LINE, *TASK_LINES]) + "\n"


@pytest.mark.multiprocess
def test_a_task_that_does_not_say_so_shows_every_line(tmp_path):
    shown, _ = pump(tmp_path, TASK_LINES)
    assert shown == "".join(f"[chief] {line}\n" for line in TASK_LINES)


@pytest.mark.parametrize(
    "line, step",
    [
        ("[ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left", 200),
        ("INFO:tensorflow:loss = 0.41, step = 37 (0.512 sec)", 37),
        ("estimator_dist: task worker-0 received SIGTERM at global step 143; stopping", 143),
        (
            "estimator_dist: task worker-0 will stop at global step 160 (preemption of chief-0).",
            None,
        ),
        ("estimator_dist: chief-0 decided: every task stops at global step 160", None),
    ],
)
def test_steps_lost_count_only_steps_run_not_a_decided_stop_step(line, step):
    progress = supervise._STEP_LINE.search(line)
    assert (progress and int(progress.group(1))) == step
