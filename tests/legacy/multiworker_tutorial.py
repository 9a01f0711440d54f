"""TensorFlow's "Multi-worker training with Estimator" tutorial, on the 8x8 digits.

The tutorial read MNIST from TFDS; these machines are offline, so the
images are scikit-learn's digits, scaled the same way. Everything else is
the tutorial's: one input_fn for both modes that shards by the
`input_context` Estimator passes under a distribution strategy, a Keras
Sequential model called inside the model_fn, a Keras loss with
reduction NONE summed and divided by the per-worker batch, and a
`tf.compat.v1.train` optimizer. The tutorial ran one epoch of MNIST;
1,797 digits must repeat to last the training steps.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

BUFFER_SIZE = 10000
BATCH_SIZE = 64
LEARNING_RATE = 0.2


def input_fn(mode, input_context=None):
    digits = load_digits()
    if mode == tf.estimator.ModeKeys.TRAIN:
        images, labels = digits.images[:1500], digits.target[:1500]
    else:
        images, labels = digits.images[1500:], digits.target[1500:]
    dataset = tf.data.Dataset.from_tensor_slices((images[..., np.newaxis], labels))

    def scale(image, label):
        image = tf.cast(image, tf.float32)
        image /= 16
        return image, label

    if input_context:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.map(scale).cache()
    if mode == tf.estimator.ModeKeys.TRAIN:
        dataset = dataset.shuffle(BUFFER_SIZE).repeat()
    return dataset.batch(BATCH_SIZE)


def model_fn(features, labels, mode):
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(8, 8, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    logits = model(features, training=False)

    if mode == tf.estimator.ModeKeys.PREDICT:
        predictions = {"logits": logits}
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)

    optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate=LEARNING_RATE)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )(labels, logits)
    loss = tf.reduce_sum(loss) * (1.0 / BATCH_SIZE)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)

    return tf.estimator.EstimatorSpec(
        mode=mode,
        loss=loss,
        train_op=optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step()),
    )


if __name__ == "__main__":
    import tempfile

    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    config = tf.estimator.RunConfig(train_distribute=strategy)
    classifier = tf.estimator.Estimator(
        model_fn=model_fn, model_dir=tempfile.mkdtemp(), config=config
    )
    tf.estimator.train_and_evaluate(
        classifier,
        train_spec=tf.estimator.TrainSpec(input_fn=input_fn, max_steps=200),
        eval_spec=tf.estimator.EvalSpec(input_fn=input_fn),
    )
