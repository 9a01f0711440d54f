"""The verdict of `check --script/--module`: a call counts only when it is TensorFlow's."""

import os
import textwrap

import pytest

from estimator_dist.programs import scan as program_scan
from tests.procs import REPO

TRAINER = os.path.join(REPO, "tests", "legacy", "programs", "trainer_pkg")


def verdict_of(source):
    scan = program_scan.scan_sources({"__main__": ("train.py", textwrap.dedent(source))})
    return str(program_scan.verdict(scan))


YES = "will run with --script: yes (calls tf.estimator.train_and_evaluate at line {})"


@pytest.mark.parametrize(
    "source, line",
    [
        ("import tensorflow as tf\ntf.estimator.train_and_evaluate(e, t, v)", 2),
        ("import tensorflow\ntensorflow.estimator.train_and_evaluate(e, t, v)", 2),
        ("import tensorflow as xyz\n\nxyz.compat.v1.estimator.train_and_evaluate(e, t, v)", 3),
        ("import tensorflow.compat.v1 as tf\ntf.estimator.train_and_evaluate(e, t, v)", 2),
        ("from tensorflow.estimator import train_and_evaluate as tae\ntae(e, t, v)", 2),
        ("from tensorflow import estimator\nestimator.train_and_evaluate(e, t, v)", 2),
        ("import tensorflow_estimator as tfe\ntfe.estimator.train_and_evaluate(e, t, v)", 2),
        (
            "from tensorflow_estimator.python.estimator import training\n"
            "training.train_and_evaluate(e, t, v)",
            2,
        ),
        ("from tensorflow.estimator import *\ntrain_and_evaluate(e, t, v)", 2),
        ("import tensorflow as tf\ntae = tf.estimator.train_and_evaluate\ntae(e, t, v)", 3),
    ],
)
def test_tensorflows_train_and_evaluate_under_any_name(source, line):
    assert verdict_of(source) == YES.format(line)


def test_the_programs_own_train_and_evaluate_is_not_tensorflows():
    source = """
        import tensorflow as tf

        def train_and_evaluate(args):
            print(args)

        train_and_evaluate(None)
    """
    assert verdict_of(source).startswith("will run with --script: no: it never calls ")


def test_a_call_from_a_module_it_did_not_read_cannot_be_told():
    source = """
        from helpers.training import train_and_evaluate

        train_and_evaluate(None)
    """
    assert verdict_of(source) == (
        "will run with --script: cannot tell statically: train_and_evaluate(...) at line 4 "
        "comes from module helpers.training, which it did not read; nothing it read calls "
        "TensorFlow's"
    )


def test_an_estimator_from_an_unknown_call_cannot_be_told():
    source = """
        import factory

        estimator = factory.make()
        estimator.train(input_fn, max_steps=10)
    """
    assert verdict_of(source) == (
        "will run with --script: cannot tell statically: estimator.train(...) at line 5 may "
        "be an Estimator's train(): the object comes from factory.make(), which it cannot follow"
    )


def test_estimator_train_is_information_not_a_no():
    source = """
        import tensorflow as tf

        def build():
            return tf.estimator.DNNClassifier([10], feature_columns)

        estimator = build()
        estimator.train(input_fn, max_steps=100)
        estimator.evaluate(input_fn=eval_input_fn)
    """
    scan = program_scan.scan_sources({"__main__": ("train.py", textwrap.dedent(source))})
    assert str(program_scan.verdict(scan)) == (
        "will run with --script: yes (trains with estimator.train() at line 8: each call runs "
        "as one synchronised segment on every worker)"
    )
    assert [f.kind for f in scan.findings] == ["estimator-train", "estimator-evaluate"]


def test_the_rules_are_one_table_in_order():
    kinds = [rule.kind for rule in program_scan.RULES]
    assert kinds[:2] == ["train-and-evaluate", "estimator-train"]
    answers = {rule.answer for rule in program_scan.RULES}
    assert answers == {program_scan.YES, program_scan.UNKNOWN, None}


def test_a_package_is_read_file_by_file_through_its_relative_imports():
    scan = program_scan.scan_program(TRAINER, module="trainer.task")
    assert scan.files == ("trainer/__init__.py", "trainer/model.py", "trainer/task.py")
    assert str(program_scan.verdict(scan, "--module")) == (
        "will run with --module: yes (calls tf.estimator.train_and_evaluate at trainer/model.py:39)"
    )
    assert scan.per_file() == [
        "  trainer/__init__.py: no TensorFlow train_and_evaluate/train/evaluate call",
        "  trainer/model.py: calls tf.estimator.train_and_evaluate at line 39",
        "  trainer/task.py: no TensorFlow train_and_evaluate/train/evaluate call",
    ]


def test_a_script_reads_the_modules_beside_it_that_it_imports(tmp_path):
    (tmp_path / "train.py").write_text("import model\n\nmodel.train_and_evaluate(None)\n")
    (tmp_path / "model.py").write_text(
        "import tensorflow as tf\n\ndef train_and_evaluate(args):\n"
        "    tf.estimator.train_and_evaluate(e, t, v)\n"
    )
    scan = program_scan.scan_program(str(tmp_path), script=str(tmp_path / "train.py"))
    assert str(program_scan.verdict(scan)) == (
        f"will run with --script: yes (calls tf.estimator.train_and_evaluate at "
        f"{tmp_path / 'model.py'}:4)"
    )


@pytest.mark.parametrize(
    "loop",
    [
        "for features, labels in input_fn().take(1):",
        "for batch in make_input_fn(df)():",
        "for row in dataset.as_numpy_iterator():",
    ],
)
def test_a_python_loop_over_a_dataset_runs_as_written(loop):
    # Programs keep eager execution, as in plain TensorFlow: a loop printing a batch of the
    # input runs on every task (tests/legacy/scripts/eager_peek.py runs one on a cluster).
    source = f"""
        import tensorflow as tf
        {loop}
            print(row)
        tf.estimator.train_and_evaluate(e, t, v)
    """
    assert verdict_of(source) == YES.format(5)
