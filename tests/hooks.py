"""A hook that wraps another to count what it asks of each training step."""

import tensorflow as tf


class CountingHook(tf.compat.v1.train.SessionRunHook):
    """Passes every call on to `inner`; counts the runs and the runs that fetched something.

    Args:
      inner: The hook under test.
      every: Calls `action` before every this many runs, if given.
      at: Calls `action` after this run, if given.
      action: What to call.
    """

    def __init__(self, inner, every=None, at=None, action=None):
        self.inner, self.every, self.at, self.action = inner, every, at, action
        self.runs = self.fetches = 0

    def begin(self):
        self.inner.begin()

    def after_create_session(self, session, coord):
        self.inner.after_create_session(session, coord)

    def before_run(self, run_context):
        self.runs += 1
        if self.every and self.runs % self.every == 0:
            self.action()
        request = self.inner.before_run(run_context)
        self.fetches += request is not None
        return request

    def after_run(self, run_context, run_values):
        self.inner.after_run(run_context, run_values)
        if self.runs == self.at:
            self.action()

    def end(self, session):
        self.inner.end(session)
