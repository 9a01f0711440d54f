"""Sharded `input_fn(mode, input_context, params)` functions, by name.

`INPUT_FNS.get(name)` returns an Estimator input function; the name may
also be `package.module:function`. Registered:

| name | reads |
|---|---|
| `digits` | the embedded 8x8 digits (TFDS format, prepared on first use) |
| `mnist`, `fashion_mnist`, `cifar10` | those TFDS datasets, prepared under `data_dir` |
| `tfds` | any prepared TFDS dataset, `params["dataset"]` |
| `tfrecord` | TFRecord files of `tf.train.Example`: `files`, `features` |
| `csv` | CSV files: `files`, `columns` |
| `synthetic` | random images in memory, for benchmarks: `image_shape` |
| `tabular` | an embedded scikit-learn table (`dataset`: breast_cancer, diabetes, iris) |

`prepare_input(name, params)` writes the data of inputs that can be
generated offline (the embedded `digits`), loads the embedded `tabular`
data, and checks that the others are present and readable, before any
worker starts.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from estimator_dist.base.registry import Registry
from input_fns import csv_input, digits, synthetic, tabular, tfds_input, tfrecord

INPUT_FNS = Registry(
    "input_fn",
    {
        "digits": digits.input_fn,
        "mnist": tfds_input.mnist,
        "fashion_mnist": tfds_input.fashion_mnist,
        "cifar10": tfds_input.cifar10,
        "tfds": tfds_input.input_fn,
        "tfrecord": tfrecord.input_fn,
        "csv": csv_input.input_fn,
        "synthetic": synthetic.input_fn,
        "tabular": tabular.input_fn,
    },
)

_PREPARE: Mapping[str, Callable[[Mapping[str, Any]], object]] = {
    "digits": digits.prepare,
    "mnist": lambda params: tfds_input.prepare("mnist", params),
    "fashion_mnist": lambda params: tfds_input.prepare("fashion_mnist", params),
    "cifar10": lambda params: tfds_input.prepare("cifar10", params),
    "tfds": lambda params: tfds_input.prepare(None, params),
    "tfrecord": tfrecord.prepare,
    "csv": csv_input.prepare,
    "tabular": tabular.prepare,
}


def prepare_input(name: str, params: Mapping[str, Any]) -> None:
    """Prepares or checks the data of input `name`; a no-op for user inputs.

    Raises:
      UsageError: for invalid parameters, a glob that matches no file, or
        files that do not match their spec.
      DatasetNotFoundError: if a TFDS dataset is missing and cannot be generated.
    """
    if name in _PREPARE:
        _PREPARE[name](params)


__all__ = ["INPUT_FNS", "prepare_input"]
