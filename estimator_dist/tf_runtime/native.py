"""What the package asks TensorFlow's compiled core, and the checkpoint state it rewrites.

Checked on TensorFlow 2.15: `tests/estimator_dist/hardware/cpus_test.py` and
`tests/estimator_dist/guards/checkpoints_test.py`.
"""

from __future__ import annotations

from typing import Optional, Sequence


def onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs oneDNN kernels (imports TensorFlow)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def write_checkpoint_state(
    model_dir: str,
    latest: str,
    paths: Sequence[str],
    timestamps: Optional[Sequence[float]],
) -> None:
    """Rewrites `model_dir/checkpoint` to name `latest` and `paths`, relative to `model_dir`.

    The public `tf.compat.v1.train.update_checkpoint_state` writes absolute
    paths, which a model_dir moved or mounted elsewhere no longer finds.
    """
    from tensorflow.python.checkpoint import checkpoint_management

    checkpoint_management.update_checkpoint_state_internal(
        model_dir,
        latest,
        all_model_checkpoint_paths=list(paths),
        all_model_checkpoint_timestamps=list(timestamps) if timestamps is not None else None,
        save_relative_paths=True,
    )
