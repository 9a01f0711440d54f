"""The embedded default dataset: scikit-learn's 8x8 handwritten digits as TFDS.

The 1,797 images ship inside the scikit-learn wheel, so they are there
offline. `prepare` converts them once into a real TFDS dataset on disk
(`sklearn_digits`, sharded TFRecord files plus dataset_info.json, like
`tfds build mnist` writes), and `input_fn` reads it back through the same
`tfds.ReadConfig(input_context=...)` path as MNIST. Images are scaled from
0..16 to 0..255 and stored as 8x8x1 uint8 PNG, the MNIST layout.

Example:
  >>> import tensorflow as tf
  >>> dataset = input_fn(tf.estimator.ModeKeys.EVAL,  # doctest: +SKIP
  ...                    params={"batch_size": 32, "data_dir": "/tmp/tfds"})
"""

from __future__ import annotations

import fcntl
import os
from typing import Any, Iterator, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from input_fns.tfds_input import tfds_dataset

NAME = "sklearn_digits"
#: Files per split: enough for file-level sharding over up to 4 workers.
NUM_SHARDS = 4
NUM_TEST = 297


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's copy of the UCI optical recognition of handwritten digits."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: 1,500 train and 297 test images."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=(
                "8x8 grey-scale handwritten digits (0-9), 1,797 images from "
                "scikit-learn's bundled copy of the UCI dataset, scaled to 0-255."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 1)),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://archive.ics.uci.edu/dataset/80",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)[..., np.newaxis]
        order = np.random.RandomState(0).permutation(len(images))
        test, train = order[:NUM_TEST], order[NUM_TEST:]
        return {
            "train": self._generate_examples(images, digits.target, train),
            "test": self._generate_examples(images, digits.target, test),
        }

    def _generate_examples(
        self, images: np.ndarray, labels: np.ndarray, indexes: np.ndarray
    ) -> Iterator[tuple]:
        for index in indexes:
            yield int(index), {"image": images[index], "label": int(labels[index])}


def prepare(params: Mapping[str, Any]) -> str:
    """Writes the dataset under `params["data_dir"]` unless it is already there.

    Safe to call from every task at once: a file lock lets one task write
    while the others wait and then find it prepared.

    Returns:
      The directory holding the prepared dataset.
    """
    builder = SklearnDigits(data_dir=params.get("data_dir"))
    if not builder.is_prepared():
        root = os.fspath(builder.data_dir_root)
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, f".{NAME}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            builder = SklearnDigits(data_dir=params.get("data_dir"))
            if not builder.is_prepared():
                tfds.disable_progress_bar()
                builder.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(
                        num_shards=NUM_SHARDS, try_download_gcs=False
                    )
                )
    return os.fspath(builder.data_path)


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` for the embedded digits, prepared on first use.

    Args:
      mode: A `tf.estimator.ModeKeys` value.
      input_context: This worker's pipeline id and count, or None.
      params: `batch_size` (global), `data_dir`, `seed`, `shuffle_buffer`.

    Returns:
      Batches of `({"image": float32 [b, 8, 8, 1]}, int32 label)`.

    Example:
      >>> import tensorflow as tf
      >>> input_fn(tf.estimator.ModeKeys.EVAL, None,  # doctest: +SKIP
      ...          {"batch_size": 32, "data_dir": "/tmp/tfds"})
    """
    params = params or {}
    prepare(params)
    return tfds_dataset(NAME, mode, input_context, params)
