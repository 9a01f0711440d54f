"""A program's hook asks training to stop: the program decides, every task follows.

Programs end training with hooks of their own: a `StopAtStepHook` in
`TrainSpec(hooks=...)` or in the model_fn's `EstimatorSpec(training_hooks=...)`,
or any hook that calls `run_context.request_stop()`. In one process that ends
training, and TensorFlow evaluates the last checkpoint. On a cluster every
task must stop at the same step, or the others wait in their collectives
forever, and the package must know the stop was asked for, not an input that
ran out (exit 6).

`StopRouter` sees each request of the task's training session before it takes
effect (`estimator_dist.tf_runtime.patches.route_stop_requests`):

* a `StopAtStepHook` stops at a global step that is the same on every task, so
  each task stops at once, as in one process, at that step;
* any other hook's request becomes a request to the chief through the
  preemption channel (`estimator_dist.guards.preemption`): the chief picks one
  step a little ahead, every task stops after it, the chief checkpoints it;
* the package's own hooks, and every request in another session (an
  evaluation's), stop as TensorFlow would.

Either way the job ends with exit 0, and the chief records where training
ended and why (`estimator_dist.task.early_stopping.record_stop`), so the
evaluator evaluates that step and ends.

`ShortestInputHook` is the package's own stop for a `train()` segment that ends
where its input ends: every task stops after the batches of the shortest
training input, counted in steps of its own loop, so the tasks stop together
even when the program's train_op never steps the global step.

>>> router = StopRouter(distributed=False, preemption=None)
>>> router.stopped_by is None
True
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
from absl import logging

from estimator_dist.guards.preemption import Preemption
from estimator_dist.tf_runtime.hooks import stops_every_task_alike

#: The package's own modules, whose hooks' requests are the package's decisions.
_OWN = ("estimator_dist.", "input_fns.", "model_fns.", "run_config.")


class StopRouter:
    """Decides what a hook's request to stop does on this task.

    Args:
      distributed: This task is one of a cluster (else one process: stop).
      preemption: The task's preemption channel, which agrees on one stop
        step with the chief; None or disabled: stop at once.

    Attributes:
      stopped_by: The hook whose request stopped training at once, as
        `ClassName`, or None.
    """

    def __init__(self, distributed: bool, preemption: Optional[Preemption]) -> None:
        self._distributed = distributed
        self._preemption = preemption
        self._session: Any = None
        self._asked: Optional[str] = None
        self.stopped_by: Optional[str] = None

    def hook(self) -> tf.compat.v1.train.SessionRunHook:
        """The hook that tells the router which session is this task's training."""
        return _TrainingSessionHook(self)

    def __call__(self, hook: Any, run_context: Any) -> bool:
        """Whether `hook`'s request stops the session now (`patches.route_stop_requests`)."""
        if self._session is None or run_context.session is not self._session:
            return True  # An evaluation's session, or none of ours.
        module = type(hook).__module__ + "."
        if hook is not None and module.startswith(_OWN):
            return True
        name = type(hook).__name__ if hook is not None else "a hook"
        channel = self._preemption is not None and self._preemption.enabled
        if not self._distributed or stops_every_task_alike(hook) or not channel:
            if self.stopped_by is None:
                self.stopped_by = name
            return True
        if self._asked is None:
            self._asked = name
            step = self._preemption.ended_at or 0
            logging.info(
                "estimator_dist: the program's %s asks to stop training at global step %d; "
                "every task stops at one step a little ahead, which the chief checkpoints.",
                name,
                step,
            )
            self._preemption.request_stop(step, f"the program's {name} asked to stop")
        return False


class ShortestInputHook(tf.compat.v1.train.SessionRunHook):
    """Ends this task's training loop after `batches` steps: where the shortest input ends.

    One process that trains until its input ends runs one step per batch. On a
    cluster each task stops after the fewest batches any training task's input
    yields (`estimator_dist.programs.loop.LoopTask.train`), counted in steps of
    its own loop rather than in global steps: a train_op that never steps the
    global step (a Keras optimizer under a canned head, whose `iterations` is not
    the global step; an optimizer's `minimize` without `global_step`) stops
    there too, on every task at once, where TrainSpec's `max_steps` would never
    be reached. When the global step does step, `max_steps` ends the loop at
    the same step.

    Args:
      batches: The steps this task runs at most.

    Attributes:
      batches: The steps this task runs at most.
      ended_at: The global step when the loop ended after its `batches` steps,
        else None.

    >>> ShortestInputHook(30).ended_at is None
    True
    """

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self._ran = 0
        self._global_step: Optional[tf.Tensor] = None
        self.ended_at: Optional[int] = None

    @property
    def reached(self) -> bool:
        """Whether this task ran its `batches` steps."""
        return self._ran >= self.batches

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._ran += 1
        if self.reached:
            run_context.request_stop()

    def end(self, session: tf.compat.v1.Session) -> None:
        if self.reached and self._global_step is not None:
            self.ended_at = int(session.run(self._global_step))


class _TrainingSessionHook(tf.compat.v1.train.SessionRunHook):
    """Records the session its training steps run in (before any hook's `after_run`)."""

    def __init__(self, router: StopRouter) -> None:
        self._router = router

    def before_run(self, run_context: Any) -> None:
        self._router._session = run_context.session
