"""The whole-job restart loop: what it says of each attempt, and how long it waits."""

import pytest

from estimator_dist.base import exit_codes, files
from estimator_dist.cluster.tf_config import make_local_cluster
from estimator_dist.launcher import restarts
from estimator_dist.launcher.exits import Failure
from estimator_dist.launcher.restarts import RestartSettings, run_with_restarts

KILLED = Failure("worker-0 was killed by SIGKILL", 137)


class Interrupted(Exception):
    """Stands in for the launcher's own signal, raised while it supervises."""


class ScriptedLauncher:
    """Attempt N ends with `endings[N]` (a Failure, None for success, or an exception to raise).

    By the end of attempt N the tasks printed step `steps[N]` and the chief
    saved a checkpoint of step `saved[N]` in `model_dir`.
    """

    def __init__(self, model_dir, endings, steps, saved):
        self.model_dir, self.endings = model_dir, list(endings)
        self.steps, self.saved = list(steps), list(saved)
        self.lines = []
        self.failed_at, self.last_step_seen, self.evaluator_restarts = None, 0, []
        self.resumed_steps = {}
        self.nothing_evaluated = False
        self.checkpoint_step = lambda: files.checkpoint_step(str(model_dir))

    def say(self, line):
        self.lines.append(line)

    def start(self, tasks, attempt):
        pass

    def supervise(self, *args, **kwargs):
        self.last_step_seen = self.steps.pop(0)
        write_checkpoint(self.model_dir, self.saved.pop(0))
        ending = self.endings.pop(0)
        if isinstance(ending, BaseException):
            raise ending
        return ending

    def stop(self, grace_secs):
        pass


@pytest.fixture
def sleeps(monkeypatch):
    waited = []
    monkeypatch.setattr(restarts.time, "sleep", waited.append)
    return waited


def run(launcher, model_dir, max_restarts=5):
    settings = RestartSettings(max_restarts, finish_timeout=1, grace_secs=1, evaluator=False)
    cluster = make_local_cluster(2, [20001, 20002])
    return run_with_restarts(launcher, lambda attempt: cluster, str(model_dir), 10, None, settings)


def write_checkpoint(model_dir, step):
    """The files `tf.train.latest_checkpoint` looks for, naming step `step`."""
    (model_dir / f"model.ckpt-{step}.index").write_bytes(b"")
    (model_dir / "checkpoint").write_text(f'model_checkpoint_path: "model.ckpt-{step}"\n')

    assert [restarts.backoff_secs(attempt) for attempt in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_each_restart_waits_its_backoff(tmp_path, sleeps):
    launcher = ScriptedLauncher(
        tmp_path, [KILLED, KILLED, KILLED, None], steps=[30, 60, 90, 100], saved=[20, 50, 80, 100]
    )
    code = run(launcher, tmp_path)
    assert code == exit_codes.OK
    assert sleeps == [1.0, 2.0, 4.0]


def test_giving_up_lists_every_attempt_with_its_step_and_steps_lost(tmp_path, sleeps):
    launcher = ScriptedLauncher(tmp_path, [KILLED, KILLED], steps=[57, 57], saved=[20, 20])
    code = run(launcher, tmp_path)
    assert code == 137
    assert launcher.lines[-3:] == [
        "restart after attempt 0: worker-0 was killed by SIGKILL; resumed from checkpoint step "
        "20, 37 step(s) lost",
        "attempt 1: worker-0 was killed by SIGKILL; not restarted (the same failure (worker-0 "
        "was killed by SIGKILL) at checkpoint step 20 twice: not retrying); latest checkpoint "
        "step 20, 37 step(s) lost",
        "job failed (the same failure (worker-0 was killed by SIGKILL) at checkpoint step 20 "
        "twice: not retrying); 2 failed attempt(s)",
    ]


def test_a_signal_to_the_launcher_still_lists_the_attempts_before_it(tmp_path, sleeps):
    launcher = ScriptedLauncher(tmp_path, [KILLED, Interrupted()], steps=[45, 50], saved=[40, 40])
    with pytest.raises(Interrupted):
        run(launcher, tmp_path)
    assert launcher.lines[-1] == (
        "restart after attempt 0: worker-0 was killed by SIGKILL; resumed from checkpoint step "
        "40, 5 step(s) lost"
    )


def test_a_restart_that_fell_back_past_the_checkpoint_says_where_the_chief_resumed(
    tmp_path, sleeps
):
    # Attempt 0 left checkpoint 300; attempt 1's chief could not load it and ran from 200, as
    # its FirstStep event says: the summary names 200, and the steps lost count from there.
    launcher = ScriptedLauncher(tmp_path, [KILLED, None], steps=[340, 400], saved=[300, 400])
    launcher.resumed_steps = {0: 0, 1: 200}
    assert run(launcher, tmp_path) == exit_codes.OK
    assert (
        "restart after attempt 0: worker-0 was killed by SIGKILL; resumed at global step 200 "
        "(checkpoint step 300 was not used), 140 step(s) lost"
    ) in launcher.lines
