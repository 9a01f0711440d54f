"""The pre-flight: resolve names, read the input, build the model once, before any task commits.

The launcher runs it once before starting any task, every task runs it
before joining the cluster, and `estimator_dist.check` runs it on request.
User code is called here exactly as the training tasks call it: in graph
mode (a scratch `tf.Graph`), with a global step, through Estimator's own
`_call_model_fn` (so `params` and `config` reach a model_fn only when it
declares them), and with input functions as `user_code.present_input_fn` hands them to Estimator.
A bad name, missing data, a bad hyper-parameter, a model_fn that raises or a
known multi-worker pitfall then fails at once, with nothing written to
model_dir and before the other workers wait for this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from typing import Any, Callable, Iterator, Mapping, Optional, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base.errors import Error, UsageError, UserCodeError
from estimator_dist.config.job import JobConfig
from estimator_dist.task import pitfalls, user_code
from estimator_dist.tf_runtime import estimators
from estimator_dist.tf_runtime.transparent import fn_args
from input_fns import INPUT_FNS, prepare_input
from model_fns import ESTIMATORS, KERAS_MODELS, MODEL_FNS
from model_fns.optimizers import COLLECTION as ACCUMULATING_OPTIMIZERS
from model_fns.optimizers import MICRO_BATCH_COLLECTION

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
#: Logged when the model cannot be exported, and so no SavedModel is written.
NO_EXPORT_MESSAGE = (
    "{what} cannot build its PREDICT graph ({error}), so no SavedModel is exported (--export "
    "is ignored); training and evaluation are not affected. To export, give the model_fn a "
    "`mode == tf.estimator.ModeKeys.PREDICT` branch that returns "
    "EstimatorSpec(mode, predictions=...)."
)

#: Warned when evaluation would read the training input_fn's data unawares.
EVAL_ON_TRAINING_INPUT = (
    "evaluation reads the training data: no --eval_input_fn is given and --input_fn={name} "
    "takes no `mode`, so Estimator calls it the same way for evaluation, and the evaluation "
    "metrics measure the examples the model trained on. Fix: pass --eval_input_fn=module:"
    "function (the program's own evaluation input function; --eval_params gives it its own "
    "params), or declare `mode` and return the evaluation data when mode == "
    "tf.estimator.ModeKeys.EVAL."
)


@contextlib.contextmanager
def calling(what: str) -> Iterator[None]:
    """Turns an exception raised by user code into a `UserCodeError` (exit 5).

    The package's own errors pass through. The user's traceback is logged
    once, since the exit message has room for its last line only.

    Args:
      what: What was being called, e.g. `--model_fn=my.model:model_fn (TRAIN graph)`.
    """
    try:
        yield
    except Error:
        raise
    except Exception as error:  # Any exception of user code is reported as one.
        logging.error("%s raised:\n%s", what, "".join(traceback.format_exc()))
        raise UserCodeError(
            f"{what} raised {type(error).__name__}: {error}. The traceback is in the log above. "
            "It would raise again on every task and after every restart, so the job stops; "
            "fix the code and run again."
        ) from None


@dataclasses.dataclass(frozen=True)
class InputProbe:
    """What one input_fn returned in a scratch graph.

    Attributes:
      features: Spec of the features: a `tf.TensorSpec` or a dict of them.
      labels: Spec of the labels, or None.
      repeats_forever: True, False, or None when the size is unknown.
      tensors: It returned tensors, not a `tf.data.Dataset`.
    """

    features: Any
    labels: Any
    repeats_forever: Optional[bool]
    tensors: bool = False


def probe_input(input_fn: Callable, mode: str, what: str) -> InputProbe:
    """Calls a bound input_fn once in a scratch graph and reads what it returns.

    The graph has a global step, as Estimator creates one before it calls an
    input_fn: `tf.compat.v1.train.get_global_step()` works there too.
    """
    with tf.Graph().as_default(), calling(what):
        tf.compat.v1.train.create_global_step()
        result = user_code.call_input_fn(input_fn, mode)
        features, labels = user_code.element_spec(result)
        repeats = user_code.repeats_forever(input_fn, result)
    return InputProbe(features, labels, repeats, not isinstance(result, tf.data.Dataset))


def _placeholders(specs: Any) -> Any:
    return tf.nest.map_structure(
        lambda spec: tf.compat.v1.placeholder(spec.dtype, spec.shape), specs
    )


def dry_run_model_fn(estimator: tf.estimator.Estimator, probe: InputProbe, what: str) -> tf.Graph:
    """Builds the TRAIN graph once, as Estimator builds it, in a scratch graph.

    Args:
      estimator: Any Estimator; its `_call_model_fn` passes the model_fn
        the arguments it declares.
      probe: The training input's specs.
      what: Names the model for messages.

    Returns:
      The scratch graph, for checks of what the model_fn built.
    """
    with tf.Graph().as_default() as graph, calling(what):
        tf.compat.v1.train.create_global_step()
        features = _placeholders(probe.features)
        labels = None if probe.labels is None else _placeholders(probe.labels)
        estimators.call_model_fn(estimator, features, labels, TRAIN)
    return graph


def predict_error(estimator: tf.estimator.Estimator, probe: InputProbe) -> Optional[str]:
    """Builds the PREDICT graph an export needs; returns why it fails, or None.

    Many legacy model_fns have no PREDICT branch; Estimator only finds out
    when the evaluator exports, after training, so the job would fail there.
    """
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        try:
            estimators.call_model_fn(estimator, _placeholders(probe.features), None, PREDICT)
        except Exception as error:  # Any failure means: this model cannot be exported.
            return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None


def _check_accumulation(job: JobConfig, graph: tf.Graph) -> None:
    """Refuses accumulation or micro-batches that the model_fn's graph would silently skip."""
    steps = job.gradient_accumulation_steps
    if steps > 1 and not graph.get_collection(ACCUMULATING_OPTIMIZERS):
        raise UsageError(
            f"--gradient_accumulation_steps={steps}, but the model_fn {job.model_fn} applies "
            "its gradients directly, so every step would all-reduce and update as if it were "
            "1. Wrap its optimizer: `optimizer = model_fns.optimizers.with_gradient_accumulation("
            "optimizer, params)`, or pass --gradient_accumulation_steps=1."
        )
    if job.micro_batches > 1 and not graph.get_collection(MICRO_BATCH_COLLECTION):
        raise UsageError(
            f"--micro_batches={job.micro_batches}, but the model_fn {job.model_fn} computes "
            "each batch whole. Build its update with `loss, train_op = model_fns.optimizers."
            "minimize_in_micro_batches(optimizer, loss_fn, features, labels, "
            "params['micro_batches'], global_step)`, or pass --micro_batches=1."
        )


def named_specs(features: Any) -> Mapping[str, tf.TensorSpec]:
    """The features' specs as a dict; a bare tensor is named `image`."""
    return dict(features) if isinstance(features, Mapping) else {"image": features}


def build_keras_model(job: JobConfig, specs: Mapping[str, Any]) -> tf.keras.Model:
    """Calls the `--keras_model` builder, with `params` if it takes an argument.

    Raises:
      UsageError: if it returns anything but a Keras model.
    """
    build = KERAS_MODELS.get(job.keras_model)
    with calling(f"--keras_model={job.keras_model}"):
        if fn_args(build):
            shapes = {name: spec.shape.as_list()[1:] for name, spec in named_specs(specs).items()}
            model = build({**job.model_params, "feature_shapes": shapes})
        else:
            model = build()
    if not isinstance(model, tf.keras.Model):
        raise UsageError(
            f"--keras_model={job.keras_model} returned {type(model).__name__}; expected a "
            "compiled tf.keras.Model."
        )
    return model


def build_estimator(
    job: JobConfig, specs: Any, config: tf.estimator.RunConfig
) -> tf.estimator.Estimator:
    """Calls the `--estimator` builder with `config` and, if it takes them, `params`.

    The builder may take `(config, params)`, `(config)` or `(params, config)`
    by name; `params` holds the job's params, `feature_specs` (the input's
    `{name: tf.TensorSpec}`) and `warm_start_from`. TF 2 (`tf.estimator`) and
    TF 1 (`tf.compat.v1.estimator`) estimators are both accepted.

    Raises:
      UsageError: if the builder takes no `config`, or returns no Estimator.
    """
    build = ESTIMATORS.get(job.estimator)
    accepted = fn_args(build)
    if "config" not in accepted:
        raise UsageError(
            f"--estimator={job.estimator} is {user_code.describe(build)}: it must take "
            "`config` and build the estimator with it (`DNNClassifier(..., config=config)`), "
            "or the job's strategy and model_dir would not reach it. For a script that "
            "builds its own estimator, run it whole with the launcher's --script."
        )
    params = {
        **job.model_params,
        "feature_specs": named_specs(specs),
        "warm_start_from": job.warm_start_from,
    }
    arguments = {"config": config, "params": params}
    with calling(f"--estimator={job.estimator}"):
        estimator = build(**{name: arguments[name] for name in accepted if name in arguments})
    if not isinstance(estimator, tf.compat.v1.estimator.Estimator):
        raise UsageError(
            f"--estimator={job.estimator} returned {type(estimator).__name__}; expected a "
            "tf.estimator.Estimator (or tf.compat.v1.estimator.*) built with the RunConfig it "
            "is given, such as tf.estimator.DNNClassifier(..., config=config)."
        )
    if job.warm_start_from and estimators.warm_start_settings(estimator) is None:
        raise UsageError(
            f"--warm_start_from={job.warm_start_from} did not reach the estimator that "
            f"--estimator={job.estimator} built, which would start from fresh weights. Pass "
            "it on in the builder: `warm_start_from=params['warm_start_from']` (the builder "
            "must take `params`)."
        )
    return estimator


def model_fn_estimator(
    job: JobConfig, model_fn: Callable, config: tf.estimator.RunConfig
) -> tf.estimator.Estimator:
    """A `tf.estimator.Estimator` of a model_fn, given `params` only if it declares them."""
    return tf.estimator.Estimator(
        model_fn,
        config=config,
        params=job.model_params if user_code.takes_params(model_fn) else None,
        warm_start_from=job.warm_start_from,
    )


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What `preflight` resolved.

    Attributes:
      input_fn: The training input_fn, bound to its params.
      eval_input_fn: The evaluation input_fn, bound to its params.
      feature_specs: Spec of the evaluation input's features, batch dimension
        included: a dict of `tf.TensorSpec`, or one for bare-tensor features.
      eval_steps: Batches each evaluation reads; None reads to the end.
      exports: The SavedModels to export: the job's `exports`, or none when
        the model cannot build a PREDICT graph.
      model_fn: The model_fn, or None when the job uses a Keras model or an
        estimator builder.
      pitfalls: Multi-worker pitfalls found (warnings only: fatal ones raise).
      train_input_ends: Whether the training input is known to end by itself
        (a Dataset of finite size, `numpy_input_fn` with `num_epochs`).
    """

    input_fn: Callable
    eval_input_fn: Callable
    feature_specs: Any
    eval_steps: Optional[int]
    exports: Tuple[str, ...]
    model_fn: Optional[Callable]
    pitfalls: Tuple[pitfalls.Pitfall, ...] = ()
    train_input_ends: bool = False


def _bind(name: str, flag: str, params: Mapping[str, Any]) -> Callable:
    input_fn = INPUT_FNS.get(name)
    user_code.check_input_fn_args(input_fn, name, flag)
    prepare_input(name, params)
    return user_code.present_input_fn(input_fn, params)


def _exports(
    job: JobConfig, estimator: tf.estimator.Estimator, probe: InputProbe, what: str
) -> Tuple[str, ...]:
    if not job.exports:
        return ()
    error = predict_error(estimator, probe)
    if error is None:
        return job.exports
    logging.warning("%s", NO_EXPORT_MESSAGE.format(what=what, error=error))
    return ()


def _eval_pitfalls(job: JobConfig, input_fn: Callable, probe: InputProbe) -> list:
    """Warnings about the evaluation input: the training data, or a size nothing bounds."""
    found = []
    accepted = fn_args(input_fn.user_fn)
    params_differ = bool(job.eval_params) and "params" in accepted
    if not job.eval_input_fn and "mode" not in accepted and not params_differ:
        message = EVAL_ON_TRAINING_INPUT.format(name=job.input_fn)
        found.append(pitfalls.Pitfall("eval-on-training-input", message, False))
    return found


def _eval_steps(job: JobConfig, probe: InputProbe) -> Optional[int]:
    """Batches per evaluation: --eval_steps, else EvalSpec's default where nothing ends it.

    A Dataset of unknown size is read to its end: it reads files, and one that
    repeats shows as infinite. Tensors (an iterator's `get_next()`) may repeat
    unseen: they get EvalSpec's bound, which ends a shorter input no sooner.
    """
    if job.eval_steps is not None:
        return job.eval_steps
    if probe.repeats_forever:
        why = "repeats forever"
    elif probe.repeats_forever is None and probe.tensors:
        why = "returns tensors (as from an iterator's get_next()), whose number is unknown"
    else:
        return None
    steps = user_code.DEFAULT_EVAL_STEPS
    logging.warning(
        "%s", user_code.BOUNDED_EVAL_MESSAGE.format(name=job.eval_input_name, why=why, steps=steps)
    )
    return steps


def preflight(job: JobConfig, num_workers: int = 1) -> Preflight:
    """Resolves names, prepares data, builds the model once and checks for pitfalls.

    Args:
      job: The job.
      num_workers: Training workers of the cluster, for the sharding check.

    Returns:
      What was resolved, with the warnings found.

    Raises:
      UsageError: for an unknown name, missing data, bad parameters, an
        input_fn or model_fn Estimator cannot call, or a fatal pitfall (the
        message lists every pitfall found, with its fix).
      UserCodeError: when the user's input_fn or model_fn raises.
    """
    input_fn = _bind(job.input_fn, "--input_fn", job.model_params)
    if job.eval_input_fn:
        eval_input_fn = _bind(job.eval_input_fn, "--eval_input_fn", job.eval_model_params)
    else:
        eval_input_fn = user_code.present_input_fn(input_fn.user_fn, job.eval_model_params)
    train_probe = probe_input(input_fn, TRAIN, f"--input_fn={job.input_fn} (mode TRAIN)")
    eval_probe = probe_input(eval_input_fn, EVAL, f"--eval_input_fn={job.eval_input_name}")
    found = [pitfalls.check_input_fn(input_fn.user_fn, job.input_fn, num_workers)]
    found += _eval_pitfalls(job, input_fn, eval_probe)
    config = tf.estimator.RunConfig(model_dir=job.run.model_dir)
    model_fn = None
    exports = job.exports
    if job.keras_model:
        with tf.Graph().as_default():
            found += pitfalls.check_keras_model(
                build_keras_model(job, eval_probe.features), job.keras_model
            )
    elif job.estimator:
        with tf.Graph().as_default():
            estimator = build_estimator(job, eval_probe.features, config)
        dry_run_model_fn(estimator, train_probe, f"--estimator={job.estimator}")
        exports = _exports(job, estimator, eval_probe, f"--estimator={job.estimator}")
    else:
        model_fn = MODEL_FNS.get(job.model_fn)
        user_code.check_model_fn_args(model_fn, job.model_fn)
        estimator = model_fn_estimator(job, model_fn, config)
        graph = dry_run_model_fn(estimator, train_probe, f"--model_fn={job.model_fn}")
        _check_accumulation(job, graph)
        exports = _exports(job, estimator, eval_probe, f"--model_fn={job.model_fn}")
    found = [pitfall for pitfall in found if pitfall is not None]
    if any(pitfall.fatal for pitfall in found):
        raise UsageError(pitfalls.format_report(found))
    (logging.warning if found else logging.info)("%s", pitfalls.format_report(found))
    return Preflight(
        input_fn,
        eval_input_fn,
        eval_probe.features,
        _eval_steps(job, eval_probe),
        exports,
        model_fn,
        tuple(found),
        train_probe.repeats_forever is False,
    )
