"""A program's hook asks training to stop: at once where every task stops alike, else agreed."""

import types

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.guards.stop_requests import ShortestInputHook, StopRouter
from estimator_dist.tf_runtime import patches

pytestmark = pytest.mark.usefixtures("patches_installed")


class Channel:
    """Stands in for the preemption channel: records the stops asked of the chief."""

    enabled = True
    ended_at = 41

    def __init__(self):
        self.requests = []

    def request_stop(self, step, reason):
        self.requests.append((step, reason))


class AskingHook(tf.compat.v1.train.SessionRunHook):
    """A hook of a program's own that asks to stop after every step."""

    def after_run(self, run_context, run_values):
        run_context.request_stop()


def _context(session):
    return tf.compat.v1.train.SessionRunContext(original_args=None, session=session)


def _in_training(router, session):
    router.hook().before_run(_context(session))


def test_on_a_cluster_a_hook_of_the_program_asks_the_chief_instead_of_stopping():
    channel, session = Channel(), object()
    router = StopRouter(distributed=True, preemption=channel)
    _in_training(router, session)
    context = _context(session)
    patches.route_stop_requests(router)
    try:
        AskingHook().after_run(context, None)
        AskingHook().after_run(context, None)  # Asked once, whatever the hook repeats.
    finally:
        patches.route_stop_requests(None)
    assert not context.stop_requested
    assert channel.requests == [(41, "the program's AskingHook asked to stop")]
    assert router.stopped_by is None


def test_a_stop_at_step_hook_stops_at_once_every_task_stopping_at_the_same_step():
    channel = Channel()
    session = types.SimpleNamespace(run=lambda tensor: 2)  # The global step it reads.
    router = StopRouter(distributed=True, preemption=channel)
    _in_training(router, session)
    hook = tf.compat.v1.train.StopAtStepHook(last_step=2)
    hook._global_step_tensor = None
    context = _context(session)
    patches.route_stop_requests(router)
    try:
        hook.after_run(context, types.SimpleNamespace(results=2))
    finally:
        patches.route_stop_requests(None)
    assert context.stop_requested and router.stopped_by == "StopAtStepHook"
    assert channel.requests == []


def test_an_evaluations_requests_and_the_packages_own_stop_as_tensorflow_would():
    channel, training, evaluation = Channel(), object(), object()
    router = StopRouter(distributed=True, preemption=channel)
    _in_training(router, training)
    assert router(AskingHook(), _context(evaluation)) is True
    assert router(router.hook(), _context(training)) is True  # A hook of the package.
    assert channel.requests == [] and router.stopped_by is None


def test_one_process_stops_where_the_programs_hook_asks_and_knows_why(tmp_path):
    def input_fn():
        x = np.arange(12, dtype=np.float32).reshape(6, 2)
        return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(2)

    def model_fn(features, labels, mode):
        loss = tf.compat.v1.losses.mean_squared_error(
            labels, tf.compat.v1.layers.dense(features, 1)
        )
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, step)
        hooks = [tf.compat.v1.train.StopAtStepHook(num_steps=2)]
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=hooks)

    router = StopRouter(distributed=False, preemption=None)
    patches.route_stop_requests(router)
    try:
        estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))
        estimator.train(input_fn, hooks=[router.hook()])
    finally:
        patches.route_stop_requests(None)
    assert router.stopped_by == "StopAtStepHook"
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-2")


def test_without_a_router_a_request_stops_as_tensorflow_does():
    context = _context(object())
    AskingHook().after_run(context, None)
    assert context.stop_requested


@pytest.mark.parametrize("steps_the_global_step", [False, True])
def test_the_shortest_input_hook_stops_after_its_batches_whatever_the_global_step(
    steps_the_global_step,
):
    """Each task stops after the shortest input's batches, counted in its own loop's steps."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        weight = tf.Variable(0.0)
        train_op = weight.assign_add(1.0)
        if steps_the_global_step:
            train_op = tf.group(train_op, step.assign_add(1))
        hook = ShortestInputHook(5)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            runs = 0
            while not session.should_stop():
                session.run(train_op)
                runs += 1
                assert runs <= 5, "the hook did not stop the loop"
    assert runs == 5 and hook.reached
    assert hook.ended_at == (5 if steps_the_global_step else 0)
