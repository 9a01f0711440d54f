"""The TF1 side of TensorFlow's multi-worker migration guide.

A dense layer fitted to a handful of constant points with Adagrad, the
input functions taking no arguments at all. The guide's training dataset
was read once; here it repeats, as a script that trains for a fixed
number of steps needs.
"""

import tensorflow as tf

features = [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5], [1.5, 1.0], [2.5, 2.0]]
labels = [[0.3], [0.5], [0.7], [0.35], [0.55]]
eval_features = [[4.0, 4.5], [5.0, 5.5], [6.0, 6.5]]
eval_labels = [[0.8], [0.9], [1.0]]


def _input_fn():
    return tf.compat.v1.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(1)


def _eval_input_fn():
    return tf.compat.v1.data.Dataset.from_tensor_slices((eval_features, eval_labels)).batch(1)


def _model_fn(features, labels, mode):
    logits = tf.compat.v1.layers.dense(features, 1)
    loss = tf.compat.v1.losses.mean_squared_error(labels=labels, predictions=logits)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.05)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


if __name__ == "__main__":
    estimator = tf.compat.v1.estimator.Estimator(model_fn=_model_fn)
    train_spec = tf.compat.v1.estimator.TrainSpec(input_fn=_input_fn, max_steps=100)
    eval_spec = tf.compat.v1.estimator.EvalSpec(input_fn=_eval_input_fn)
    tf.compat.v1.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
