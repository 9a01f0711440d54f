"""A GRU over token sequences, as a package not named `trainer`, run as `python -m textgru.task`.

TF1 flags (`tf.compat.v1.flags`, as `tf.app.flags` programs define them),
`RunConfig(save_checkpoints_secs=...)`, a model_fn with an embedding and a
`GRUCell` through `dynamic_rnn`, numpy arrays through `numpy_input_fn`, and a
`LatestExporter`:

  python -m textgru.task --output_dir=/tmp/gru --train_steps=40
"""

import numpy as np
import tensorflow.compat.v1 as tf

flags = tf.flags
FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Where checkpoints and exports go.")
flags.DEFINE_integer("train_steps", 40, "Training steps.")
flags.DEFINE_integer("checkpoint_secs", 2, "Seconds between checkpoints.")

VOCABULARY, LENGTH, CLASSES = 30, 12, 3


def _sequences(count, seed):
    rng = np.random.RandomState(seed)
    tokens = rng.randint(1, VOCABULARY, size=(count, LENGTH)).astype(np.int64)
    labels = (tokens[:, :4].sum(axis=1) % CLASSES).astype(np.int64)
    return {"tokens": tokens}, labels


def model_fn(features, labels, mode, params):
    embeddings = tf.get_variable("embeddings", [VOCABULARY, params["embedding"]])
    embedded = tf.nn.embedding_lookup(embeddings, features["tokens"])
    cell = tf.nn.rnn_cell.GRUCell(params["units"])
    _, state = tf.nn.dynamic_rnn(cell, embedded, dtype=tf.float32)
    logits = tf.layers.dense(state, CLASSES)
    predicted = tf.argmax(logits, axis=1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        outputs = {"class": tf.estimator.export.PredictOutput({"class": predicted})}
        return tf.estimator.EstimatorSpec(
            mode, predictions={"class": predicted}, export_outputs=outputs
        )
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    metrics = {"accuracy": tf.metrics.accuracy(labels, predicted)}
    train_op = tf.train.AdamOptimizer(0.01).minimize(loss, tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def serving_input_fn():
    tokens = tf.placeholder(tf.int64, [None, LENGTH])
    return tf.estimator.export.ServingInputReceiver({"tokens": tokens}, {"tokens": tokens})


def main(argv):
    del argv
    config = tf.estimator.RunConfig(
        model_dir=FLAGS.output_dir,
        save_checkpoints_secs=FLAGS.checkpoint_secs,
        log_step_count_steps=10,
    )
    estimator = tf.estimator.Estimator(
        model_fn, config=config, params={"embedding": 8, "units": 16}
    )
    features, labels = _sequences(256, 0)
    train_input = tf.estimator.inputs.numpy_input_fn(
        features, labels, batch_size=16, num_epochs=None, shuffle=True
    )
    features, labels = _sequences(64, 1)
    eval_input = tf.estimator.inputs.numpy_input_fn(
        features, labels, batch_size=16, num_epochs=1, shuffle=False
    )
    train_spec = tf.estimator.TrainSpec(train_input, max_steps=FLAGS.train_steps)
    eval_spec = tf.estimator.EvalSpec(
        eval_input,
        exporters=[tf.estimator.LatestExporter("gru", serving_input_fn, exports_to_keep=2)],
        throttle_secs=1,
    )
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    tf.app.run(main)
