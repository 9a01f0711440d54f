"""Watchdog and EvaluatorWatchdog: fail-fast decisions, with a fake clock and a fake exit.

`Watchdog.check()` is called directly with a clock the test moves by hand, and
`exit_fn` records its arguments instead of ending the process. Peers are real
loopback addresses: one held by a listening socket the test opens, one on a
free port nobody listens on.
"""

import logging
import re
import socket
import threading
from types import SimpleNamespace

import portpicker
import pytest
import tensorflow as tf
from tensorflow.python.training import monitored_session

from estimator_dist.base import exit_codes
from estimator_dist.guards import watchdog
from estimator_dist.guards.evaluator_watchdog import EvaluatorWatchdog
from estimator_dist.guards.watchdog import LastStep, Watchdog, unreachable
from estimator_dist.report import status
from estimator_dist.tf_runtime import patches
from tests.hooks import CountingHook
from tests.task_models import linear_model_fn

pytestmark = pytest.mark.timeout(60)

STARTUP = 10.0
STALL = 20.0


@pytest.fixture(autouse=True)
def restore_preemption_errors():
    original = monitored_session._PREEMPTION_ERRORS
    try:
        yield original
    finally:
        monitored_session._PREEMPTION_ERRORS = original


@pytest.fixture
def listening():
    """A loopback address that accepts connections, held for the test."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


@pytest.fixture
def refusing():
    """A loopback address nobody listens on."""
    return f"127.0.0.1:{portpicker.pick_unused_port()}"


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class Exits:
    """Records `exit_fn(role, code, cause)` calls; `event` is set at the first."""

    def __init__(self):
        self.calls = []
        self.event = threading.Event()

    def __call__(self, role, code, cause):
        self.calls.append((role, code, cause))
        self.event.set()

    @property
    def codes(self):
        return [code for _, code, _ in self.calls]


def last(step):
    """The last step as a job of named functions names it."""
    return LastStep(step, f"--train_steps={step}", "Make the input repeat (dataset.repeat()).")


def make_watchdog(peers=None, startup=STARTUP, stall=STALL, last_step=None):
    clock, exits = Clock(), Exits()
    step = None if last_step is None else last(last_step)
    dog = Watchdog("worker-1", peers or {}, startup, stall, step, exit_fn=exits, clock=clock)
    return dog, clock, exits


# --- start-up -----------------------------------------------------------------


def test_no_exit_before_the_startup_deadline(refusing):
    dog, clock, exits = make_watchdog({"chief-0": refusing})
    dog.check()
    clock.now += STARTUP
    dog.check()
    assert exits.calls == []


def test_startup_timeout_names_only_unreachable_peers(refusing, listening):
    dog, clock, exits = make_watchdog({"chief-0": refusing, "worker-0": listening})
    clock.now += STARTUP + 0.01
    dog.check()
    assert len(exits.calls) == 1
    role, code, cause = exits.calls[0]
    assert (role, code) == ("worker-1", exit_codes.CLUSTER_TIMEOUT)
    assert f"unreachable: chief-0 ({refusing})" in cause
    assert "worker-0" not in cause
    assert listening not in cause
    assert "start-up timeout of 10 s" in cause
    assert "--startup_timeout" in cause


def test_startup_timeout_with_every_peer_reachable_says_so(listening):
    dog, clock, exits = make_watchdog({"chief-0": listening})
    clock.now += STARTUP + 1
    dog.check()
    assert exits.codes == [exit_codes.CLUSTER_TIMEOUT]
    cause = exits.calls[0][2]
    assert "every peer accepts connections, but no step ran" in cause
    assert "unreachable:" not in cause


def test_startup_timeout_names_every_unreachable_peer(refusing):
    other = f"127.0.0.1:{portpicker.pick_unused_port()}"
    dog, clock, exits = make_watchdog({"chief-0": refusing, "worker-0": other})
    clock.now += STARTUP + 1
    dog.check()
    cause = exits.calls[0][2]
    assert f"unreachable: chief-0 ({refusing}), worker-0 ({other})" in cause


def test_start_restarts_the_startup_deadline():
    dog, clock, exits = make_watchdog()
    clock.now += 100
    dog.start()
    try:
        clock.now += STARTUP
        dog.check()
        assert exits.calls == []
        clock.now += 0.01
        dog.check()
        assert exits.codes[-1] == exit_codes.CLUSTER_TIMEOUT
    finally:
        dog.stop()


def test_started_thread_calls_exit_after_startup_timeout():
    exits = Exits()
    dog = Watchdog("chief-0", {}, startup_timeout=0.1, stall_timeout=60, exit_fn=exits)
    dog.start()
    try:
        assert exits.event.wait(timeout=10), "the watchdog thread never called exit_fn"
    finally:
        dog.stop()
    assert exits.calls[0][:2] == ("chief-0", exit_codes.CLUSTER_TIMEOUT)


def test_progress_ends_the_startup_deadline(refusing):
    dog, clock, exits = make_watchdog({"chief-0": refusing}, startup=10, stall=100)
    clock.now += 5
    dog.progress(1)
    clock.now += 50
    dog.check()
    assert exits.calls == []


# --- stall --------------------------------------------------------------------


def test_stall_after_progress_names_the_step():
    dog, clock, exits = make_watchdog()
    dog.progress(42)
    assert dog.step == 42
    clock.now += STALL
    dog.check()
    assert exits.calls == []
    clock.now += 0.5
    dog.check()
    assert len(exits.calls) == 1
    role, code, cause = exits.calls[0]
    assert (role, code) == ("worker-1", exit_codes.STALLED)
    assert "the global step stayed at 42" in cause
    assert "stall timeout 20 s" in cause
    assert "--stall_timeout" in cause


def test_new_step_resets_the_stall_timer():
    dog, clock, exits = make_watchdog()
    dog.progress(1)
    clock.now += 15
    dog.progress(2)
    clock.now += 15  # 30 s after step 1, 15 s after step 2
    dog.check()
    assert exits.calls == []
    clock.now += 5.5  # 20.5 s after step 2
    dog.check()
    assert exits.codes == [exit_codes.STALLED]
    assert "stayed at 2" in exits.calls[0][2]


def test_a_completed_step_that_leaves_the_global_step_where_it_was_is_progress():
    # A train_op that never steps the global step: its steps still end their collectives.
    dog, clock, exits = make_watchdog()
    dog.progress(7)
    clock.now += 15
    dog.progress(7)
    clock.now += 15  # 30 s after step 7 first ran, 15 s after the last completed step
    dog.check()
    assert exits.calls == []
    clock.now += 5.5  # 20.5 s without a completed step
    dog.check()
    assert exits.codes == [exit_codes.STALLED]
    assert "stayed at 7" in exits.calls[0][2]


def test_step_is_none_before_progress():
    dog, _, _ = make_watchdog()
    assert dog.step is None


# --- sessions -----------------------------------------------------------------


def test_sessions_created_before_the_first_step_are_fine():
    dog, _, exits = make_watchdog()
    dog.session_created()
    dog.session_created()
    assert exits.calls == []
    dog.progress(0)
    assert exits.calls == []


def test_session_created_after_a_step_is_session_recovery():
    dog, _, exits = make_watchdog()
    dog.session_created()
    dog.progress(3)
    assert exits.calls == []
    dog.session_created()
    assert len(exits.calls) == 1
    role, code, cause = exits.calls[0]
    assert (role, code) == ("worker-1", exit_codes.SESSION_RECOVERY)
    assert "step 3" in cause


# --- fail-fast arming ---------------------------------------------------------


@pytest.fixture
def patched():
    """The package's TensorFlow patches, as the driver installs them (fail-fast needs them)."""
    already = patches.installed()
    patches.install()
    try:
        yield
    finally:
        if not already:
            patches.uninstall()


def test_first_progress_arms_fail_fast(restore_preemption_errors, patched):
    assert restore_preemption_errors != ()
    dog, _, _ = make_watchdog()
    dog.session_created()
    assert monitored_session._PREEMPTION_ERRORS == restore_preemption_errors
    dog.progress(1)
    assert monitored_session._PREEMPTION_ERRORS == ()


def test_only_the_first_progress_arms_fail_fast(monkeypatch):
    armed = []
    monkeypatch.setattr(watchdog, "arm_fail_fast", lambda: armed.append(True))
    dog, _, _ = make_watchdog()
    dog.progress(1)
    dog.progress(2)
    dog.progress(2)
    assert armed == [True]


def test_first_progress_logs_the_first_step_and_tells_the_launcher(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    sent = []
    monkeypatch.setattr(status, "emit", sent.append)
    dog, _, _ = make_watchdog()
    dog.progress(5)
    dog.progress(6)
    marked = [r.getMessage() for r in caplog.records if "first step" in r.getMessage()]
    assert marked == ["estimator_dist: task worker-1 ran its first step (global step 5)."]
    assert sent == [status.FirstStep(step=5)]


# --- training loop ending early ----------------------------------------------


def test_training_ending_before_the_last_step_is_input_exhausted_and_not_retried():
    dog, _, exits = make_watchdog(last_step=300)
    dog.training_ended(20)
    assert exits.codes == [exit_codes.INPUT_EXHAUSTED]
    assert not exit_codes.is_retryable(exit_codes.INPUT_EXHAUSTED)
    cause = exits.calls[0][2]
    assert "ended at global step 20, before --train_steps=300" in cause
    assert "dataset.repeat()" in cause
    assert "not retried" in cause


def test_a_single_process_whose_input_ends_early_only_warns(caplog):
    exits = Exits()
    dog = Watchdog("local", {}, STARTUP, STALL, last(300), exit_fn=exits, clock=Clock(), alone=True)
    dog.training_ended(20)
    assert exits.calls == []
    assert "Training ended at global step 20, before --train_steps=300" in caplog.text


def test_evaluation_batches_keep_a_single_process_from_stalling():
    clock, exits = Clock(), Exits()
    dog = Watchdog("local", {}, STARTUP, STALL, last(300), exit_fn=exits, clock=clock, alone=True)
    dog.progress(5)
    hook = dog.eval_hook()
    for _ in range(3):
        clock.now += STALL * 0.9
        hook.after_run(run_context=None, run_values=None)
        dog.check()
    assert exits.calls == []
    clock.now += STALL + 0.01
    dog.check()
    assert exits.codes == [exit_codes.STALLED]
    assert "training or evaluation is stuck" in exits.calls[0][2]


def _alone():
    clock, exits = Clock(), Exits()
    dog = Watchdog("local", {}, STARTUP, STALL, last(300), exit_fn=exits, clock=clock, alone=True)
    return dog, clock, exits


def _begin_evaluation(hook, checkpoint_step):
    """Starts an evaluation as Estimator does: a graph with the restored global step."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.create_global_step()
        hook.begin()
        with tf.compat.v1.Session() as session:
            session.run(step.assign(checkpoint_step))
            hook.after_create_session(session, coord=None)


def test_a_long_single_process_evaluation_is_warned_at_1_2_4_stall_timeouts_not_ended(caplog):
    dog, clock, exits = _alone()
    dog.progress(300)
    hook = dog.eval_hook()
    _begin_evaluation(hook, 300)
    with caplog.at_level(logging.WARNING):
        for _ in range(8 * 4):  # 8 stall timeouts of reading, checked 4 times each
            clock.now += STALL / 4
            for _ in range(5):
                hook.after_run(run_context=None, run_values=None)
            dog.check()
    warnings = [r.getMessage() for r in caplog.records if "has run" in r.getMessage()]
    assert [w.split(" has run ")[1].split(" s ")[0] for w in warnings] == ["25", "45", "85"]
    assert (
        "evaluation of the checkpoint of global step 300 has run 25 s and read 25 batches"
        in (warnings[0])
    )
    assert "pass --eval_steps to bound each evaluation" in warnings[0]
    assert exits.calls == [], "a long evaluation is not ended"


def test_an_evaluation_that_ends_within_the_stall_timeout_is_fine():
    dog, clock, exits = _alone()
    dog.progress(100)
    hook = dog.eval_hook()
    for _ in range(3):  # Three evaluations of 0.9 x the stall timeout each, training between.
        _begin_evaluation(hook, dog.step)
        clock.now += STALL * 0.9
        hook.after_run(run_context=None, run_values=None)
        dog.check()
        hook.end(session=None)
        dog.progress(dog.step + 100)
    assert exits.calls == []


def test_an_evaluation_that_stopped_reading_is_a_stall_not_an_unending_input():
    dog, clock, exits = _alone()
    dog.progress(300)
    hook = dog.eval_hook()
    _begin_evaluation(hook, 300)
    hook.after_run(run_context=None, run_values=None)
    clock.now += STALL * 0.5
    dog.check()
    clock.now += STALL * 0.6  # No batch since: stuck, not reading.
    dog.check()
    assert exits.calls == []
    clock.now += STALL * 0.5
    dog.check()
    assert exits.codes == [exit_codes.STALLED]


@pytest.mark.parametrize("last_step, step", [(300, 300), (300, 301), (None, 20)])
def test_training_ending_at_the_last_step_or_unbounded_is_fine(last_step, step):
    dog, _, exits = make_watchdog(last_step=last_step)
    dog.training_ended(step)
    assert exits.calls == []


def _finite_input():
    features = tf.data.Dataset.from_tensor_slices(tf.ones([5, 1]))
    return tf.data.Dataset.zip((features, features)).batch(1)


@pytest.mark.parametrize("max_steps, expected", [(20, [("worker-1", 6, 5)]), (5, [])])
def test_hook_reports_an_input_that_runs_out_before_the_last_step(tmp_path, max_steps, expected):
    # A real Estimator: MonitoredSession must call the hook's end() when the
    # input runs out, while the session is still open.
    exits = Exits()
    dog = Watchdog("worker-1", {}, STARTUP, STALL, last_step=last(max_steps), exit_fn=exits)
    estimator = tf.estimator.Estimator(linear_model_fn, model_dir=str(tmp_path))
    estimator.train(_finite_input, hooks=[dog.hook()], max_steps=max_steps)
    assert [
        (role, code, int(re.search(r"step (\d+),", cause)[1])) for role, code, cause in exits.calls
    ] == expected


# --- session creation and the first step (exit 157) -----------------------------


def in_session(peers=None, startup=600.0):
    """A watchdog whose graph is built: session creation began at the clock's time."""
    dog, clock, exits = make_watchdog(peers, startup=startup)
    clock.now += 50  # Imports and graph building count against the start-up timeout only.
    dog.session_begins()
    return dog, clock, exits


def test_session_creation_past_the_stall_timeout_is_session_hung_naming_the_phase(listening):
    dog, clock, exits = in_session({"chief-0": listening})
    clock.now += STALL - 0.01
    dog.check()
    assert exits.calls == []
    clock.now += 0.02
    dog.check()
    assert exits.codes == [exit_codes.SESSION_HUNG]
    assert exit_codes.is_retryable(exit_codes.SESSION_HUNG)
    cause = exits.calls[0][2]
    assert cause.startswith(
        "session creation (restore or init_op, local_init_op, the hooks' after_create_session) "
        "did not end within 20 s (--stall_timeout) after its graph was built (every peer "
        "accepts connections)."
    ), cause
    assert "restart the whole job from its latest checkpoint" in cause


def test_a_first_step_that_does_not_end_is_session_hung_naming_the_unreachable_peer(refusing):
    dog, clock, exits = in_session({"chief-0": refusing})
    clock.now += 5
    dog.session_created(300)  # Restored the checkpoint of step 300.
    dog.first_step_runs()  # The hooks' after_create_session are done: the first step runs.
    clock.now += STALL - 4
    dog.check()
    assert exits.codes == [exit_codes.SESSION_HUNG]
    cause = exits.calls[0][2]
    assert cause.startswith(
        "the session was ready 16 s ago, but the first step (which meets every peer in its "
        f"first collective) did not end within 20 s (--stall_timeout) after its graph was "
        f"built, at global step 300 (unreachable: chief-0 ({refusing}))."
    ), cause


def test_a_session_hung_before_its_step_was_read_names_the_latest_checkpoint_step(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-300"\n')
    (tmp_path / "model.ckpt-300.index").write_bytes(b"")
    clock, exits = Clock(), Exits()
    dog = Watchdog("worker-1", {}, 600, STALL, exit_fn=exits, clock=clock, model_dir=str(tmp_path))
    dog.session_begins()  # Hangs in the restore: the session never reports its step.
    clock.now += STALL + 1
    dog.check()
    assert exits.codes == [exit_codes.SESSION_HUNG]
    assert "after its graph was built, at global step 300 (" in exits.calls[0][2]


def test_the_session_bound_counts_from_the_graph_and_ends_at_the_first_step():
    dog, clock, exits = make_watchdog(startup=600.0)
    clock.now += 100  # A long graph build is not session creation.
    dog.check()
    dog.session_begins()
    clock.now += STALL * 0.9
    dog.progress(0)
    clock.now += STALL * 0.9  # Past the session bound, but the first step came.
    dog.check()
    assert exits.calls == []
    dog.session_begins()  # A later session (after a step) starts no session bound.
    clock.now += STALL * 0.2
    dog.progress(1)
    clock.now += STALL * 0.9
    dog.check()
    assert exits.calls == []


def test_a_start_up_timeout_shorter_than_the_session_bound_still_ends_start_up():
    dog, clock, exits = in_session(startup=60.0)
    clock.now += 10.01  # 60.01 s from start, 10.01 s into session creation.
    dog.check()
    assert exits.codes == [exit_codes.CLUSTER_TIMEOUT]


def session_lines(caplog):
    return [r.getMessage() for r in caplog.records if "in session creation" in r.getMessage()]


@pytest.mark.parametrize("reachable", [False, True])
def test_session_creation_says_every_30_s_which_peers_it_cannot_reach(
    caplog, refusing, listening, reachable
):
    peer = listening if reachable else refusing
    clock, exits = Clock(), Exits()
    dog = Watchdog("worker-1", {"chief-0": peer}, 600, 100, exit_fn=exits, clock=clock)
    dog.session_begins()
    lines_at = {}
    with caplog.at_level(logging.INFO):
        for now in (10, 29.9, 30, 45, 59.9, 60, 75, 90.5):
            clock.now = 1000 + now
            dog.check()
            lines_at[now] = len(session_lines(caplog))
    assert lines_at == {10: 0, 29.9: 0, 30: 1, 45: 1, 59.9: 1, 60: 2, 75: 2, 90.5: 3}
    assert exits.calls == []
    if reachable:
        expected = (
            "estimator_dist: task worker-1 in session creation and its first step for {} s of "
            "at most 100 s; every peer accepts connections"
        )
    else:
        expected = (
            f"estimator_dist: task worker-1 waiting for chief-0 ({refusing}) in session "
            "creation for {} s of at most 100 s"
        )
    assert session_lines(caplog) == [expected.format(s) for s in (30, 60, 90)]


# --- the end of training (exit 158) --------------------------------------------


def test_no_progress_after_training_ended_is_final_phase_hung_from_the_end_not_the_last_step():
    dog, clock, exits = make_watchdog(last_step=300)
    dog.progress(290)
    clock.now += STALL * 0.75
    dog.training_ended(300)
    clock.now += STALL * 0.75  # 1.5 stall timeouts after the last fetched step: no stall.
    dog.check()
    assert exits.calls == []
    clock.now += STALL * 0.25 + 0.01
    dog.check()
    assert exits.codes == [exit_codes.FINAL_PHASE_HUNG]
    assert exit_codes.is_retryable(exit_codes.FINAL_PHASE_HUNG)
    assert exits.calls[0][2] == (
        "the end of training made no progress for 20 s (stall timeout 20 s) after the training "
        "loop ended at global step 300: saving the final checkpoint or closing the session, "
        "which waits for the peers. A hung collective or a frozen peer does not end by itself; "
        "restart the job from its latest checkpoint. Raise --stall_timeout if this phase is "
        "this slow on purpose."
    )


def test_a_final_evaluation_reading_batches_is_progress_and_one_that_stops_is_named():
    dog, clock, exits = _alone()
    dog.progress(290)
    dog.training_ended(300)
    hook = dog.eval_hook()
    _begin_evaluation(hook, 300)
    for _ in range(4):
        clock.now += STALL * 0.9
        hook.after_run(run_context=None, run_values=None)
        dog.check()
    assert exits.calls == []
    clock.now += STALL + 0.01
    dog.check()
    assert exits.codes == [exit_codes.FINAL_PHASE_HUNG]
    assert (
        "after the training loop ended at global step 300: the final evaluation of the "
        "checkpoint of step 300 has read 4 batches, none since" in exits.calls[0][2]
    )


def test_a_hang_after_the_final_evaluation_is_named_the_export():
    dog, clock, exits = _alone()
    hook = dog.eval_hook()
    dog.progress(100)
    _begin_evaluation(hook, 100)  # An evaluation during training does not count.
    hook.end(session=None)
    dog.training_ended(300)
    clock.now += STALL + 0.01
    dog.check()
    assert "the global step" not in exits.calls[0][2]
    assert "saving the final checkpoint or closing the session." in exits.calls[0][2]
    exits.calls.clear()
    _begin_evaluation(hook, 300)
    hook.end(session=None)
    clock.now += STALL + 0.01
    dog.check()
    assert exits.codes == [exit_codes.FINAL_PHASE_HUNG]
    assert "the final evaluation ended; the export after it" in exits.calls[0][2]


# --- hook ---------------------------------------------------------------------


def test_hook_marks_the_session_phases_in_a_real_estimator(tmp_path):
    # A hook that "hangs" in after_create_session moves the clock: the session bound counts
    # from the graph's completion to the first step's start, and the first step ends it.
    clock, exits = Clock(), Exits()
    dog = Watchdog("worker-1", {}, 600, STALL, exit_fn=exits, clock=clock)
    seen = {}

    class Hang(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            seen["began"] = dog._session_began

        def after_create_session(self, session, coord):
            clock.now += STALL + 1
            dog.check()

    estimator = tf.estimator.Estimator(linear_model_fn, model_dir=str(tmp_path))
    estimator.train(_repeated_input, hooks=[dog.hook(), Hang()], max_steps=3)
    assert seen["began"] == 1000.0
    assert exits.codes == [exit_codes.SESSION_HUNG]
    assert exits.calls[0][2].startswith("session creation (restore or init_op")
    assert "after its graph was built, at global step 0 (" in exits.calls[0][2]
    assert dog._first_run == 1000.0 + STALL + 1


def test_hook_reports_sessions_and_steps():
    dog, _, exits = make_watchdog()
    hook = dog.hook()
    hook.after_create_session(session=None, coord=None)
    hook.after_run(run_context=None, run_values=SimpleNamespace(results=9))
    assert dog.step == 9
    hook.after_create_session(session=None, coord=None)
    assert exits.codes == [exit_codes.SESSION_RECOVERY]


def test_a_check_asks_the_hook_for_one_fresh_step():
    dog, clock, _ = make_watchdog()
    hook = dog.hook()
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook.begin()
    assert hook.before_run(None) is not None, "the first step is fetched"
    hook.after_run(None, SimpleNamespace(results=1))
    assert hook.before_run(None) is None
    hook.after_run(None, SimpleNamespace(results=None))
    assert dog.step == 1
    clock.now += 1
    dog.check()
    assert hook.before_run(None) is not None
    hook.after_run(None, SimpleNamespace(results=40))
    assert (dog.step, hook.before_run(None)) == (40, None)


def test_a_slow_step_in_flight_when_the_check_asks_counts_as_progress():
    # Steps of 0.6 x the stall timeout: the step running at a check ends before
    # the next one fetches, and the watchdog must not wait for that fetch.
    dog, clock, exits = make_watchdog()
    hook = dog.hook()
    dog.progress(1)
    for _ in range(5):
        clock.now += STALL * 0.6
        dog.check()
        hook.after_run(None, SimpleNamespace(results=None))  # the step in flight ends
        clock.now += STALL * 0.6
        dog.check()
        hook.after_run(None, SimpleNamespace(results=dog.step + 1))  # the next one fetched
    assert exits.calls == []
    clock.now += STALL + 0.01
    dog.check()
    assert exits.codes == [exit_codes.STALLED]


def _repeated_input():
    return _finite_input().repeat()


def test_the_hook_fetches_the_global_step_once_in_100_steps_not_every_step(tmp_path):
    # A real Estimator: one fetch (the first step) in 100 steps, and one more
    # for each check of the watchdog's thread (here by hand every 40 steps).
    exits = Exits()
    dog = Watchdog("worker-1", {}, STARTUP, STALL, last_step=last(100), exit_fn=exits)
    counting = CountingHook(dog.hook(), every=40, action=dog.check)
    estimator = tf.estimator.Estimator(linear_model_fn, model_dir=str(tmp_path))
    estimator.train(_repeated_input, hooks=[counting], max_steps=100)
    assert (counting.runs, counting.fetches) == (100, 3)
    assert dog.step in (79, 80), "the step of the last fetch, at run 80"
    assert exits.calls == []


# --- unreachable and fail -----------------------------------------------------


def test_unreachable_returns_only_refusing_peers(refusing, listening):
    assert unreachable({"chief-0": refusing, "worker-0": listening}) == [f"chief-0 ({refusing})"]
    assert unreachable({"worker-0": listening}) == []
    assert unreachable({}) == []


def test_unreachable_accepts_bracketed_ipv6():
    try:
        server = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback")
    with server:
        address = f"[::1]:{server.getsockname()[1]}"
        assert unreachable({"chief-0": address}) == []


def test_fail_writes_one_line_tells_the_launcher_and_exits_with_the_code(monkeypatch, capsys):
    exited, sent = [], []
    monkeypatch.setattr(watchdog.os, "_exit", exited.append)
    monkeypatch.setattr(status, "emit", sent.append)
    watchdog.fail("worker-2", exit_codes.STALLED, "the step stayed at 4")
    assert exited == [exit_codes.STALLED]
    stalled = status.Exiting(exit_codes.STALLED, "the step stayed at 4", reason="STALLED")
    assert sent == [stalled]
    err = capsys.readouterr().err
    assert err == "estimator_dist: task worker-2 failed (exit 152): the step stayed at 4\n"


# --- EvaluatorWatchdog ----------------------------------------------------------


def wait_for_exit(dog, exits):
    """Runs the evaluator watchdog until it calls exit_fn (at most 10 s)."""
    dog.start()
    try:
        assert exits.event.wait(timeout=10), "the evaluator watchdog never called exit_fn"
    finally:
        dog.stop()


def test_evaluator_watchdog_exits_without_checkpoints_and_chief(tmp_path, refusing):
    exits = Exits()
    dog = EvaluatorWatchdog(
        "evaluator-0", str(tmp_path), {"chief-0": refusing}, stall_timeout=0.2, exit_fn=exits
    )
    wait_for_exit(dog, exits)
    role, code, cause = exits.calls[0]
    assert (role, code) == ("evaluator-0", exit_codes.STALLED)
    assert str(tmp_path) in cause
    assert refusing in cause
    assert "latest: None" in cause


def test_evaluator_watchdog_tells_an_unending_evaluation_from_a_stall(tmp_path, refusing):
    exits = Exits()
    dog = EvaluatorWatchdog(
        "evaluator-0", str(tmp_path), {"chief-0": refusing}, stall_timeout=0.2, exit_fn=exits
    )
    hook = dog.eval_hook()
    hook.after_create_session(session=None, coord=None)
    for _ in range(7):
        hook.after_run(run_context=None, run_values=None)
    wait_for_exit(dog, exits)
    role, code, cause = exits.calls[0]
    assert (role, code) == ("evaluator-0", exit_codes.EVAL_UNENDING)
    assert "read 7 batches without ending" in cause
    assert "--eval_steps" in cause


def test_evaluator_watchdog_after_an_evaluation_ended_reports_a_stall(tmp_path, refusing):
    exits = Exits()
    dog = EvaluatorWatchdog(
        "evaluator-0", str(tmp_path), {"chief-0": refusing}, stall_timeout=0.2, exit_fn=exits
    )
    hook = dog.eval_hook()
    hook.after_create_session(session=None, coord=None)
    hook.end(session=None)
    wait_for_exit(dog, exits)
    assert exits.codes[0] == exit_codes.STALLED
    assert "with no evaluation running" in exits.calls[0][2]


def test_evaluator_watchdog_names_the_latest_checkpoint(tmp_path, refusing):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-7"\n')
    (tmp_path / "model.ckpt-7.index").write_bytes(b"")
    exits = Exits()
    dog = EvaluatorWatchdog(
        "evaluator-0", str(tmp_path), {"chief-0": refusing}, 0.2, last_step=10, exit_fn=exits
    )
    dog.eval_hook().evaluated = 7  # It evaluated step 7 and waits for a newer checkpoint.
    wait_for_exit(dog, exits)
    assert exits.calls[0][1] == exit_codes.STALLED
    assert f"latest: {tmp_path / 'model.ckpt-7'}" in exits.calls[0][2]
    assert "training has not reached its last step 10" in exits.calls[0][2]
    assert "failed or was stopped before its last step" in exits.calls[0][2]


def test_evaluator_watchdog_waits_while_the_chief_is_reachable(tmp_path, listening):
    exits = Exits()
    dog = EvaluatorWatchdog(
        "evaluator-0", str(tmp_path), {"chief-0": listening}, stall_timeout=0.2, exit_fn=exits
    )
    dog.start()
    try:
        assert not exits.event.wait(timeout=1.5), exits.calls
    finally:
        dog.stop()


def test_evaluator_watchdog_never_judges_a_sleeping_evaluator_nor_one_past_the_last_step(
    tmp_path, refusing
):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10"\n')
    (tmp_path / "model.ckpt-10.index").write_bytes(b"")
    exits = Exits()
    dog = EvaluatorWatchdog(
        "evaluator-0", str(tmp_path), {"chief-0": refusing}, 0.2, last_step=10, exit_fn=exits
    )
    dog.start()
    try:
        # The final checkpoint exists and the chief is gone: the evaluator evaluates it, and
        # exits as TensorFlow does; no stall however long no checkpoint comes.
        assert not exits.event.wait(timeout=1.5), exits.calls
        assert dog.finished()
    finally:
        dog.stop()


def test_a_stall_names_the_latest_checkpoints_step_when_the_task_saw_an_older_one(tmp_path):
    # The task saw step 0, but the job had checkpointed step 300: the message says 300.
    (tmp_path / "checkpoint").write_text(
        f'model_checkpoint_path: "{tmp_path}/model.ckpt-300"\n'
        f'all_model_checkpoint_paths: "{tmp_path}/model.ckpt-300"\n'
    )
    (tmp_path / "model.ckpt-300.index").write_bytes(b"")
    clock, exits = Clock(), Exits()
    dog = Watchdog(
        "worker-1", {}, STARTUP, STALL, exit_fn=exits, clock=clock, model_dir=str(tmp_path)
    )
    dog.progress(0)
    clock.now += STALL + 0.5
    dog.check()
    assert exits.codes == [exit_codes.STALLED]
    assert "the global step stayed at 300 for 20 s" in exits.calls[0][2]
