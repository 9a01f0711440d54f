"""A TPUEstimator program run on the CPU, in the shape of tensorflow/tpu's MNIST model.

absl flags, TFRecord files read by `input_fn(params)` (TPUEstimator passes the
batch size as `params["batch_size"]` and refuses an input_fn without
`params`), a model_fn returning `TPUEstimatorSpec`, `use_tpu=False`, and a
`train(max_steps)` / `evaluate` / `predict` sequence. Its data is
`--data_dir/{train,eval}.tfrecord` (`tests/legacy/shape_data.py` makes them):

  python tests/legacy/scripts/tpu_mnist.py --data_dir=/tmp/d --model_dir=/tmp/m
"""

import os

import tensorflow.compat.v1 as tf
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "Directory of train.tfrecord and eval.tfrecord.")
flags.DEFINE_string("model_dir", None, "Where checkpoints go.")
flags.DEFINE_integer("batch_size", 16, "Global batch of training.")
flags.DEFINE_integer("train_steps", 40, "Training steps.")
flags.DEFINE_integer("eval_steps", 2, "Evaluation batches.")
flags.DEFINE_integer("iterations", 10, "Steps per TPU loop (unused on the CPU).")
flags.DEFINE_bool("use_tpu", False, "Run on a TPU.")

FEATURES = 16
CLASSES = 4


def _parse(record):
    parsed = tf.io.parse_single_example(
        record,
        {
            "image": tf.io.FixedLenFeature([FEATURES], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    return parsed["image"], tf.cast(parsed["label"], tf.int32)


def _dataset(name, params):
    dataset = tf.data.TFRecordDataset(os.path.join(FLAGS.data_dir, f"{name}.tfrecord"))
    return dataset.map(_parse).repeat().batch(params["batch_size"], drop_remainder=True)


def train_input_fn(params):
    return _dataset("train", params)


def eval_input_fn(params):
    return _dataset("eval", params)


def predict_input_fn(params):
    dataset = tf.data.TFRecordDataset(os.path.join(FLAGS.data_dir, "eval.tfrecord"))
    images = dataset.map(lambda record: _parse(record)[0]).take(8)
    return images.batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    del params
    hidden = tf.layers.dense(features, 32, activation=tf.nn.relu)
    logits = tf.layers.dense(hidden, CLASSES)
    if mode == tf.estimator.ModeKeys.PREDICT:
        predictions = {"class": tf.argmax(logits, axis=1)}
        return tf.estimator.tpu.TPUEstimatorSpec(mode, predictions=predictions)
    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    if mode == tf.estimator.ModeKeys.EVAL:

        def metric_fn(labels, logits):
            return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

        return tf.estimator.tpu.TPUEstimatorSpec(
            mode, loss=loss, eval_metrics=(metric_fn, [labels, logits])
        )
    optimizer = tf.train.GradientDescentOptimizer(0.1)
    if FLAGS.use_tpu:
        optimizer = tf.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
    return tf.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
    del argv
    run_config = tf.estimator.tpu.RunConfig(
        model_dir=FLAGS.model_dir,
        save_checkpoints_steps=20,
        tpu_config=tf.estimator.tpu.TPUConfig(FLAGS.iterations),
    )
    estimator = tf.estimator.tpu.TPUEstimator(
        model_fn=model_fn,
        use_tpu=FLAGS.use_tpu,
        train_batch_size=FLAGS.batch_size,
        eval_batch_size=FLAGS.batch_size,
        predict_batch_size=4,
        config=run_config,
    )
    estimator.train(input_fn=train_input_fn, max_steps=FLAGS.train_steps)
    results = estimator.evaluate(input_fn=eval_input_fn, steps=FLAGS.eval_steps)
    print("evaluation:", ", ".join(f"{key}={results[key]:.4f}" for key in sorted(results)))
    predictions = list(estimator.predict(input_fn=predict_input_fn))
    print("predicted", len(predictions), "examples")


if __name__ == "__main__":
    app.run(main)
