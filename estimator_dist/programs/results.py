"""What the chief of a program shares with its other tasks through model_dir, and how.

An evaluation's dict crosses tasks with its numpy types (`encode_metrics`,
`decode_metrics`), and the chief clears model_dir for a program that deletes
it, keeping the launcher's task logs (`clear`). Used by
`estimator_dist.programs.loop`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf


def encode_metrics(metrics: Mapping[str, Any]) -> Dict[str, dict]:
    """A JSON form of an evaluation's dict that `decode_metrics` turns back, types included.

    The keys keep their order (a printed dict reads the same on every task),
    though the JSON file sorts them.

    >>> import json
    >>> metrics = {"loss": np.float32(0.5), "global_step": np.int64(3)}
    >>> decoded = decode_metrics(json.loads(json.dumps(encode_metrics(metrics), sort_keys=True)))
    >>> {name: (value.dtype.name, value.item()) for name, value in decoded.items()}
    {'loss': ('float32', 0.5), 'global_step': ('int64', 3)}
    """
    encoded = {}
    for order, (name, value) in enumerate(metrics.items()):
        array = np.asarray(value)
        encoded[name] = {"dtype": array.dtype.str, "value": array.tolist(), "order": order}
    return encoded


def decode_metrics(encoded: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The dict `encode_metrics` encoded: numpy scalars and arrays of the same dtypes, in order."""
    entries = sorted(encoded.items(), key=lambda item: item[1].get("order", 0))
    return {
        name: np.asarray(entry["value"], dtype=np.dtype(entry["dtype"]))[()]
        for name, entry in entries
    }


def clear(target: str, model_dir: str, keep: Tuple[str, ...]) -> None:
    """Deletes `target` (model_dir or a directory above it), keeping model_dir's `keep` entries."""
    if not tf.io.gfile.exists(target):
        return
    for name in tf.io.gfile.listdir(target):
        entry = os.path.join(target, name.rstrip("/"))
        if entry == model_dir or model_dir.startswith(entry.rstrip("/") + "/"):
            clear(entry, model_dir, keep)
        elif not (target == model_dir and name.rstrip("/") in keep):
            if tf.io.gfile.isdir(entry):
                tf.io.gfile.rmtree(entry)
            else:
                tf.io.gfile.remove(entry)


def placed(path: str, model_dir: str) -> Optional[str]:
    """Where `path` is: "covers" (model_dir or a directory above), "below", or None (elsewhere)."""
    path, model_dir = path.rstrip("/") + "/", model_dir.rstrip("/") + "/"
    if model_dir.startswith(path):
        return "covers"
    return "below" if path.startswith(model_dir) else None
