"""Estimator's link to TensorFlow's distribute coordinator, for TensorFlow 2.16 and later.

`tensorflow_estimator` 2.15 imports `tensorflow.python.distribute.estimator_training`
and calls five functions of it; TensorFlow 2.16 removed that module, while the
coordinator it drives (`distribute_coordinator`, `distribute_coordinator_context`)
is still shipped, unchanged, in 2.21. `estimator_dist.tf_runtime.compat` registers
this module under the removed name on those versions only. What Estimator expects
of each function:

* `init_run_config(config, tf_config)`, from `RunConfig.__init__` when a
  strategy is set: with a cluster in TF_CONFIG (and no `master` job), mark the
  config for the coordinator in INDEPENDENT_WORKER mode and keep only the
  cluster, since each task's role comes from the coordinator; without one, let
  RunConfig read TF_CONFIG itself, as it does with no strategy.
* `should_run_distribute_coordinator(config)`, from `train_and_evaluate`.
* `train_and_evaluate(estimator, train_spec, eval_spec, executor_cls)`: run the
  coordinator, which starts this task's server and calls back with a copy of the
  strategy configured for the task; train a deep copy of the estimator with it,
  or, on the evaluator, evaluate continuously with `executor_cls`.
* `estimator_train` / `estimator_evaluate`, from `Estimator.train` / `evaluate`
  on a marked config: only a standalone client (`experimental_distribute` with a
  `remote_cluster`) may call them; on a task of a cluster they refuse, as
  TensorFlow 2.15 did.

Checked on TensorFlow 2.16.2, 2.18.1, 2.20.0 and 2.21.0 (the coordinator's
`run_distribute_coordinator` signature and `_WorkerContext` properties) by
`tests/estimator_dist/tf_runtime/compat_test.py` and every multi-worker test of
the suite on the 2.21 stack.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Optional

from tensorflow.python.distribute import distribute_coordinator as coordinator
from tensorflow.python.distribute import distribute_coordinator_context as coordinator_context
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.training import server_lib

INDEPENDENT_WORKER = coordinator.CoordinatorMode.INDEPENDENT_WORKER
STANDALONE_CLIENT = coordinator.CoordinatorMode.STANDALONE_CLIENT
_CHIEF, _WORKER, _PS, _EVALUATOR = "chief", "worker", "ps", "evaluator"

#: What `Estimator.train` / `evaluate` raise on a task of a cluster (TensorFlow 2.15's words).
ONLY_STANDALONE_CLIENT = (
    "Only `STANDALONE_CLIENT` mode is supported when you call `estimator.{method}`"
)


def init_run_config(config: Any, tf_config: dict) -> None:
    """Marks `config` for the coordinator, or lets it read TF_CONFIG itself."""
    distribute = config._experimental_distribute
    for name in ("train_distribute", "eval_distribute"):
        given = getattr(distribute, name, None) if distribute else None
        if given:
            if getattr(config, f"_{name}"):
                raise ValueError(f"Either `{name}` or `experimental_distribute.{name}` can be set.")
            setattr(config, f"_{name}", given)
    cluster_spec = server_lib.ClusterSpec(tf_config.get("cluster", {}))
    # A local task's settings, until the coordinator's worker context fills them.
    config._init_distributed_setting_from_environment_var({})
    remote_cluster = getattr(distribute, "remote_cluster", None) if distribute else None
    if config._train_distribute and remote_cluster:
        if cluster_spec:
            raise ValueError(
                'Cannot set both "cluster_spec" of TF_CONFIG and '
                "`experimental_distribute.remote_cluster`"
            )
        config._distribute_coordinator_mode = STANDALONE_CLIENT
        config._cluster_spec = remote_cluster
        return
    if not cluster_spec or "master" in cluster_spec.jobs or not config._train_distribute:
        config._distribute_coordinator_mode = None
        config._init_distributed_setting_from_environment_var(tf_config)
        config._maybe_overwrite_session_config_for_distributed_training()
        return
    # The task's role, master and replica counts come from the coordinator's
    # worker context, once it runs (`fill_from_worker_context`).
    config._cluster_spec = cluster_spec
    config._distribute_coordinator_mode = INDEPENDENT_WORKER


def should_run_distribute_coordinator(config: Any) -> bool:
    """Whether `train_and_evaluate` goes through the coordinator."""
    mode = getattr(config, "_distribute_coordinator_mode", None)
    return mode in (INDEPENDENT_WORKER, STANDALONE_CLIENT) and bool(config.cluster_spec)


def fill_from_worker_context(config: Any, context: Any) -> None:
    """Sets a task copy's RunConfig from the coordinator's context of this task."""
    config._service = None
    config._cluster_spec = cluster_spec = context.cluster_spec
    config._task_type = context.task_type
    config._task_id = context.task_id
    config._master = config._evaluation_master = context.master_target
    config._is_chief = context.is_chief
    if not cluster_spec:
        config._num_ps_replicas, config._num_worker_replicas = 0, 1
        config._global_id_in_cluster = 0
    elif config._task_type == _EVALUATOR:
        # The evaluator trains nothing and knows no other task.
        config._cluster_spec = server_lib.ClusterSpec({})
        config._num_ps_replicas, config._num_worker_replicas = 0, 0
        config._global_id_in_cluster = None
    else:
        jobs = cluster_spec.as_dict()
        config._num_ps_replicas = len(jobs.get(_PS, []))
        config._num_worker_replicas = len(jobs.get(_CHIEF, [])) + len(jobs.get(_WORKER, []))
        config._global_id_in_cluster = global_id(cluster_spec, config._task_type, config._task_id)


def global_id(cluster_spec: server_lib.ClusterSpec, task_type: Optional[str], task_id: int) -> int:
    """The task's number among all tasks: the chief first, then jobs by name, `ps` last.

    >>> spec = server_lib.ClusterSpec({"chief": ["a:1"], "worker": ["b:1", "c:1"], "ps": ["d:1"]})
    >>> [global_id(spec, "worker", 1), global_id(spec, "ps", 0), global_id(spec, None, 0)]
    [2, 3, 0]
    """
    if not task_type:
        return 0
    first = 0
    for job in sorted(cluster_spec.jobs, key=lambda job: (job != _CHIEF, job == _PS, job)):
        if job == task_type:
            return first + task_id
        first += len(cluster_spec.job_tasks(job))
    raise RuntimeError(f"task type {task_type!r} is not in the cluster {cluster_spec.as_dict()}")


def _task_copy(estimator: Any, strategy: Any, training: bool) -> Any:
    """A deep copy of `estimator` for this task, with the strategy the coordinator configured."""
    local = copy.deepcopy(estimator)
    if training:
        local._config._train_distribute = local._train_distribution = strategy
    else:
        local._config._eval_distribute = local._eval_distribution = strategy
    fill_from_worker_context(local._config, coordinator_context.get_current_worker_context())
    # Its own train() and evaluate() must not call the coordinator again.
    local._config._distribute_coordinator_mode = None
    return local


def train_and_evaluate(
    estimator: Any, train_spec: Any, eval_spec: Any, executor_cls: Callable[..., Any]
) -> None:
    """Runs this task's part of `tf.estimator.train_and_evaluate` through the coordinator."""
    config = estimator._config
    if not config._distribute_coordinator_mode:
        raise ValueError("Distribute coordinator mode is not specified in `RunConfig`.")

    def train(strategy: Any) -> None:
        local = _task_copy(estimator, strategy, training=True)
        context = coordinator_context.get_current_worker_context()
        # A standalone client runs every worker's function in its own threads:
        # the user's hooks, whose tensors live in one graph, run on the chief's.
        keep = config._distribute_coordinator_mode == INDEPENDENT_WORKER or context.is_chief
        hooks = list(train_spec.hooks) if keep else []
        local.train(input_fn=train_spec.input_fn, max_steps=train_spec.max_steps, hooks=hooks)

    def evaluate(strategy: Any) -> None:
        local = _task_copy(estimator, strategy, training=False)
        executor_cls(local, train_spec, eval_spec)._start_continuous_evaluation()

    coordinator.run_distribute_coordinator(
        train,
        config.train_distribute,
        evaluate,
        config.eval_distribute,
        mode=config._distribute_coordinator_mode,
        # A task of a cluster: the coordinator reads its role from TF_CONFIG itself.
        cluster_spec=config.cluster_spec
        if config._distribute_coordinator_mode == STANDALONE_CLIENT
        else None,
        session_config=config.session_config,
    )


def estimator_train(estimator: Any, train_distributed_fn: Callable[..., Any], hooks: List) -> Any:
    """`Estimator.train` for a standalone client; refused on a task of a cluster."""
    return _standalone_client(estimator, train_distributed_fn, hooks, training=True)


def estimator_evaluate(
    estimator: Any, evaluate_distributed_fn: Callable[..., Any], hooks: List
) -> Any:
    """`Estimator.evaluate` for a standalone client; refused on a task of a cluster."""
    return _standalone_client(estimator, evaluate_distributed_fn, hooks, training=False)


def _standalone_client(
    estimator: Any, distributed_fn: Callable[..., Any], hooks: List, training: bool
) -> Any:
    config = estimator._config
    method = "train" if training else "evaluate"
    strategy = config.train_distribute if training else config.eval_distribute
    cluster_spec = multi_worker_util.normalize_cluster_spec(config.cluster_spec)
    if _EVALUATOR in cluster_spec.jobs:
        raise ValueError(
            f"'evaluator' job is not supported if you don't use `train_and_evaluate`"
            f" (estimator.{method})"
        )
    if config._distribute_coordinator_mode != STANDALONE_CLIENT:
        raise ValueError(ONLY_STANDALONE_CLIENT.format(method=method))
    if strategy.extended.experimental_between_graph:
        raise ValueError(
            f"`Estimator.{method}` API is not supported for {type(strategy).__name__} with "
            "`STANDALONE_CLIENT` mode."
        )

    def run(task_strategy: Any) -> Any:
        local = _task_copy(estimator, task_strategy, training)
        chief_hooks = hooks if coordinator_context.get_current_worker_context().is_chief else []
        result = distributed_fn(local, task_strategy, chief_hooks)
        return local if training else result

    return coordinator.run_distribute_coordinator(
        run,
        strategy,
        mode=STANDALONE_CLIENT,
        cluster_spec=cluster_spec,
        session_config=config.session_config,
    )
