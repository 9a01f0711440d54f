"""Legacy Estimator programs run unchanged, in one process and on 2 workers + an evaluator.

Every program of `tests/legacy/` is run through the package's entry points,
its functions named by `module:attribute` flags, nothing in it changed:

* one process, no TF_CONFIG (`estimator_dist.train`);
* 2 workers and an evaluator (`estimator_dist.launch --num_workers=2 --evaluator`),
  except the programs that only exercise a calling convention whose cluster path
  is the same code as `bound_method`'s, which stands for them there
  (`CONVENTION_ONLY`, with the reasoning).

Each run must end with a final evaluation (`eval_metrics.json`, `final` true)
at `global_step == train_steps`, with a metric better than chance by a
margin measured on these programs (or a finite loss under a measured bound).

The deterministic programs must also train to the same variables on 2
workers as on 1, within `tests.equivalence.TOLERANCE`. They read no
`input_context`, so every worker reads the same batch; their loss is a mean
over the batch, which a `tf.compat.v1.train` optimizer, a canned head or the
Keras bridge divides by N before the all-reduce sums the N equal gradients.
Their shuffles are seeded, and so are their initialisers: explicitly, or by
the graph seed the package sets.

The 1-worker reference is the one-process run itself: its variables were
measured equal, to the last bit, to those of a 1-worker cluster
(`launch --num_workers=1`) for the 7 programs compared (batch_norm_port,
canned_regressor, head_factory, keras_adam, premade_iris, tpu_style_params,
wide_deep_census). A cluster of 1 is not closer to the 2-worker chief's
graph: a TF1 layer seeded by the graph seed alone gets
other weights on 2 workers than on 1 (the 2-worker graph makes more ops
before it). For `migration_tf1`, written with one, the reference is a
1-worker cluster started from the 2-worker run's step-0 checkpoint
(`--warm_start_from`), as `tests/equivalence.py` does. That flag does not
reach an estimator that an `--estimator` builder makes without using
`params`, so `custom_iris` seeds its TF1 layers explicitly.

Left out of the equality, by design: `multiworker_tutorial` shards by
`input_context` with a fixed per-worker batch (2 workers train on twice the
global batch); `layers_cnn` and `pandas_frames` shuffle in numpy_input_fn's and
pandas_input_fn's queues, whose order depends on thread timing (and
`layers_cnn` uses dropout). `wide_deep_census` is held to
the opposite: a v1 canned head sums its loss over the batch, TensorFlow then
does not divide by N, and N workers reading the same batch take N times one
worker's step, so 2 workers must end far from 1.

The runs of one program start together (the single process, the 2-worker
cluster and, for `migration_tf1`, the 1-worker reference, as far as the
selected tests need them), to use the idle time of tasks that wait for
each other; each test then checks its own run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from typing import Callable, Dict, Optional, Tuple, Union

import pytest

from estimator_dist.base import exit_codes
from estimator_dist.base.files import checkpoint_step
from estimator_dist.hardware import cpus
from estimator_dist.task.user_code import DEFAULT_EVAL_STEPS
from tests.equivalence import TOLERANCE, checkpoint_variables, max_difference
from tests.estimator_dist.usage_table_test import usage_error_in_process
from tests.procs import Run, run_module

pytestmark = pytest.mark.multiprocess

PACKAGE = "tests.legacy"
ONE_PROCESS_TIMEOUT = 240
CLUSTER_TIMEOUT = 300  # the launcher's --timeout_secs; the test waits 30 s more
FINAL_LINE = "Final evaluation: global_step={steps}"
LAUNCHER_FINAL_LINE = "[launcher] final evaluation: global_step={steps}"


@dataclasses.dataclass(frozen=True)
class Program:
    """How a legacy program is named on the command line, and what it must reach.

    Attributes:
      module: Module name under tests.legacy.
      model: `--model_fn`, `--estimator` or `--keras_model` with the attribute,
        such as `--model_fn=model_fn`; the module is added.
      input_fn: The training input attribute.
      eval_input_fn: The evaluation input attribute; None: `--input_fn` in mode EVAL.
      metric: The metric checked in the final evaluation.
      bound: The least accuracy, or for a metric named *loss the largest value.
      deterministic: Whether 2 workers must reach 1 worker's variables.
      warm_start: Whether the 1-worker reference is a 1-worker cluster started
        from the 2-worker run's initial weights (for weights seeded by the
        graph seed alone), not the one-process run.
      extra: More training flags.
      cluster: Whether it also runs on 2 workers + an evaluator; False for a
        program that only exercises a calling convention that `bound_method`'s
        cluster run already proves (see CONVENTION_ONLY).
    """

    module: str
    model: str
    input_fn: str = "train_input_fn"
    eval_input_fn: Optional[str] = "eval_input_fn"
    metric: str = "accuracy"
    bound: float = 0.7
    deterministic: bool = True
    warm_start: bool = False
    extra: Tuple[str, ...] = ()
    cluster: bool = True

    steps = 100

    def flags(self, input_fn: Optional[str] = None) -> list:
        flag, _, attribute = self.model.partition("=")
        module = f"{PACKAGE}.{self.module}"
        flags = [f"{flag}={module}:{attribute}", f"--input_fn={module}:{input_fn or self.input_fn}"]
        if self.eval_input_fn:
            flags.append(f"--eval_input_fn={module}:{self.eval_input_fn}")
        return [
            *flags,
            f"--train_steps={self.steps}",
            f"--save_checkpoints_steps={self.steps}",
            "--communication=RING",
            "--eval_throttle_secs=1",
            *self.extra,
        ]


# Chance: digits 0.1 (loss ln 10 = 2.30), iris 0.4, breast cancer 0.63 (the
# majority class), the census-like rows 0.64. Each accuracy bound sits 0.1 or
# more below the lowest of 4 graph seeds under plain tf.estimator in one
# process after the same 100 steps; each loss bound about 2x the highest.
PROGRAMS = {
    program.module: program
    for program in [
        Program(
            "multiworker_tutorial",
            "--model_fn=model_fn",
            input_fn="input_fn",
            eval_input_fn=None,
            metric="loss",
            bound=1.2,  # 0.41 to 0.62 measured
            deterministic=False,
        ),
        # Evaluates 3 points outside the training range with an unseeded dense layer that 100
        # steps of Adagrad at 0.05 barely move: the loss is its initial weights' (0.04 to 4.2
        # in one process on TensorFlow 2.15, 14.6 once on 2 workers, 38.9 once on 2.21), so
        # no bound tells training from chance; the run and its final evaluation are checked.
        Program(
            "migration_tf1",
            "--model_fn=_model_fn",
            input_fn="_input_fn",
            eval_input_fn="_eval_input_fn",
            metric="loss",
            bound=math.inf,
            warm_start=True,  # an unseeded TF1 dense layer
        ),
        Program("premade_iris", "--estimator=build", bound=0.8),  # 0.97 to 1.0
        Program(
            "pandas_frames", "--estimator=build", bound=0.8, deterministic=False
        ),  # 0.97 to 1.0
        Program("custom_iris", "--estimator=build", bound=0.8),  # 0.93 to 1.0
        # Its shuffle queue's order varies with thread timing, and so, at 100 steps of plain
        # SGD at 0.3, does the accuracy: 0.82 to 0.88 in most runs, 0.62 once.
        Program("layers_cnn", "--model_fn=cnn_model_fn", bound=0.4, deterministic=False),
        Program("batch_norm_port", "--model_fn=model_fn", bound=0.85),  # 0.95 to 0.97
        Program("decayed_lr", "--model_fn=model_fn"),  # 0.85 to 0.88
        Program(
            "wide_deep_census", "--estimator=build", bound=0.74, deterministic=False
        ),  # 0.84 to 0.88
        Program(
            "bound_method",
            "--model_fn=MODEL.model_fn",
            input_fn="DATA.train_input_fn",
            eval_input_fn="DATA.eval_input_fn",
        ),  # 0.85 to 0.87
        Program("callable_model", "--model_fn=model_fn", cluster=False),  # 0.86 to 0.87
        Program("config_arg", "--model_fn=model_fn", bound=0.85),  # 0.96 to 0.97
        Program("partial_inputs", "--model_fn=model_fn", cluster=False),  # 0.87 to 0.89
        Program(
            "keras_adam",
            "--keras_model=build",
            input_fn="input_fn",
            eval_input_fn=None,
            bound=0.5,  # 0.69 to 0.72
        ),
        Program("tensor_input", "--model_fn=model_fn", bound=0.85),  # 0.97 to 0.98
        Program("eval_repeats", "--model_fn=model_fn"),  # 0.85 to 0.87
        Program(
            "tpu_style_params",
            "--model_fn=model_fn",
            extra=("--batch_size=32", "--learning_rate=0.05"),
        ),  # 0.85 to 0.88
        Program(
            "head_factory", "--model_fn=model_fn", extra=("--learning_rate=0.1",)
        ),  # 0.84 to 0.87
        # Predicting the training mean: a mean squared error of 6,356 on the test rows.
        Program(
            "canned_regressor", "--estimator=build", metric="average_loss", bound=4500.0
        ),  # 2,910 to 3,060
    ]
}
#: Programs that differ from the others only in how Estimator calls their model_fn or
#: input_fn (a callable object, functools.partial inputs). That code is the same in every
#: role: `--model_fn`/`--input_fn` resolve `module:attribute` the same way on every task,
#: the model_fn goes to `tf.estimator.Estimator` as it is (`preflight.model_fn_estimator`),
#: and `user_code.present_input_fn` returns a Dataset the same way with or without a strategy
#: (only tensors, as `tensor_input`, `layers_cnn` and `pandas_frames` return, take the
#: strategy's own branch, so those keep their cluster runs; so does `config_arg`, whose
#: hook is the chief's only). They run in one process; `bound_method` (a bound method as
#: model_fn and as both input_fns) is the representative that also runs on 2 workers +
#: an evaluator and is held to 1 worker's weights.
CONVENTION_ONLY = sorted(name for name, program in PROGRAMS.items() if not program.cluster)
ON_A_CLUSTER = sorted(name for name, program in PROGRAMS.items() if program.cluster)
DETERMINISTIC = sorted(
    name for name, program in PROGRAMS.items() if program.deterministic and program.cluster
)
#: v1 canned estimators default to `loss_reduction=SUM`: TensorFlow does not divide a
#: summed loss by N, and N unsharded workers sum N copies of the batch.
SUMMED_LOSS = "wide_deep_census"
#: Programs whose matrix products `--mixed_precision=bfloat16` computes in bfloat16, held to
#: issue 27's bound against their float32 run at the same steps and seed (the one-process
#: run above). `custom_iris` misses it and is left out: after its 100 steps bfloat16
#: misclassified 2 of the 30 test rows that float32 got right (loss 0.205 against 0.159),
#: though both got all 30 at 200 and 400 steps; docs/performance.md has the measurements.
BFLOAT16_PROGRAMS = ["batch_norm_port", "decayed_lr", "keras_adam", "premade_iris"]


def _reference(program: Program) -> str:
    """The run whose variables 2 workers must reach: see the module docstring."""
    return "one" if program.warm_start else "process"


#: The runs each test reads, by test function, given the program.
RUNS_OF_TEST = {
    "test_runs_unchanged_in_one_process": lambda program: ("process",),
    "test_runs_unchanged_on_two_workers_and_an_evaluator": lambda program: ("two",),
    "test_two_workers_train_like_one_worker": lambda program: ("two", _reference(program)),
    "test_an_evaluation_input_that_repeats_reads_eval_spec_default_batches": lambda program: (
        "two",
    ),
    "test_bfloat16_keeps_the_metrics_of_float32": lambda program: ("process", "bfloat16"),
}


@dataclasses.dataclass(frozen=True)
class _Command:
    module: str
    args: list
    model_dir: str
    timeout: float
    after: Optional[str] = None  # a file to wait for before starting
    env: Optional[dict] = None


def _commands(program: Program, base) -> Dict[str, _Command]:
    """The command of each kind of run of `program`, with model_dirs under `base`."""

    def launch(kind: str, num_workers: int, evaluator: bool, extra: tuple = ()) -> list:
        launcher = [
            f"--num_workers={num_workers}",
            "--evaluator" if evaluator else "--noevaluator",
            f"--timeout_secs={CLUSTER_TIMEOUT}",
            "--max_restarts=0",
        ]
        training = [f"--model_dir={base / kind}", *program.flags(), *extra]
        return [*launcher, "--", *training]

    two = base / "two"
    # Only read for its checkpoints, and started from the 2-worker run's first one
    # as soon as that is written.
    reference = ["--export=", f"--warm_start_from={two}/model.ckpt-0"]
    return {
        "process": _Command(
            "estimator_dist.train",
            [f"--model_dir={base / 'process'}", *program.flags()],
            str(base / "process"),
            ONE_PROCESS_TIMEOUT,
        ),
        "bfloat16": _Command(
            "estimator_dist.train",
            [f"--model_dir={base / 'bfloat16'}", *program.flags(), "--mixed_precision=bfloat16"],
            str(base / "bfloat16"),
            ONE_PROCESS_TIMEOUT,
            env={"TF_CPP_MIN_LOG_LEVEL": "0"},  # grappler's INFO line says what it converted
        ),
        "two": _Command(
            "estimator_dist.launch", launch("two", 2, True), str(two), CLUSTER_TIMEOUT + 30
        ),
        "one": _Command(
            "estimator_dist.launch",
            launch("one", 1, False, tuple(reference)),
            str(base / "one"),
            CLUSTER_TIMEOUT + 30,
            after=f"{two}/model.ckpt-0.index",
        ),
    }


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """`runs(name, kind)`: the finished run of one kind of a program, run once.

    The first call for a program starts every kind of run that the selected
    tests need for it, at the same time, each bounded by its timeout with its
    process group killed; a run that timed out re-raises in each test that
    reads it.
    """
    done: Dict[str, Dict[str, Union[Run, AssertionError]]] = {}

    def needed(name: str) -> set:
        kinds = set()
        for item in request.session.items:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and callspec.params.get("name") == name:
                kinds.update(RUNS_OF_TEST[item.originalname](PROGRAMS[name]))
        return kinds

    def start(command: _Command, given_up: Callable[[], bool]) -> Union[Run, AssertionError]:
        deadline = time.monotonic() + command.timeout
        while command.after and not os.path.exists(command.after):
            if given_up() or time.monotonic() > deadline:
                return AssertionError(f"{command.after} never appeared; not started.")
            time.sleep(0.2)
        try:
            return run_module(
                command.module,
                command.args,
                command.timeout,
                command.env,
                model_dir=command.model_dir,
                check=False,
            )
        except AssertionError as error:  # timed out: killed, logs in the message
            return error

    def get(name: str, kind: str, check: bool = True) -> Run:
        if kind not in done.get(name, {}):
            commands = _commands(PROGRAMS[name], tmp_path_factory.mktemp(name))
            # "two" first: "one" may wait for its first checkpoint.
            kinds = sorted((needed(name) | {kind}) - set(done.get(name, {})), key="two".__ne__)
            futures = {}
            with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
                for k in kinds:
                    first = futures.get("two")
                    given_up = first.done if first else lambda: True
                    futures[k] = pool.submit(start, commands[k], given_up)
            done.setdefault(name, {}).update({k: f.result() for k, f in futures.items()})
        run = done[name][kind]
        if isinstance(run, AssertionError):
            raise run
        if check:
            assert run.returncode == 0, run.describe()
        return run

    return get


def _check_final_evaluation(run: Run, program: Program, kind: str) -> dict:
    """Asserts the final evaluation exists, at the last step, with a sensible metric.

    Prints one `CORPUS` line per run (shown with `pytest -rP`): the table of
    programs x modes that a closing note reports.
    """
    result = run.json("eval_metrics.json")
    assert result["final"] is True, run.describe()
    metrics = result["metrics"]
    assert metrics["global_step"] == program.steps, (metrics, run.describe())
    value = metrics[program.metric]
    print(
        f"CORPUS {program.module} {kind} {program.metric}={value:.4g} "
        f"(bound {program.bound:g}) step={metrics['global_step']}"
    )
    assert math.isfinite(value), (metrics, run.describe())
    if program.metric.endswith("loss"):
        assert value <= program.bound, (program.metric, metrics)
    else:
        assert value >= program.bound, (program.metric, metrics)
    return metrics


def _check_inputs_recorded(run: Run, program: Program) -> None:
    """The run record says which function fed training and which fed evaluation."""
    inputs = run.json("run_record.json")["input_fns"]
    module = f"{PACKAGE}.{program.module}"
    assert inputs["train"] == f"{module}:{program.input_fn}", inputs
    assert inputs["eval"] == f"{module}:{program.eval_input_fn or program.input_fn}", inputs


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_runs_unchanged_in_one_process(name, runs):
    program = PROGRAMS[name]
    run = runs(name, "process")
    assert FINAL_LINE.format(steps=program.steps) in run.output, run.describe()
    _check_final_evaluation(run, program, "one-process")
    _check_inputs_recorded(run, program)


@pytest.mark.parametrize("name", ON_A_CLUSTER)
def test_runs_unchanged_on_two_workers_and_an_evaluator(name, runs):
    program = PROGRAMS[name]
    run = runs(name, "two")
    assert LAUNCHER_FINAL_LINE.format(steps=program.steps) in run.output, run.describe()
    _check_final_evaluation(run, program, "2-workers+evaluator")
    assert run.json("run_record.json")["num_replicas"] == 2
    _check_inputs_recorded(run, program)


@pytest.mark.parametrize("name", [*DETERMINISTIC, SUMMED_LOSS])
def test_two_workers_train_like_one_worker(name, runs):
    program = PROGRAMS[name]
    # Training only: an evaluation's or export's failure is the other tests'.
    two, one = runs(name, "two", check=False), runs(name, _reference(program), check=False)
    for run in (two, one):
        assert checkpoint_step(run.model_dir) == program.steps, run.describe()
    reference = checkpoint_variables(one.model_dir)
    difference = max_difference(reference, checkpoint_variables(two.model_dir))
    moved = max_difference(reference, checkpoint_variables(one.model_dir, step=0))
    print(f"{name}: max |w(2 workers) - w(1 worker)| = {difference:.3g}, moved {moved:.3g}")
    assert moved > 100 * TOLERANCE, f"{name}: training barely moved the weights ({moved:.3g})"
    if name == SUMMED_LOSS:  # twice one worker's gradient at every step
        assert difference > 100 * TOLERANCE, f"{name}: {difference:.3g}, expected far apart"
    else:
        assert difference <= TOLERANCE, f"{name}: {difference:.3g} (weights moved {moved:.3g})"


@pytest.mark.parametrize("name", ["eval_repeats"])
def test_an_evaluation_input_that_repeats_reads_eval_spec_default_batches(name, runs):
    """No --eval_steps, and an eval input_fn that repeats: 100 batches, and the log says so."""
    run = runs(name, "two")
    logged = run.output + run.logs()
    assert "repeats forever and --eval_steps is not set" in logged, run.describe()
    assert f"reads at most {DEFAULT_EVAL_STEPS} batches" in logged, run.describe()


@pytest.mark.skipif(
    not set(cpus.BFLOAT16_FLAGS) & cpus.cpu_flags(), reason="this CPU has no bfloat16"
)
@pytest.mark.parametrize("name", BFLOAT16_PROGRAMS)
def test_bfloat16_keeps_the_metrics_of_float32(name, runs):
    """Issue 27's bound: within 0.5 points of accuracy, or 2% of loss, of the float32 run."""
    program = PROGRAMS[name]
    float32 = _check_final_evaluation(runs(name, "process"), program, "one-process")
    bfloat16 = _check_final_evaluation(runs(name, "bfloat16"), program, "one-process-bfloat16")
    run = runs(name, "bfloat16")
    assert run.json("run_record.json")["mixed_precision"]["used"] == "bfloat16"
    assert "nodes to bfloat16 precision" in run.output + run.logs(), run.describe()
    accuracy = abs(bfloat16["accuracy"] - float32["accuracy"])
    loss = abs(bfloat16["loss"] - float32["loss"]) / float32["loss"]
    print(f"{name}: bfloat16 - float32: {100 * accuracy:.2f} points, loss {100 * loss:.2f}%")
    assert accuracy <= 0.005 or loss <= 0.02, (name, bfloat16, float32)


def test_an_unbound_tutorial_input_fn_is_refused_with_the_partial_to_write(capsys, tmp_path):
    """premade_iris.input_fn(features, labels, training, batch_size): Estimator cannot call it.

    In this process, through the stages of `estimator_dist.train` that refuse it (its
    pre-flight) and `usage_exit`: exit 2, the message, nothing written. That the entry
    point turns a pre-flight refusal into exit 2 end to end is `train_test`'s unknown
    model_fn case.
    """
    args = PROGRAMS["premade_iris"].flags(input_fn="input_fn")
    code, output, model_dir = usage_error_in_process(capsys, tmp_path, args, preflight=True)
    assert code == exit_codes.USAGE, output
    assert "functools.partial" in output, output
    assert "features" in output and "labels" in output, output
    assert not os.path.exists(model_dir), "a usage error must write nothing to model_dir"


def test_the_calling_conventions_left_off_the_cluster_keep_a_representative_on_it():
    """`bound_method` carries CONVENTION_ONLY's cluster run and its weights' equality."""
    assert CONVENTION_ONLY == ["callable_model", "partial_inputs"]
    assert "bound_method" in ON_A_CLUSTER and "bound_method" in DETERMINISTIC
