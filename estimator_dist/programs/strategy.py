"""The strategies a legacy script's estimator trains with on its task.

A script whose RunConfig sets no `train_distribute` gets the one its task
needs (MultiWorkerMirroredStrategy with --communication on the chief and
workers, a local MirroredStrategy on the evaluator); a strategy the script
built itself is kept, and a MultiWorkerMirroredStrategy then all-reduces
sparse gradients as dense tensors (`estimator_dist.tf_runtime.patches`).
`with_distribution` and `set_run_config` give an Estimator other strategies
as if its constructor had received them. `--mixed_precision` turns its
grappler rewrite on in the estimator's session config, the script's own
settings kept (`estimator_dist.base.precision`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any, Optional

from estimator_dist.base import precision as precision_lib
from estimator_dist.base.cluster import EVALUATOR, ClusterConfig
from estimator_dist.base.errors import UsageError
from estimator_dist.programs.config import PROGRAM, ScriptConfig
from run_config.names import MULTI_WORKER_MIRRORED, OFF, PARAMETER_SERVER

if TYPE_CHECKING:
    import tensorflow as tf

    from run_config.strategies import Strategies

#: A single-process strategy in a script run on several workers.
LOCAL_STRATEGY = (
    "the script's RunConfig sets train_distribute={strategy}, which trains in one "
    "process, but TF_CONFIG has {workers} workers, which would wait for each other "
    "forever. Remove train_distribute (then {program} gives every task the strategy it "
    "needs) or build tf.distribute.MultiWorkerMirroredStrategy()."
)

#: Parameter servers for a script that brings no strategy.
PS_WITHOUT_STRATEGY = (
    "TF_CONFIG lists {ps} ps task(s), but the script's RunConfig sets no train_distribute, and "
    "the MultiWorkerMirroredStrategy {program} would give it uses no parameter servers. Build "
    "train_distribute=tf.compat.v1.distribute.experimental.ParameterServerStrategy() in the "
    "script, or run the job without ps tasks."
)


def _is_collective(strategy: Optional[tf.distribute.Strategy]) -> bool:
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        CollectiveAllReduceExtended,
    )

    return strategy is not None and isinstance(strategy.extended, CollectiveAllReduceExtended)


def with_distribution(
    config: tf.estimator.RunConfig,
    train_distribute: Optional[tf.distribute.Strategy],
    eval_distribute: Optional[tf.distribute.Strategy],
) -> tf.estimator.RunConfig:
    """A copy of `config` with other strategies, as if they had been given to its constructor.

    `RunConfig.replace` only swaps the fields: the distribute coordinator mode
    and the cluster settings that RunConfig derives from TF_CONFIG and the
    strategy when it is built would stay those of the old strategy. So after
    the replacement this runs what `RunConfig.__init__` runs for a config with
    a strategy (`estimator_training.init_run_config`). A config built without a
    strategy on a task of a cluster was also given a default session config
    with device filters for between-graph replication; that one is dropped, as
    the constructor would not have made it.

    Args:
      config: The script's RunConfig.
      train_distribute: The training strategy.
      eval_distribute: The evaluation strategy, or None.

    Returns:
      A new RunConfig; `config` is unchanged.
    """
    from tensorflow.python.distribute import estimator_training

    session_config = config.session_config
    if session_config is not None and session_config == (
        config._get_default_session_config_distributed()
    ):
        session_config = None
    replaced = config.replace(
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
        session_config=session_config,
    )
    estimator_training.init_run_config(replaced, json.loads(os.environ.get("TF_CONFIG") or "{}"))
    return replaced


def set_run_config(estimator: tf.estimator.Estimator, config: tf.estimator.RunConfig) -> None:
    """Makes `estimator` use `config`, with everything `Estimator.__init__` derives from it.

    The estimator's model_dir stays: `config` must have the same one.
    """
    from tensorflow_estimator.python.estimator import estimator as estimator_lib

    estimator._config = config
    estimator._train_distribution = config.train_distribute
    estimator._eval_distribution = config.eval_distribute
    estimator._session_config = config.session_config
    estimator._device_fn = config.device_fn or estimator_lib._get_replica_device_setter(config)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """The strategies a call of train_and_evaluate runs with, and where they came from."""

    train: Optional[tf.distribute.Strategy]
    eval: Optional[tf.distribute.Strategy]
    name: str
    injected: bool
    communication: Optional[str]
    effective_communication: Optional[str]
    precision: precision_lib.Precision = precision_lib.decide(precision_lib.OFF, (), (), False)


def distribute(
    estimator: Any,
    cluster: ClusterConfig,
    config: ScriptConfig,
    earlier: Optional[Distribution] = None,
) -> Distribution:
    """Gives the estimator the strategies and precision its task needs; returns what it runs with.

    Args:
      earlier: What an earlier estimator of this process was given. Its
        strategy is given again: collective instance keys restart in a new
        strategy, and the server of this process remembers each key's shape,
        so a second model on a new strategy would all-reduce against the
        first one's shapes.

    Raises:
      UsageError: for a strategy that cannot run on the cluster, or a
        `--mixed_precision` this machine cannot compute in.
    """
    precision = precision_lib.resolve(config.precision.mixed_precision)
    distribution = _distribute(estimator, cluster, config, earlier)
    if precision.used != precision_lib.OFF:
        _set_session_config(estimator, precision)
    return dataclasses.replace(distribution, precision=precision)


def _set_session_config(estimator: Any, precision: precision_lib.Precision) -> None:
    """Turns `precision`'s rewrite on in the estimator's session config, the rest kept.

    Set on the estimator's RunConfig in place: `RunConfig.replace` would
    deep-copy the strategy it holds, which must stay the one this task built.
    """
    import tensorflow as tf

    run_config = estimator._config
    given = run_config.session_config or tf.compat.v1.ConfigProto(allow_soft_placement=True)
    distributed = bool(run_config.cluster_spec.as_dict())
    session_config = precision_lib.rewrite_session_config(precision, given, distributed)
    run_config._session_config = session_config
    estimator._session_config = session_config


def _distribute(
    estimator: Any,
    cluster: ClusterConfig,
    config: ScriptConfig,
    earlier: Optional[Distribution],
) -> Distribution:
    """`distribute`'s strategies."""
    from estimator_dist.tf_runtime import patches
    from run_config.strategies import StrategyConfig, communication_of, make_strategies

    run_config = estimator._config
    own = run_config.train_distribute
    evaluation = run_config.eval_distribute
    if own is None and cluster.num_ps and cluster.task_type != EVALUATOR:
        raise UsageError(PS_WITHOUT_STRATEGY.format(ps=cluster.num_ps, program=PROGRAM))
    if own is None or cluster.task_type == EVALUATOR:
        # The evaluator gets a local strategy of either kind; the name only has
        # to fit the cluster.
        name = PARAMETER_SERVER if cluster.num_ps else MULTI_WORKER_MIRRORED
        wanted = StrategyConfig(name, config.communication, config.collective_timeout)
        if earlier is not None and earlier.injected:
            set_run_config(estimator, with_distribution(run_config, earlier.train, evaluation))
            return dataclasses.replace(earlier, eval=evaluation)
        strategies: Strategies = make_strategies(wanted, OFF, cluster)
        if cluster.task_type == EVALUATOR and _is_collective(evaluation):
            # Built by the script on the evaluator, where it is a local strategy
            # (`tf_runtime.patches`, patch 5); evaluation needs none.
            evaluation = None
        set_run_config(
            estimator, with_distribution(run_config, strategies.train_distribute, evaluation)
        )
        return Distribution(
            strategies.train_distribute,
            evaluation,
            strategies.train_name,
            True,
            strategies.communication if strategies.effective_communication else None,
            strategies.effective_communication,
        )
    collective = _is_collective(own)
    separate = type(own).__name__.startswith("ParameterServerStrategy")
    if cluster.num_workers > 1 and not (collective or separate):
        raise UsageError(
            LOCAL_STRATEGY.format(
                strategy=type(own).__name__, workers=cluster.num_workers, program=PROGRAM
            )
        )
    communication = None
    if collective:
        patches.set_gradient_transport(own)
        communication = own.extended._communication_options.implementation.name
    effective = communication_of(own)
    return Distribution(own, evaluation, type(own).__name__, False, communication, effective)


def run_record(
    distribution: Distribution,
    cluster: ClusterConfig,
    config: ScriptConfig,
    model_dir: str,
    max_steps: Optional[int],
) -> dict:
    """What a script's task really runs, for the chief's `run_record.json`."""
    from estimator_dist.task import records

    train = distribution.train
    return {
        "role": cluster.role,
        "task_type": cluster.task_type,
        "task_index": cluster.task_index,
        "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
        "tf_config_normalisations": list(cluster.notes),
        "num_workers": cluster.num_workers,
        "num_ps": cluster.num_ps,
        "num_replicas": train.num_replicas_in_sync if train is not None else 1,
        "strategy": distribution.name,
        "strategy_class": type(train).__name__ if train is not None else None,
        "strategy_injected": distribution.injected,
        "eval_strategy_class": (
            type(distribution.eval).__name__ if distribution.eval is not None else None
        ),
        "communication_requested": distribution.communication,
        "communication_used": distribution.effective_communication,
        "mixed_precision": distribution.precision.to_record(),
        "script": config.path,
        "script_args": list(config.args),
        "model_dir": model_dir,
        "max_steps": max_steps,
        "versions": records.library_versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
