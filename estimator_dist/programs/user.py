"""A legacy program's own code, as a task sees it: where it is, what its failures mean.

And which model_dir its estimators get (`shared_model_dir`), the policy that
`estimator_dist.tf_runtime.intercept` applies to every estimator it builds.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from typing import Dict, Optional, Sequence, Set, Tuple

from absl import logging

from estimator_dist.base.errors import Error, UserCodeError


def own_dirs() -> Tuple[str, ...]:
    """The directories of this package's code."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return here, os.path.join(os.path.dirname(here), "run_config")


def is_users(filename: str) -> bool:
    """Whether `filename` is user code: not Python's, not an installed package's, not ours."""
    paths = sysconfig.get_paths()
    others = tuple(os.path.realpath(p) for p in (paths["stdlib"], paths["purelib"]))
    real = os.path.realpath(filename)
    return not filename.startswith("<") and not real.startswith((*others, *own_dirs()))


def shown(path: str) -> str:
    """`path` relative to the current directory when it is below it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def user_frame(frames: Sequence[traceback.FrameSummary]) -> str:
    """`file:line: ` of the innermost frame of user code in `frames`, or ''."""
    for frame in reversed(frames):
        if is_users(frame.filename):
            return f"{shown(frame.filename)}:{frame.lineno}: "
    return ""


def user_code_error(error: BaseException, script: str) -> UserCodeError:
    """Explains an exception that the script, its model_fn or its input_fn raised (exit 5).

    Args:
      error: The exception, with its traceback.
      script: The script's path.
    """
    frames = traceback.extract_tb(error.__traceback__)
    users = [frame for frame in frames if is_users(frame.filename)]
    where = f" in {users[-1].name}() at {user_frame(users).rstrip(': ')}" if users else ""
    return UserCodeError(
        f"the script {shown(script)} raised {type(error).__name__}: {error}{where}. "
        "The traceback is in the log above. It would raise again on every task and after "
        "every restart, so the job stops: fix the code and run again."
    )


def explained(error: BaseException, script: str) -> BaseException:
    """What a failure ends the task with; the traceback of user code is printed first.

    An exception raised by this package's own code (its innermost frame is
    ours) is not the user's: it stays as it is, and ends the task with exit 1.
    """
    import tensorflow as tf

    frames = traceback.extract_tb(error.__traceback__)
    ours = bool(frames) and os.path.realpath(frames[-1].filename).startswith(own_dirs())
    if isinstance(error, (Error, tf.errors.OpError)) or ours:
        return error
    traceback.print_exception(type(error), error, error.__traceback__)
    return user_code_error(error, script)


def shared_model_dir(
    arguments: dict,
    given: Optional[str],
    temporary: Set[str],
    what: str,
    handed_out: Dict[str, str],
) -> Optional[str]:
    """Gives `arguments` (`model_dir`, `config`) a shared directory where theirs is not shared.

    That is no model_dir (a temporary one would be made) or a temporary
    directory the program made (`tempfile.mkdtemp()`, recorded in
    `temporary`): either way one per task, sharing no checkpoint. As in plain
    TensorFlow, where each such estimator gets a new temporary directory, each
    gets a directory of its own that every task shares: the first `given`,
    each later one `given/estimator-N` (every task builds the program's
    estimators in the same order); estimators given the same temporary
    directory share one. `handed_out` maps what was asked for to what was
    given, across the calls of one run.

    Returns:
      The model_dir the call will use, or None when it is left to the call.
    """
    config = arguments.get("config")
    own, configured = arguments.get("model_dir"), getattr(config, "model_dir", None)

    def unshared(path: Optional[str]) -> bool:
        return path is None or os.path.abspath(path) in temporary

    if not given or not (unshared(own) and unshared(configured)):
        return own or configured
    made = own or configured
    asked = os.path.abspath(made) if made else f"no model_dir #{len(handed_out) + 1}"
    shared = handed_out.get(asked)
    if shared is None:
        count = len(set(handed_out.values()))
        shared = given if count == 0 else os.path.join(given, f"estimator-{count + 1}")
        handed_out[asked] = shared
    logging.info(
        "estimator_dist: %s given %s uses %s, which every task shares.",
        what,
        f"the temporary directory {made} the program made" if made else "no model_dir",
        shared,
    )
    arguments["model_dir"] = shared
    if configured is not None:
        arguments["config"] = config.replace(model_dir=shared)
    return shared
