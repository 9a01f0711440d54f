"""An Estimator and its RunConfig changed after they were built, as their constructors would.

A program builds its own estimator; on a task of a cluster the package gives
it the strategies the task needs (when the program set none), a session
config with `--mixed_precision`'s rewrite, or evaluates it outside the
cluster. `RunConfig.replace` only swaps fields, while the constructor derives
the distribute coordinator's mode and the cluster settings from the strategy
and TF_CONFIG, and `Estimator.__init__` copies some of them onto the
estimator: these functions redo that derivation, through the same glue
TensorFlow uses (`estimator_training.init_run_config`). They, and the other
private attributes of estimators and strategies the package reads, live here.
Checked on TensorFlow 2.15: `tests/estimator_dist/script_test.py` (a strategy
given later configures as if given to the constructor) and
`tests/estimator_dist/programs/strategy_test.py`.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.distribute import estimator_training
from tensorflow_estimator.python.estimator import estimator as estimator_lib


def with_distribution(
    config: tf.estimator.RunConfig,
    train_distribute: Optional[tf.distribute.Strategy],
    eval_distribute: Optional[tf.distribute.Strategy],
) -> tf.estimator.RunConfig:
    """A copy of `config` with other strategies, as if they had been given to its constructor.

    After `RunConfig.replace` this runs what `RunConfig.__init__` runs for a
    config with a strategy. A config built without a strategy on a task of a
    cluster was also given a default session config with device filters for
    between-graph replication; that one is dropped, as the constructor would
    not have made it. Strategies the config holds through
    `experimental_distribute` are replaced there too.

    Args:
      config: The program's RunConfig; unchanged.
      train_distribute: The training strategy.
      eval_distribute: The evaluation strategy, or None.

    Returns:
      A new RunConfig.
    """
    session_config = config.session_config
    if session_config is not None and session_config == (
        config._get_default_session_config_distributed()
    ):
        session_config = None
    replaced = config.replace(
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
        session_config=session_config,
        experimental_distribute=None,
    )
    estimator_training.init_run_config(replaced, json.loads(os.environ.get("TF_CONFIG") or "{}"))
    return replaced


def run_config(estimator: tf.estimator.Estimator) -> tf.estimator.RunConfig:
    """The estimator's own RunConfig (`Estimator.config` returns a deep copy, strategy included)."""
    return estimator._config


def set_run_config(estimator: tf.estimator.Estimator, config: tf.estimator.RunConfig) -> None:
    """Makes `estimator` use `config`, with everything `Estimator.__init__` derives from it.

    The estimator's model_dir stays: `config` must have the same one.
    """
    estimator._config = config
    estimator._train_distribution = config.train_distribute
    estimator._eval_distribution = config.eval_distribute
    estimator._session_config = config.session_config
    estimator._device_fn = config.device_fn or estimator_lib._get_replica_device_setter(config)


def set_session_config(estimator: tf.estimator.Estimator, session_config: Any) -> None:
    """Gives the estimator's RunConfig `session_config`, in place.

    `RunConfig.replace` would deep-copy the strategy the config holds, which
    must stay the one this task built.
    """
    estimator._config._session_config = session_config
    estimator._session_config = session_config


def local_copy(estimator: tf.estimator.Estimator) -> tf.estimator.Estimator:
    """A copy of `estimator` that evaluates in a local session, outside the cluster."""
    local = copy.deepcopy(estimator)
    config = local._config
    config._distribute_coordinator_mode = None
    config._train_distribute = config._eval_distribute = None
    config._cluster_spec = tf.train.ClusterSpec({})
    config._task_type, config._task_id = None, 0
    config._master = config._evaluation_master = ""
    config._num_worker_replicas, config._num_ps_replicas = 1, 0
    local._train_distribution = local._eval_distribution = None
    local._device_fn = None
    return local


def call_model_fn(estimator: tf.estimator.Estimator, features: Any, labels: Any, mode: str) -> Any:
    """Builds the estimator's graph for `mode` as `Estimator` does, in the current graph."""
    return estimator._call_model_fn(features, labels, mode, estimator.config)


def warm_start_settings(estimator: tf.estimator.Estimator) -> Any:
    """The estimator's `WarmStartSettings`, or None."""
    return estimator._warm_start_settings


def set_chief(config: tf.estimator.RunConfig, is_chief: bool) -> None:
    """Makes `config` say it is (or is not) the chief's, in place."""
    config._is_chief = is_chief
