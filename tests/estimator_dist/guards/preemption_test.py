"""The preemption protocol: one decider, one stop step, stale files ignored, a grace deadline.

The real cluster runs (SIGTERM to the chief, a worker or both, then resume)
are in faults_test.py; these drive the protocol directly, on a shared dir.
"""

import json
import os
import signal
import threading
import time

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.guards.preemption import DECISION_FILE, PREEMPTION_DIR, Preemption
from estimator_dist.guards.watchdog import LastStep, Watchdog
from tests.hooks import CountingHook
from tests.task_models import linear_model_fn, ones_input_fn


class Exits:
    def __init__(self):
        self.calls = []

    def __call__(self, role, code, cause):
        self.calls.append((role, code, cause))

    @property
    def codes(self):
        return [code for _, code, _ in self.calls]


def make(tmp_path, role, kind, **kwargs):
    exits = Exits()
    preemption = Preemption(role, str(tmp_path), kind, exit_fn=exits, **kwargs)
    os.makedirs(tmp_path / PREEMPTION_DIR, exist_ok=True)
    return preemption, exits


def run_steps(preemption, count):
    """Runs up to `count` steps; returns the step the session stopped after, or None."""
    for _ in range(count):
        if preemption.step_done():
            return preemption._step
    return None


def test_a_workers_signal_makes_the_chief_decide_one_stop_step_for_both(tmp_path):
    chief, chief_exits = make(tmp_path, "chief-0", "chief")
    worker, worker_exits = make(tmp_path, "worker-0", "worker")
    for task in (chief, worker):
        task.joined("attempt-1")
        task.session_started(40)
        run_steps(task, 10)
    chief._step_secs = 0.01
    worker.signalled()
    chief.poll_once()
    worker.poll_once()
    assert chief.stop_at == worker.stop_at == 50 + 100
    assert run_steps(chief, 10_000) == run_steps(worker, 10_000) == chief.stop_at
    chief.finished()
    worker.finished()
    assert chief_exits.codes == worker_exits.codes == [exit_codes.PREEMPTED]
    assert f"at global step {chief.stop_at} with a checkpoint" in chief_exits.calls[0][2]
    decision = json.loads((tmp_path / PREEMPTION_DIR / DECISION_FILE).read_text())
    assert decision == {
        "stop_at": chief.stop_at,
        "requested_by": "worker-0",
        "reason": "SIGTERM",
        "done": True,
        "attempt": "attempt-1",
        "saved_step": chief.stop_at,
    }


def test_the_chief_takes_the_stop_step_only_once_every_worker_has_read_it(tmp_path):
    # Through object storage a decision can reach a worker after the steps it led by (a 5 s
    # lead timed on the first, slow steps): the chief waits before the stop step's step, the
    # worker's training thread waits in that step's collective, and its poller reads the step.
    chief, _ = make(tmp_path, "chief-0", "chief", peers=("worker-0",), grace_secs=60)
    worker, _ = make(tmp_path, "worker-0", "worker", grace_secs=60)
    for task in (chief, worker):
        task.session_started(0)
    chief._step_secs = 1.0
    worker.signalled()
    chief.poll_once()
    assert run_steps(chief, chief.stop_at - 1) is None  # At the step before the stop step.
    confirmed = tmp_path / PREEMPTION_DIR / "confirmed-worker-0.json"
    reader = threading.Timer(0.2, worker.poll_once)  # The worker's poller, late.
    reader.start()
    chief.before_step()
    reader.join()
    assert confirmed.exists() and worker.stop_at == chief.stop_at
    assert chief.step_done() and run_steps(worker, chief.stop_at) == chief.stop_at


def test_a_worker_that_never_confirms_costs_the_chief_the_grace_less_the_save(tmp_path, caplog):
    chief, _ = make(tmp_path, "chief-0", "chief", peers=("worker-0",), grace_secs=10.2)
    chief.session_started(0)
    chief._step_secs = 1.0
    chief.signalled()
    chief.poll_once()
    run_steps(chief, chief.stop_at - 1)
    chief.before_step()  # Returns after 0.2 s: the grace (10.2 s) less SAVE_SECS (10 s).
    assert "worker-0 did not confirm the stop step" in caplog.text
    assert chief.step_done()


def test_training_that_ends_before_the_stop_step_finishes_without_a_restart(tmp_path):
    # The signal came 100 steps before the last step, the lead is 150 steps: both
    # sessions end at their last step (as max_steps ends them), short of the stop step.
    chief, chief_exits = make(tmp_path, "chief-0", "chief")
    worker, worker_exits = make(tmp_path, "worker-0", "worker")
    for task in (chief, worker):
        task.session_started(200)
    chief._step_secs = 0.01 / 1.5
    worker.signalled()
    chief.poll_once()
    worker.poll_once()
    assert chief.stop_at == worker.stop_at == 350
    for task in (chief, worker):
        assert run_steps(task, 100) is None
        task.session_ended(300)
        task.finished()
    assert chief_exits.calls == worker_exits.calls == []
    decision = json.loads((tmp_path / PREEMPTION_DIR / DECISION_FILE).read_text())
    assert decision["done"] is False, "no preemption checkpoint was made"


@pytest.mark.parametrize("step_secs, lead", [(0.01, 100), (1e-9, 10_000), (5.0, 2)])
def test_the_stop_step_leads_by_about_a_second_of_measured_steps(tmp_path, step_secs, lead):
    chief, _ = make(tmp_path, "chief-0", "chief")
    chief.session_started(0)
    chief.step_done()
    chief._step_secs = step_secs
    chief.signalled()
    chief.poll_once()
    assert chief.stop_at == 1 + lead


def test_a_restarted_job_ignores_the_previous_attempts_decision(tmp_path):
    (tmp_path / PREEMPTION_DIR).mkdir()
    stale = {"stop_at": 219, "requested_by": "worker-0", "done": True}
    (tmp_path / PREEMPTION_DIR / DECISION_FILE).write_text(json.dumps(stale))
    worker, exits = make(tmp_path, "worker-0", "worker")
    worker.session_started(219)
    worker.poll_once()
    assert worker.stop_at is None
    assert run_steps(worker, 50) is None
    worker.finished()
    assert exits.calls == []


@pytest.mark.parametrize("attempt, stops", [("attempt-1", True), ("attempt-2", False)])
def test_a_decision_counts_only_in_the_attempt_whose_chief_made_it(tmp_path, attempt, stops):
    # The previous attempt's chief decided a step past the checkpoint, which it never saved
    # (a peer died); a worker restarted before the new chief clears the file must not stop.
    (tmp_path / PREEMPTION_DIR).mkdir()
    decision = {"stop_at": 260, "requested_by": "chief-0", "done": False, "attempt": "attempt-1"}
    (tmp_path / PREEMPTION_DIR / DECISION_FILE).write_text(json.dumps(decision))
    worker, _ = make(tmp_path, "worker-0", "worker")
    worker.joined(attempt)
    worker.session_started(219)
    worker.poll_once()
    assert (worker.stop_at == 260) is stops
    assert run_steps(worker, 100) == (260 if stops else None)


def test_the_chief_clears_old_requests_when_its_session_starts(tmp_path):
    (tmp_path / PREEMPTION_DIR).mkdir()
    (tmp_path / PREEMPTION_DIR / "request-worker-0.json").write_text('{"role": "worker-0"}')
    chief, _ = make(tmp_path, "chief-0", "chief")
    chief.session_started(100)
    chief.poll_once()
    assert chief.stop_at is None
    assert os.listdir(tmp_path / PREEMPTION_DIR) == []


def test_the_evaluator_exits_at_once_without_stopping_training(tmp_path):
    evaluator, exits = make(tmp_path, "evaluator-0", "evaluator")
    evaluator.signalled()
    assert exits.codes == [exit_codes.PREEMPTED]
    assert "training goes on" in exits.calls[0][2]
    assert os.listdir(tmp_path / PREEMPTION_DIR) == []


def test_a_task_that_cannot_stop_exits_at_the_grace_deadline(tmp_path):
    worker, exits = make(tmp_path, "worker-0", "worker", grace_secs=0.0)
    worker.session_started(0)
    worker.signalled()
    worker.poll_once()
    assert exits.codes == [exit_codes.PREEMPTED]
    assert "did not stop within the preemption grace of 0 s" in exits.calls[0][2]


def test_without_lockstep_a_worker_stops_at_its_next_step(tmp_path):
    chief, _ = make(tmp_path, "chief-0", "chief", lockstep=False)
    worker, _ = make(tmp_path, "worker-0", "worker", lockstep=False)
    chief.session_started(0)
    worker.session_started(0)
    chief.signalled()
    chief.poll_once()
    worker.poll_once()
    assert worker.stop_at is not None
    assert run_steps(worker, 5) == 1


def test_a_ps_task_leaves_once_the_chief_has_saved(tmp_path):
    chief, _ = make(tmp_path, "chief-0", "chief", lockstep=False)
    ps, exits = make(tmp_path, "ps-0", "ps")
    chief.session_started(0)
    ps.signalled()
    chief.poll_once()
    ps.poll_once()
    assert exits.calls == [], "the chief has not saved yet"
    run_steps(chief, 1)
    chief.session_ended(57)  # the global step counts every worker's steps
    chief.finished()
    ps.poll_once()
    assert exits.codes == [exit_codes.PREEMPTED]
    assert "the chief saved global step 57" in exits.calls[0][2]


def test_a_preemption_stop_is_not_an_exhausted_input():
    exits = Exits()
    stopping = threading.Event()
    last = LastStep(300, "--train_steps=300", "")
    dog = Watchdog("worker-0", {}, 10, 10, last, exit_fn=exits, stopped_on_purpose=stopping.is_set)
    stopping.set()
    dog.training_ended(120)
    assert exits.calls == []


@pytest.mark.timeout(30)
def test_a_real_sigterm_is_caught_and_becomes_a_request(tmp_path):
    worker, exits = make(tmp_path, "worker-3", "worker")
    worker.install()
    try:
        worker.session_started(7)
        os.kill(os.getpid(), signal.SIGTERM)
        request = tmp_path / PREEMPTION_DIR / "request-worker-3.json"
        while not request.exists():
            threading.Event().wait(0.01)
    finally:
        worker.uninstall()
    assert json.loads(request.read_text()) == {"role": "worker-3", "step": 7, "signal": "SIGTERM"}
    assert worker.requested
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_task_signalled_before_its_session_starts_exits_at_once(tmp_path):
    worker, exits = make(tmp_path, "worker-0", "worker")
    worker.signalled()
    worker.poll_once()
    assert exits.codes == [exit_codes.PREEMPTED]
    assert "before its training session started: nothing to save" in exits.calls[0][2]


def test_the_speed_comes_from_the_polling_thread_skipping_the_first_step(tmp_path):
    chief, _ = make(tmp_path, "chief-0", "chief")
    chief.session_started(0)
    chief.poll_once()
    run_steps(chief, 1)
    chief.poll_once()
    assert chief._step_secs is None, "the first step (graph warm-up) is not timed"
    time.sleep(0.05)
    run_steps(chief, 10)
    chief.poll_once()
    assert 0.005 <= chief._step_secs < 1.0


def test_the_hook_fetches_nothing_per_step(tmp_path):
    preemption, exits = make(tmp_path, "chief-0", "chief")
    (hook,) = preemption.hooks()
    counting = CountingHook(hook)
    estimator = tf.estimator.Estimator(linear_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(ones_input_fn, hooks=[counting], max_steps=100)
    assert (counting.runs, counting.fetches) == (100, 0)
    assert preemption._step == 100
    preemption.finished()
    assert exits.calls == []


def test_a_real_estimator_stops_at_the_decided_step_and_saves_it(tmp_path):
    preemption, exits = make(tmp_path, "chief-0", "chief")
    (hook,) = preemption.hooks()

    def decide():
        preemption.signalled()
        preemption.poll_once()

    counting = CountingHook(hook, at=30, action=decide)
    estimator = tf.estimator.Estimator(linear_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(ones_input_fn, hooks=[counting], max_steps=1000)
    assert preemption.stop_at == 32, "two steps ahead: no speed measured yet"
    assert estimator.get_variable_value("global_step") == counting.runs == 32
    preemption.finished()
    assert exits.codes == [exit_codes.PREEMPTED]
    assert "at global step 32 with a checkpoint" in exits.calls[0][2]


def test_a_stop_that_failed_names_the_latest_checkpoint_not_the_step_reached(tmp_path):
    # A peer was lost while the job stopped: the chief reached step 57, but the
    # end-of-training save never ran; the latest checkpoint is still step 50.
    (tmp_path / "model.ckpt-50.index").write_bytes(b"")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-50"\n')
    chief, chief_exits = make(tmp_path, "chief-0", "chief")
    worker, worker_exits = make(tmp_path, "worker-0", "worker")
    for task in (chief, worker):
        task.joined("attempt-1")
        task.session_started(40)
    chief.signalled()
    chief.poll_once()
    worker.poll_once()
    run_steps(chief, 17)
    chief.finished(failed=True)
    worker.finished(failed=True)
    assert chief_exits.codes == worker_exits.codes == [exit_codes.PREEMPTED]
    assert (
        "training failed first; the latest checkpoint is at global step 50"
        in (chief_exits.calls[0][2])
    )
    assert "with a checkpoint of that step" not in chief_exits.calls[0][2]
    assert "training failed first" in worker_exits.calls[0][2]
    decision = json.loads((tmp_path / PREEMPTION_DIR / DECISION_FILE).read_text())
    assert decision["saved_step"] == 50


FULL_DISK = tf.errors.ResourceExhaustedError(
    None, None, "/runs/1/preemption/request-worker-3.json.tmp-7; No space left on device"
)


@pytest.mark.timeout(30)
def test_a_sigterm_on_a_full_disk_is_one_line_and_the_task_exits_155_at_the_grace(
    tmp_path, monkeypatch, caplog
):
    from estimator_dist.guards import preemption as module

    def full(path, data):
        raise FULL_DISK

    monkeypatch.setattr(module, "write_json", full)
    hooked = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)  # Python's traceback printer
    worker, exits = make(tmp_path, "worker-3", "worker", grace_secs=0.5)
    worker.install()
    try:
        worker.session_started(7)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 20
        while not exits.calls and time.monotonic() < deadline:
            threading.Event().wait(0.01)
    finally:
        worker.uninstall()
    assert hooked == [], "a thread of the package ended on a traceback"
    assert exits.codes == [exit_codes.PREEMPTED]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    said = [m for m in warned if "cannot write its preemption request" in m]
    assert said == [
        "estimator_dist: task worker-3 cannot write its preemption request "
        f"{tmp_path}/preemption/request-worker-3.json (ResourceExhaustedError: "
        "/runs/1/preemption/request-worker-3.json.tmp-7; No space left on device): the other "
        "tasks do not learn of the signal, and this task exits 155 after the grace of 0.5 s; "
        "the restart resumes from the latest checkpoint."
    ]


@pytest.mark.timeout(30)
def test_a_thread_of_the_package_that_raises_says_one_line_and_logs_its_traceback(
    monkeypatch, caplog
):
    from estimator_dist.guards.preemption import _one_line
    from estimator_dist.report.console import ConsoleFilter, LogFormatter

    def polls():
        raise FULL_DISK

    hooked = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    thread = threading.Thread(target=_one_line("chief-0", "preemption polling", polls))
    thread.start()
    thread.join(timeout=10)
    assert hooked == []
    formatter = LogFormatter()
    log = "\n".join(formatter.format(record) for record in caplog.records).splitlines()
    assert any(line.endswith("raise FULL_DISK") for line in log), "the traceback is in the log"
    shown = [line for line in map(ConsoleFilter(), log) if line is not None]
    assert shown == [
        "estimator_dist: task chief-0: its preemption polling thread ended on "
        "ResourceExhaustedError: /runs/1/preemption/request-worker-3.json.tmp-7; No space left "
        "on device (the traceback is in the task log)."
    ]
