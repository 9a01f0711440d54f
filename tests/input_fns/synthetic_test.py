"""The `synthetic` input_fn: in-memory images of any shape, for benchmarks."""

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from input_fns import INPUT_FNS, synthetic
from tests.input_fns.data import context

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_images_of_the_requested_shape(shape):
    params = {"batch_size": 16, "image_shape": "x".join(map(str, shape))}
    dataset = INPUT_FNS.get("synthetic")(TRAIN, context(2, 0), params)
    features, labels = next(iter(dataset))
    assert features["image"].shape == (8, *shape)
    assert features["image"].dtype == tf.float32
    assert set(labels.numpy().tolist()) <= set(range(10))
    assert dataset.element_spec[0]["image"].shape.as_list() == [8, *shape]


def test_eval_reads_the_pool_once_and_labels_cycle():
    params = {"batch_size": 100, "num_examples": 30, "num_classes": 3}
    (batch,) = list(synthetic.input_fn(EVAL, None, params))
    assert batch[1].numpy().tolist() == [i % 3 for i in range(30)]


def test_the_pool_depends_on_the_seed_only():
    def first_image(seed):
        params = {"batch_size": 1, "num_examples": 1, "seed": seed}
        return next(iter(synthetic.input_fn(EVAL, None, params)))[0]["image"].numpy()

    assert (first_image(1) == first_image(1)).all()
    assert not (first_image(1) == first_image(2)).all()


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"image_shape": "32x32"}, "height x width x channels"),
        ({"image_shape": "a"}, "shape"),
        ({"num_classes": 0}, "num_classes must be at least 1"),
        ({"num_examples": 0}, "num_examples must be at least 1"),
    ],
)
def test_fail_with_invalid_params(params, fragment):
    with pytest.raises(UsageError, match=fragment):
        synthetic.input_fn(TRAIN, None, params)
