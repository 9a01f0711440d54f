"""Why each piece of `estimator_dist.tf_runtime.compat` exists, on the stack installed.

On TensorFlow 2.16+ (the 2.21 stack), each piece is taken away in a fresh
process and `import tensorflow_estimator` (or `tf.estimator`, or the model)
breaks the way the module's docstring says; with the layer, it works. On
TensorFlow 2.15 the layer must leave TensorFlow and the environment alone.
Each scenario runs in its own Python process: the layer is process-wide, and
what it fixes happens when TensorFlow is imported.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from tensorflow.python.distribute import distribute_coordinator, estimator_training

from estimator_dist.tf_runtime import compat
from tests.procs import REPO, report, run_module

NEWER = compat.needed()
on_newer = pytest.mark.skipif(not NEWER, reason="TensorFlow 2.15 ships what the layer adds")
on_215 = pytest.mark.skipif(NEWER, reason="the layer's work on TensorFlow 2.16+ is tested above")


def python(code, env=None, timeout=180):
    """Runs `code` in a fresh interpreter of this venv; returns (exit code, output)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    environ.update({"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(report(f"timed out after {timeout} s", output)) from None
    return process.returncode, output


def test_needed_exactly_when_tensorflow_lacks_estimator_training():
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    assert compat.needed() == ((major, minor) >= (2, 16))
    assert compat.installed() == compat.needed()


def test_unsupported_pythons_are_refused_in_one_line(monkeypatch):
    assert [compat.python_supported(v) for v in ((3, 8), (3, 9), (3, 13), (3, 14))] == [
        False,
        True,
        True,
        False,
    ]
    monkeypatch.setitem(compat._state, "prepared", False)
    monkeypatch.setattr(compat, "python_supported", lambda: False)
    with pytest.raises(SystemExit) as raised:
        compat.prepare()
    message = str(raised.value.code)
    assert message.startswith("estimator-dist: Python 3.") and "\n" not in message
    assert "3.9 to 3.13" in message


# --- The coordinator glue: the same contract on both stacks ------------------------------


def _run_config(monkeypatch, tf_config, **kwargs):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    return tf.estimator.RunConfig(**kwargs)


def test_run_config_with_a_strategy_in_a_cluster_goes_through_the_coordinator(monkeypatch):
    # TensorFlow 2.15's own module, or the layer's on 2.16+: the same marks either way.
    cluster = (
        '{"cluster": {"chief": ["h:1"], "worker": ["h:2"]}, "task": {"type": "worker", "index": 0}}'
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    marked = _run_config(monkeypatch, cluster, train_distribute=strategy)
    assert (
        marked._distribute_coordinator_mode
        == distribute_coordinator.CoordinatorMode.INDEPENDENT_WORKER
    )
    assert estimator_training.should_run_distribute_coordinator(marked)
    # Until the coordinator fills it, the config is a local task's.
    assert (marked.task_type, marked.num_worker_replicas) == ("worker", 1)
    plain = _run_config(monkeypatch, cluster)
    assert getattr(plain, "_distribute_coordinator_mode", None) is None
    assert (plain.task_type, plain.num_worker_replicas) == ("worker", 2)
    # A `master` job turns the coordinator off (why the package renames it `chief`).
    master = (
        '{"cluster": {"master": ["h:1"], "worker": ["h:2"]}, '
        '"task": {"type": "master", "index": 0}}'
    )
    assert (
        _run_config(monkeypatch, master, train_distribute=strategy)._distribute_coordinator_mode
        is None
    )
    alone = _run_config(monkeypatch, "{}", train_distribute=strategy)
    assert not estimator_training.should_run_distribute_coordinator(alone)


def test_estimator_train_on_a_task_of_a_cluster_is_refused(monkeypatch):
    cluster = (
        '{"cluster": {"chief": ["h:1"], "worker": ["h:2"]}, "task": {"type": "chief", "index": 0}}'
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    config = _run_config(monkeypatch, cluster, train_distribute=strategy, model_dir="/tmp/unused")
    estimator = tf.estimator.Estimator(lambda features, labels, mode: None, config=config)
    with pytest.raises(ValueError, match="Only `STANDALONE_CLIENT` mode is supported"):
        estimator.train(lambda: None, max_steps=1)


# --- TensorFlow 2.16+: each piece, taken away ---------------------------------------------


@pytest.mark.multiprocess
@on_newer
def test_without_the_layer_tensorflow_estimator_cannot_be_imported():
    code, output = python("import tensorflow_estimator")
    assert code != 0 and "cannot import name 'estimator_training'" in output, report(
        f"exit {code}, expected the import to fail on estimator_training", output
    )
    code, output = python("import tensorflow as tf\nprint(tf.estimator)")
    assert code != 0 and "has no attribute 'estimator'" in output, report(f"exit {code}", output)


@pytest.mark.multiprocess
@on_newer
@pytest.mark.parametrize(
    "taken_away, error",
    [
        # The TPU stand-ins: only TPUEstimator uses these modules, but every import needs them.
        (
            "for name in ('session_support', 'tpu_embedding', 'tpu_embedding_gradient'):\n"
            "    sys.modules.pop('tensorflow.python.tpu.' + name)\n"
            "    delattr(tpu, name)",
            "cannot import name 'tpu_embedding'",
        ),
        # The API name: every @estimator_export registers under it.
        ("del tf_export.ESTIMATOR_API_NAME", "has no attribute 'ESTIMATOR_API_NAME'"),
    ],
    ids=["tpu_stand_ins", "api_registration"],
)
def test_each_piece_is_needed(taken_away, error):
    code, output = python(
        "import sys\nimport estimator_dist\nimport tensorflow as tf\n"
        "from tensorflow.python import tpu\nfrom tensorflow.python.util import tf_export\n"
        f"{taken_away}\nimport tensorflow_estimator"
    )
    assert code != 0 and error in output, report(f"exit {code}, expected {error!r}", output)


@pytest.mark.multiprocess
@on_newer
def test_with_the_layer_every_way_to_reach_the_estimator_api_works():
    # A program that imports TensorFlow itself, after the package (or a library) readied
    # the layer; then one that imported TensorFlow first; TF1-style programs import
    # tensorflow.compat.v1 as a module of its own.
    checks = """
        import tensorflow.compat.v1 as v1
        # Estimator is one class in the v1 API, EstimatorV2 in the v2 one, as on 2.15.
        assert v1.estimator.Estimator is tf.compat.v1.estimator.Estimator
        assert tf.estimator.Estimator is tf.compat.v2.estimator.Estimator
        assert v1.estimator.RunConfig is tf.estimator.RunConfig
        assert tf.compat.v1.estimator.tpu.RunConfig is not None
        assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
        from tensorflow.python.tpu import tpu_embedding
        try:
            tpu_embedding.TableConfig()
        except NotImplementedError as error:
            print("TPU:", error)
        print("OK")
    """
    for first in (
        "import model_fns\nimport tensorflow as tf",
        "import tensorflow as tf\nimport estimator_dist",
    ):
        code, output = python(first + textwrap.dedent(checks))
        assert code == 0 and "OK" in output, report(f"exit {code} after {first!r}", output)
        assert "TPU: tensorflow.python.tpu.tpu_embedding.TableConfig is not available" in output


@pytest.mark.multiprocess
@on_newer
def test_legacy_keras_is_what_estimator_needs_and_a_users_choice_is_kept():
    canned = """
        import estimator_dist, os
        import tensorflow as tf
        print("VARIABLE", os.environ.get("TF_USE_LEGACY_KERAS"))
        tf.compat.v1.disable_eager_execution()
        column = tf.feature_column.numeric_column("x")
        estimator = tf.estimator.DNNClassifier([4], [column])
        data = lambda: tf.data.Dataset.from_tensors(({"x": [[1.0]]}, [[1]])).repeat()
        estimator.train(data, max_steps=1)
        print("TRAINED")
    """
    code, output = python(canned)
    assert code == 0 and "VARIABLE 1" in output and "TRAINED" in output, report(
        f"exit {code}", output
    )
    # Keras 3, forced by the user: kept, and the canned estimators cannot build.
    code, output = python(canned, env={"TF_USE_LEGACY_KERAS": "0"})
    assert "VARIABLE 0" in output and code != 0 and "TRAINED" not in output, report(
        f"exit {code}, expected the canned estimator to fail under Keras 3", output
    )


# --- TensorFlow 2.15: nothing ----------------------------------------------------------------


@pytest.mark.multiprocess
@on_215
def test_on_tensorflow_215_the_layer_does_nothing():
    code, output = python(
        """
        import os, sys
        import estimator_dist
        from estimator_dist.tf_runtime import compat
        import tensorflow as tf
        from tensorflow.python.distribute import estimator_training
        assert "TF_USE_LEGACY_KERAS" not in os.environ
        assert not any(type(f).__module__ == compat.__name__ for f in sys.meta_path)
        assert not compat.installed()
        assert estimator_training.__file__.startswith(os.path.dirname(tf.__file__))
        print("UNTOUCHED", tf.estimator.Estimator)
        """
    )
    assert code == 0 and "UNTOUCHED" in output, report(f"exit {code}", output)


@pytest.mark.multiprocess
@on_newer
def test_keras_3_forced_gives_one_line_naming_the_missing_variable(tmp_path, data_dir):
    # mnist_cnn builds tf.keras layers: under Keras 3 the evaluation graph, the second of
    # the process, names them dense_2, ... and its restore finds no such variable.
    model_dir = str(tmp_path / "model")
    args = [f"--model_dir={model_dir}", f"--data_dir={data_dir}", "--train_steps=2"]
    run = run_module(
        "estimator_dist.train", args, 180, {"TF_USE_LEGACY_KERAS": "0"}, model_dir, check=False
    )
    errors = [line for line in run.output.splitlines() if "error: " in line]
    assert run.returncode == 2 and len(errors) == 1, run.describe()
    assert "the checkpoint has no variable " in errors[0], run.describe()
    assert "TF_USE_LEGACY_KERAS=0" in errors[0] and "Traceback" not in run.output, run.describe()
