"""Sharded `input_fn(mode, input_context, params)` functions, by name.

`INPUT_FNS.get(name)` returns an Estimator input function; the name may
also be `package.module:function`. Registered:

| name | reads |
|---|---|
| `digits` | the embedded 8x8 digits (TFDS format, prepared on first use) |
| `mnist`, `fashion_mnist`, `cifar10` | those TFDS datasets, prepared under `data_dir` |
| `cifar10_binary` | CIFAR-10's binary release (`data_batch_*.bin`, `test_batch.bin`) |
| `tfds` | any prepared TFDS dataset, `params["dataset"]` |
| `tfds_images` | any prepared TFDS image dataset, resized to `image_size`, in [-1, 1] |
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

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

from estimator_dist.base.registry import Registry
from input_fns import (
    cifar10_binary,
    csv_input,
    digits,
    synthetic,
    tabular,
    tfds_images,
    tfds_input,
    tfrecord,
)


@dataclasses.dataclass(frozen=True)
class Registration:
    """One input function, registered once: the function, its parameters, its data.

    Attributes:
      input_fn: `input_fn(mode, input_context, params)`.
      parameters: The dataclass of the `params` keys it reads; every model
        function accepts them too (their fields are `params.INPUT_KEYS`).
      prepare: Writes or checks its data before any worker starts, or None.
    """

    input_fn: Callable[..., Any]
    parameters: type
    prepare: Optional[Callable[[Mapping[str, Any]], object]] = None


def _tfds(name: Optional[str]) -> Callable[[Mapping[str, Any]], object]:
    return functools.partial(tfds_input.prepare, name)


REGISTERED: Mapping[str, Registration] = {
    "digits": Registration(digits.input_fn, tfds_input.TfdsParams, digits.prepare),
    "mnist": Registration(tfds_input.mnist, tfds_input.TfdsParams, _tfds("mnist")),
    "fashion_mnist": Registration(
        tfds_input.fashion_mnist, tfds_input.TfdsParams, _tfds("fashion_mnist")
    ),
    "cifar10": Registration(tfds_input.cifar10, tfds_input.TfdsParams, _tfds("cifar10")),
    "cifar10_binary": Registration(
        cifar10_binary.input_fn, cifar10_binary.PARAMETERS, cifar10_binary.prepare
    ),
    "tfds": Registration(tfds_input.input_fn, tfds_input.TfdsParams, _tfds(None)),
    "tfds_images": Registration(
        tfds_images.input_fn, tfds_images.TfdsImagesParams, tfds_images.prepare
    ),
    "tfrecord": Registration(tfrecord.input_fn, tfrecord.TFRecordParams, tfrecord.prepare),
    "csv": Registration(csv_input.input_fn, csv_input.CsvParams, csv_input.prepare),
    "synthetic": Registration(synthetic.input_fn, synthetic.SyntheticParams),
    "tabular": Registration(tabular.input_fn, tabular.TabularParams, tabular.prepare),
}

INPUT_FNS = Registry("input_fn", {name: entry.input_fn for name, entry in REGISTERED.items()})


def prepare_input(name: str, params: Mapping[str, Any]) -> None:
    """Prepares or checks the data of input `name`; a no-op for user inputs.

    Raises:
      UsageError: for invalid parameters, a glob that matches no file, or
        files that do not match their spec.
      DatasetNotFoundError: if a TFDS dataset is missing and cannot be generated.
    """
    entry = REGISTERED.get(name)
    if entry is not None and entry.prepare is not None:
        entry.prepare(params)


__all__ = ["INPUT_FNS", "REGISTERED", "Registration", "prepare_input"]
