"""Start-up phases add up from the process's start, and are logged once."""

import time

import tensorflow as tf

from estimator_dist.guards import startup
from estimator_dist.guards.startup import Startup, process_started


def test_the_process_started_before_this_module_was_imported():
    # The interpreter and pytest ran before the import; /proc tells when.
    started = process_started()
    assert started < startup._IMPORTED <= time.monotonic()


def test_phases_take_the_time_since_the_previous_mark_and_add_up():
    now = iter([101.0, 103.5, 104.0])
    record = Startup("worker-1", started=100.0, clock=lambda: next(now))
    for phase in ("imports", "pre-flight", "graph"):
        record.mark(phase)
    assert record.phases == {"imports": 1.0, "pre-flight": 2.5, "graph": 0.5}
    assert record.total == 4.0
    assert record.describe() == (
        "estimator_dist: task worker-1 start-up 4.0 s: imports 1.0 s, pre-flight 2.5 s, graph 0.5 s"
    )


def test_the_hook_marks_estimator_phases_and_logs_once(monkeypatch):
    logged = []
    monkeypatch.setattr(startup.logging, "info", lambda fmt, line: logged.append(line))
    record = Startup("chief-0")
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredSession(hooks=[record.hook()]) as session:
            for _ in range(3):
                session.run(train_op)
    assert list(record.phases) == ["graph", "session", "first step"]
    assert len(logged) == 1 and logged[0].startswith("estimator_dist: task chief-0 start-up")
