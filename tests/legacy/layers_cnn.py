"""The TF1 "Build a Convolutional Neural Network using Estimators" (layers) tutorial.

The tutorial's MNIST CNN on the 8x8 digits, with smaller layers to fit
them. Its input functions are objects made by `numpy_input_fn` at import
time, and its LoggingTensorHook, which the tutorial handed to
`train(hooks=...)`, rides in the EstimatorSpec's `training_hooks`, as
authors did whose training loop they did not own.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)


def cnn_model_fn(features, labels, mode):
    """Model function for CNN."""
    # Input Layer
    input_layer = tf.reshape(features["x"], [-1, 8, 8, 1])

    # Convolutional Layer #1
    conv1 = tf.compat.v1.layers.conv2d(
        inputs=input_layer, filters=16, kernel_size=[3, 3], padding="same", activation=tf.nn.relu
    )

    # Pooling Layer #1
    pool1 = tf.compat.v1.layers.max_pooling2d(inputs=conv1, pool_size=[2, 2], strides=2)

    # Convolutional Layer #2 and Pooling Layer #2
    conv2 = tf.compat.v1.layers.conv2d(
        inputs=pool1, filters=32, kernel_size=[3, 3], padding="same", activation=tf.nn.relu
    )
    pool2 = tf.compat.v1.layers.max_pooling2d(inputs=conv2, pool_size=[2, 2], strides=2)

    # Dense Layer
    pool2_flat = tf.reshape(pool2, [-1, 2 * 2 * 32])
    dense = tf.compat.v1.layers.dense(inputs=pool2_flat, units=128, activation=tf.nn.relu)
    dropout = tf.compat.v1.layers.dropout(
        inputs=dense, rate=0.4, training=mode == tf.estimator.ModeKeys.TRAIN
    )

    # Logits Layer
    logits = tf.compat.v1.layers.dense(inputs=dropout, units=10)

    predictions = {
        # Generate predictions (for PREDICT and EVAL mode)
        "classes": tf.argmax(input=logits, axis=1),
        # Add `softmax_tensor` to the graph. It is used for PREDICT and by the
        # `logging_hook`.
        "probabilities": tf.nn.softmax(logits, name="softmax_tensor"),
    }
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions)

    # Calculate Loss (for both TRAIN and EVAL modes)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)

    # Configure the Training Op (for TRAIN mode)
    if mode == tf.estimator.ModeKeys.TRAIN:
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate=0.3)
        train_op = optimizer.minimize(loss=loss, global_step=tf.compat.v1.train.get_global_step())
        # Set up logging for predictions
        tensors_to_log = {"probabilities": "softmax_tensor"}
        logging_hook = tf.compat.v1.train.LoggingTensorHook(tensors=tensors_to_log, every_n_iter=50)
        return tf.estimator.EstimatorSpec(
            mode=mode, loss=loss, train_op=train_op, training_hooks=[logging_hook]
        )

    # Add evaluation metrics (for EVAL mode)
    eval_metric_ops = {
        "accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=predictions["classes"])
    }
    return tf.estimator.EstimatorSpec(mode=mode, loss=loss, eval_metric_ops=eval_metric_ops)


# Load training and eval data
digits = load_digits()
train_data = (digits.images[:1500] / 16.0).astype(np.float32)
train_labels = np.asarray(digits.target[:1500], dtype=np.int32)
eval_data = (digits.images[1500:] / 16.0).astype(np.float32)
eval_labels = np.asarray(digits.target[1500:], dtype=np.int32)

# Train the model
train_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
    x={"x": train_data}, y=train_labels, batch_size=100, num_epochs=None, shuffle=True
)

# Evaluate the model and print results
eval_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
    x={"x": eval_data}, y=eval_labels, num_epochs=1, shuffle=False
)


def main(unused_argv):
    # Create the Estimator
    mnist_classifier = tf.estimator.Estimator(
        model_fn=cnn_model_fn, model_dir="/tmp/mnist_convnet_model"
    )
    mnist_classifier.train(input_fn=train_input_fn, steps=200)
    eval_results = mnist_classifier.evaluate(input_fn=eval_input_fn)
    print(eval_results)


if __name__ == "__main__":
    tf.compat.v1.app.run()
