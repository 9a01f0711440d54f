"""Process exit codes, readable by a scheduler's restart policy, and the lines around them.

Codes 1 to 127 mean "do not retry": the same command would fail again.
Codes 128 to 255 mean "retry": restarting the whole job from its latest
checkpoint can succeed. This is how Kubeflow's `ExitCode` restart policy reads
them, and how `estimator_dist.launch` decides whether to restart.

| code | name | meaning |
|---|---|---|
| 0 | OK | the task finished |
| 1 | FAILURE | an unexpected error; see the traceback |
| 2 | USAGE | bad flag, TF_CONFIG, name, parameter or missing data |
| 3 | BAD_DATA | a corrupt, truncated or mistyped record while training |
| 4 | CLUSTER_MISMATCH | the tasks disagree on the cluster or the job settings |
| 5 | USER_CODE | the model_fn, input_fn or script raised; the same code would raise again |
| 6 | INPUT_EXHAUSTED | the training input ran out before the last step; it must repeat |
| 7 | COLLECTIVE_MISMATCH | the tasks all-reduced tensors of different shapes or types |
| 8 | EVAL_UNENDING | an evaluation kept reading after training ended; bound it with --eval_steps |
| 9 | MODEL_DIR_UNWRITABLE | model_dir's storage refused a write: full, read-only, no permission |
| 150 | PEER_FAILURE | a collective operation failed: a peer died or the network failed |
| 151 | CLUSTER_TIMEOUT | the cluster did not assemble before the start-up deadline |
| 152 | STALLED | the global step did not move for the stall timeout |
| 153 | SESSION_RECOVERY | TensorFlow tried to restore this task alone, which diverges |
| 154 | PORT_IN_USE | this task's port is taken by another process |
| 155 | PREEMPTED | stopped on SIGTERM/SIGINT at a step every task agreed on, checkpointed |
| 156 | PEER_UNRESPONSIVE | a training peer stopped answering the heartbeat: frozen or cut off |
| 157 | SESSION_HUNG | session creation or the first step did not end within the stall timeout |
| 158 | FINAL_PHASE_HUNG | the end of training (final save, evaluation, export) made no progress |
| 159 | CHECKPOINT_GONE | the checkpoint being restored was deleted meanwhile (rotated away) |
| 160 | STORAGE_UNREACHABLE | the object storage holding the job's results did not answer in time |
"""

from typing import Optional

#: Starts the one line a task prints before a fail-fast exit.
FAILURE_PREFIX = "estimator_dist: task {role} failed"

OK = 0
FAILURE = 1
USAGE = 2
BAD_DATA = 3
CLUSTER_MISMATCH = 4
USER_CODE = 5
INPUT_EXHAUSTED = 6
COLLECTIVE_MISMATCH = 7
EVAL_UNENDING = 8
MODEL_DIR_UNWRITABLE = 9
PEER_FAILURE = 150
CLUSTER_TIMEOUT = 151
STALLED = 152
SESSION_RECOVERY = 153
PORT_IN_USE = 154
PREEMPTED = 155
PEER_UNRESPONSIVE = 156
SESSION_HUNG = 157
FINAL_PHASE_HUNG = 158
CHECKPOINT_GONE = 159
STORAGE_UNREACHABLE = 160


def name_of(code: int) -> Optional[str]:
    """The name of an exit code of the package, or None.

    >>> name_of(PEER_FAILURE), name_of(42)
    ('PEER_FAILURE', None)
    """
    for name, value in globals().items():
        if name.isupper() and isinstance(value, int) and value == code:
            return name
    return None


def is_retryable(code: int) -> bool:
    """Whether restarting the job may help: killed by a signal, or a code of 128 or more.

    Args:
      code: A `subprocess` return code; negative means killed by that signal.

    >>> is_retryable(PEER_FAILURE), is_retryable(USAGE), is_retryable(-9)
    (True, False, True)
    """
    return code < 0 or code >= 128
