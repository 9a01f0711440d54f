"""The engine protocol: the local engine and the Ray engine offer the launcher the same calls."""

import inspect
import subprocess
import sys

import pytest
from absl import flags

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, WORKER
from estimator_dist.config.shape import JobShape
from estimator_dist.launcher import launch_flags, local, plan, run
from estimator_dist.launcher.engine import Engine
from estimator_dist.launcher.local import LocalEngine
from estimator_dist.launcher.ray.engine import RayEngine
from estimator_dist.launcher.ray.settings import RaySettings
from estimator_dist.launcher.task_start import TaskSpec


@pytest.mark.parametrize("implementation", [LocalEngine, RayEngine])
def test_every_engine_offers_the_protocols_calls_with_its_signatures(implementation):
    for name in ("prepare", "connect", "new_cluster", "start_task", "close"):
        ours = inspect.signature(getattr(implementation, name))
        protocol = inspect.signature(getattr(Engine, name))
        assert list(ours.parameters) == list(protocol.parameters), (implementation, name)
    assert isinstance(implementation.kind, str)
    assert isinstance(implementation.needs_shared_model_dir, bool)


def test_only_the_ray_engine_needs_a_shared_model_dir():
    shape = JobShape(2, 0, True)
    assert not LocalEngine(shape).needs_shared_model_dir
    assert RayEngine(RaySettings("10.0.0.1:6379"), shape).needs_shared_model_dir


def test_each_attempt_of_the_local_engine_gets_fresh_ports_and_the_jobs_shape():
    engine = LocalEngine(JobShape(2, 1, True), network_isolation=False)
    first, second = engine.new_cluster(0), engine.new_cluster(1)
    assert [c.task_type for c in first.tasks] == [CHIEF, WORKER, "ps", EVALUATOR]
    ports = {c.jobs[CHIEF][0] for c in (first.tasks[0], second.tasks[0])}
    assert len(ports) == 2, "a restart must not reuse the failed attempt's ports"


def test_pinned_training_tasks_run_on_disjoint_cores_and_say_so(monkeypatch):
    monkeypatch.setattr(local, "split_cores", lambda n: [frozenset({i}) for i in range(n)])
    started = []
    monkeypatch.setattr(local, "start_local_task", lambda spec: started.append(spec) or Fake())
    engine = LocalEngine(JobShape(2, 0, True), network_isolation=False, pin_cores=True)
    cluster = engine.new_cluster(0)
    processes = [engine.start_task(TaskSpec("m", (), c, None)) for c in cluster.tasks]
    assert [spec.cores for spec in started] == [frozenset({0}), frozenset({1}), None]
    assert [p.where for p in processes] == [" on cores 0", " on cores 1", ""]


def test_unpinned_tasks_use_every_core(monkeypatch):
    started = []
    monkeypatch.setattr(local, "start_local_task", lambda spec: started.append(spec) or Fake())
    engine = LocalEngine(JobShape(2, 0, False), network_isolation=False, pin_cores=False)
    for config in engine.new_cluster(0).tasks:
        engine.start_task(TaskSpec("m", (), config, None))
    assert [spec.cores for spec in started] == [None, None]


@pytest.mark.multiprocess
def test_the_local_engine_starts_a_real_process_whose_output_it_reads():
    engine = LocalEngine(JobShape(1, 0, False), network_isolation=False)
    config = engine.new_cluster(0).tasks[0]
    process = engine.start_task(TaskSpec("json.tool", ("--help",), config, None))
    output = "".join(process.stdout)
    assert process.wait(timeout=60) == 0 and "json.tool" in output


class Fake:
    pid = 1


@pytest.fixture
def parsed():
    """The launcher's flags on their own FlagValues, parsed from a command line."""
    values = flags.FlagValues()
    launch_flags.define_flags(values)

    def parse(*argv):
        values.unparse_flags()
        values([sys.argv[0], *argv])
        return values

    return parse


def test_settings_carry_the_jobs_shape_and_restart_budget(parsed):
    settings = launch_flags.settings_from_flags(
        parsed("--num_workers=3", "--noevaluator", "--max_restarts=5", "--timeout_secs=9")
    )
    assert settings.shape == JobShape(3, 0, False)
    assert settings.restarts.max_restarts == 5 and not settings.restarts.evaluator
    assert settings.timeout_secs == 9 and settings.ray is None and not settings.program
    assert isinstance(launch_flags.make_engine(settings), LocalEngine)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--ray_address=10.0.0.1:6379"], "--ray_address is a flag of --engine=ray"),
        (["--communication=ring"], "--communication is a flag of --script jobs"),
    ],
)
def test_flags_of_another_engine_or_job_are_refused(parsed, argv, fragment):
    with pytest.raises(UsageError, match=fragment):
        launch_flags.settings_from_flags(parsed(*argv))


def test_a_module_makes_a_program_job(parsed):
    settings = launch_flags.settings_from_flags(parsed("--module=trainer.task"))
    assert settings.program and settings.script is None


def test_plans_checkpoint_step_reads_the_model_dir(tmp_path):
    import tensorflow as tf

    job = plan.Plan("estimator_dist.train", (), str(tmp_path))
    assert job.checkpoint_step() == 0
    step = tf.Variable(7, dtype=tf.int64)
    tf.train.Checkpoint(step=step).write(str(tmp_path / "model.ckpt-7"))
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-7"\n')
    assert job.checkpoint_step() == 7


def test_run_job_closes_the_engine_when_joining_it_fails(tmp_path):
    closed = []

    class Unreachable(LocalEngine):
        def connect(self, say):
            raise UsageError("nothing answers")

        def close(self):
            closed.append(True)

    settings = launch_flags.settings_from_flags(_fresh())
    job = plan.Plan("estimator_dist.train", (), str(tmp_path))
    with pytest.raises(UsageError):
        run.run_job(job, Unreachable(settings.shape, network_isolation=False), settings, [])
    assert closed == [True]


def _fresh():
    values = flags.FlagValues()
    launch_flags.define_flags(values)
    values([sys.argv[0]])
    return values


@pytest.mark.multiprocess
def test_the_launcher_imports_no_tensorflow():
    code = "import sys, estimator_dist.launch; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
