"""Real prepared TFDS image datasets made of `tfds.testing.mock_data`'s random examples.

`tfds.testing.mock_data` (TFDS 4.9.4) patches `DatasetBuilder` in the calling
process only, and without the dataset's metadata files (the wheel ships none)
it knows no splits. Worker processes need files: `prepare_mock_images` runs
the real builder's `download_and_prepare` (its features, file layout and
dataset_info.json) on the examples mock_data itself generates
(`RandomFakeGenerator`: images of random sizes, 5 to 49 pixels a side; labels
among the dataset's classes), with only the download replaced, since these
machines cannot reach it.
"""

import os
from unittest import mock

import tensorflow_datasets as tfds
from tensorflow_datasets.testing import mocking


def prepare_mock_images(name, data_dir, num_examples, num_shards=4, seed=0):
    """Writes TFDS `name`'s `train` split of `num_examples` random examples; returns its path."""
    builder = tfds.builder(name, data_dir=data_dir)
    examples = mocking.RandomFakeGenerator(builder.info.features, num_examples, seed=seed)

    def split_generators(self, dl_manager):
        return {"train": enumerate(examples)}

    with mock.patch.object(type(builder), "_split_generators", split_generators):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(
                num_shards=num_shards, try_download_gcs=False
            )
        )
    return os.fspath(builder.data_path)
