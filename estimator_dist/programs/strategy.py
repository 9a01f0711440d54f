"""The strategies a legacy script's estimator trains with on its task.

On a task of a cluster, a script whose RunConfig sets no `train_distribute`
gets the one its task needs (a MultiWorkerMirroredStrategy made from the
strategy flags, `ScriptConfig.strategy`, on the chief and workers, a local
MirroredStrategy on the evaluator); a
strategy the script built itself is kept, and a MultiWorkerMirroredStrategy
then all-reduces sparse gradients as dense tensors
(`estimator_dist.tf_runtime.patches`). In one process the script trains with
the strategy it set, or none, as in plain TensorFlow.
A strategy the program set (through `train_distribute`, `eval_distribute` or
`experimental_distribute`) is never replaced, on any task: on the evaluator,
outside the cluster, a MultiWorkerMirroredStrategy the program built is a
local one (`estimator_dist.tf_runtime.patches`, patch 5). The estimator gets
strategies as if its constructor had received them
(`estimator_dist.tf_runtime.estimators`). `--mixed_precision` turns its
grappler rewrite on in the estimator's session config, the script's own
settings kept (`estimator_dist.hardware.precision`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any, Optional

from absl import logging

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import EVALUATOR, ClusterConfig
from estimator_dist.hardware import precision as precision_lib
from estimator_dist.programs.config import PROGRAM, ScriptConfig
from run_config.names import OFF, PARAMETER_SERVER

if TYPE_CHECKING:
    import tensorflow as tf

    from run_config.strategies import Strategies

#: Logged when a single-machine strategy of the program is widened to the cluster.
LOCAL_STRATEGY = (
    "estimator_dist: the program's {strategy} mirrors the devices of one process; on "
    "{workers} workers each task trains instead with a MultiWorkerMirroredStrategy over the "
    "same devices, synchronised with the others (the program's evaluation strategy is kept)."
)

#: Logged when a program removed TF_CONFIG before it trains (a notebook's clean-up cell).
TF_CONFIG_RESTORED = (
    "estimator_dist: the program removed TF_CONFIG; this process is still task {role} of the "
    "cluster, so TF_CONFIG is set again before the estimator trains (without it each task "
    "would train alone, unsynchronised, into the one model_dir)."
)

#: Parameter servers for a script that brings no strategy.
PS_WITHOUT_STRATEGY = (
    "TF_CONFIG lists {ps} ps task(s), but the script's RunConfig sets no train_distribute, and "
    "the MultiWorkerMirroredStrategy {program} would give it uses no parameter servers. Build "
    "train_distribute=tf.compat.v1.distribute.experimental.ParameterServerStrategy() in the "
    "script, or run the job without ps tasks."
)


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
    """Turns `precision`'s rewrite on in the estimator's session config, the rest kept."""
    import tensorflow as tf

    from estimator_dist.tf_runtime import estimators

    run_config = estimators.run_config(estimator)
    given = run_config.session_config or tf.compat.v1.ConfigProto(allow_soft_placement=True)
    distributed = bool(run_config.cluster_spec.as_dict())
    session_config = precision_lib.rewrite_session_config(precision, given, distributed)
    estimators.set_session_config(estimator, session_config)


def _distribute(
    estimator: Any,
    cluster: ClusterConfig,
    config: ScriptConfig,
    earlier: Optional[Distribution],
) -> Distribution:
    """`distribute`'s strategies."""
    from estimator_dist.tf_runtime import estimators, patches
    from estimator_dist.tf_runtime import strategies as strategies_lib
    from run_config.strategies import communication_of, make_strategies

    run_config = estimators.run_config(estimator)
    own = run_config.train_distribute
    evaluation = run_config.eval_distribute
    if not cluster.is_distributed:  # One process trains as plain TensorFlow does.
        name = type(own).__name__ if own is not None else "none"
        return Distribution(own, evaluation, name, False, None, communication_of(own))
    if "TF_CONFIG" not in os.environ:  # Strategies and RunConfig read it at their call.
        logging.info("%s", TF_CONFIG_RESTORED.format(role=cluster.role))
        os.environ["TF_CONFIG"] = cluster.to_json()
    local = own is not None and not (
        strategies_lib.is_collective(own) or type(own).__name__.startswith("ParameterServer")
    )
    if local and cluster.task_type != EVALUATOR and cluster.num_workers > 1:
        logging.info(
            "%s",
            LOCAL_STRATEGY.format(strategy=type(own).__name__, workers=cluster.num_workers),
        )
        own = None
    if own is None:
        if cluster.num_ps and cluster.task_type != EVALUATOR:
            raise UsageError(PS_WITHOUT_STRATEGY.format(ps=cluster.num_ps, program=PROGRAM))
        # The evaluator gets a local strategy of either kind; the name only has
        # to fit the cluster.
        name = PARAMETER_SERVER if cluster.num_ps else config.strategy.name
        wanted = dataclasses.replace(config.strategy, name=name)
        if earlier is not None and earlier.injected:
            given = estimators.with_distribution(run_config, earlier.train, evaluation)
            estimators.set_run_config(estimator, given)
            return dataclasses.replace(earlier, eval=evaluation)
        strategies: Strategies = make_strategies(wanted, OFF, cluster)
        if cluster.task_type == EVALUATOR and strategies_lib.is_collective(evaluation):
            # Built by the script on the evaluator, where it is a local strategy
            # (`tf_runtime.patches`, patch 5); evaluation needs none.
            evaluation = None
        given = estimators.with_distribution(run_config, strategies.train_distribute, evaluation)
        estimators.set_run_config(estimator, given)
        return Distribution(
            strategies.train_distribute,
            evaluation,
            strategies.train_name,
            True,
            strategies.communication if strategies.effective_communication else None,
            strategies.effective_communication,
        )
    communication = None
    if strategies_lib.is_collective(own):
        patches.set_gradient_transport(own)
        communication = strategies_lib.collective_implementation(own)
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
