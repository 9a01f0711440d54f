"""One task of `sparse_test`'s 2-worker jobs: trains a model with sparse gradients, then exits.

Run as `python -m tests.estimator_dist.tf_runtime.sparse_worker MODEL MODEL_DIR MAX_STEPS`
with the task's TF_CONFIG. MODEL is `canned_v1` (a
`tf.compat.v1.estimator.DNNLinearCombinedClassifier` on hashed, crossed and
vocabulary columns and an embedding column, trained with v1 Ftrl and
Adagrad), `canned_v2` (the same V2 estimator, with Keras legacy optimizers)
or `embedding_lookup` (`embedding_model_fn`). The batches of input pipeline
k hold UNIQUE_IDS[k][step % 3] distinct ids, so the workers' sparse
gradients have different numbers of rows, which change from step to step.
"""

import sys

import tensorflow as tf

from estimator_dist.tf_runtime import patches
from run_config.strategies import StrategyConfig, get_strategy

BATCH = 8
#: Distinct ids in the successive batches of input pipeline 0 (the chief) and
#: 1 (the worker). They vary between steps too: TensorFlow's own all-reduce of
#: IndexedSlices copes with sizes that differ between workers but fails when
#: they change from one step to the next.
UNIQUE_IDS = ((3, 5, 2), (7, 4, 6))
VOCABULARY = 20
EMBEDDING = 4


def input_fn(input_context=None):
    """Batches of BATCH examples cycling over this pipeline's ids, forever."""
    pipeline = input_context.input_pipeline_id if input_context else 0
    counts = tf.constant(UNIQUE_IDS[pipeline], tf.int64)

    def batch(step):
        ids = tf.reshape(tf.range(BATCH, dtype=tf.int64) % counts[step], [BATCH, 1])
        features = {
            "id": ids,
            "word": tf.strings.as_string(ids),
            "token": tf.strings.as_string(ids),
            "slot": tf.strings.as_string(ids % 2),
        }
        return features, tf.cast(ids % 2, tf.int32)

    return tf.data.Dataset.range(len(UNIQUE_IDS[pipeline])).repeat().map(batch)


def embedding_model_fn(features, labels, mode, params):
    """Logistic regression on an embedding of the distinct ids of the batch.

    The table starts at zero, so after training exactly the rows of the ids
    some worker read have moved.
    """
    table = tf.compat.v1.get_variable(
        "table", [VOCABULARY, EMBEDDING], initializer=tf.compat.v1.zeros_initializer()
    )
    ids = tf.reshape(features["id"], [-1])
    # Looking up each distinct id once makes the gradient's row count that of
    # the distinct ids, which differs between the workers.
    distinct, positions = tf.unique(ids)
    vectors = tf.gather(tf.nn.embedding_lookup(table, distinct), positions)
    logits = tf.compat.v1.layers.dense(
        vectors, 1, kernel_initializer=tf.compat.v1.ones_initializer()
    )
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(tf.cast(labels, tf.float32), logits)
    train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _columns(fc):
    word = fc.categorical_column_with_hash_bucket("word", 50)
    vocabulary = fc.categorical_column_with_vocabulary_list(
        "token", [str(i) for i in range(VOCABULARY)]
    )
    crossed = fc.crossed_column(["word", "slot"], 100)
    return [word, crossed, vocabulary], [fc.embedding_column(vocabulary, EMBEDDING)]


def build(model, config):
    """The estimator named `model`."""
    if model == "embedding_lookup":
        return tf.estimator.Estimator(embedding_model_fn, config=config)
    if model == "canned_v1":
        linear, deep = _columns(tf.compat.v1.feature_column)
        return tf.compat.v1.estimator.DNNLinearCombinedClassifier(
            linear_feature_columns=linear,
            dnn_feature_columns=deep,
            dnn_hidden_units=[4],
            config=config,
        )
    if model == "canned_v2":
        linear, deep = _columns(tf.feature_column)
        return tf.estimator.DNNLinearCombinedClassifier(
            linear_feature_columns=linear,
            dnn_feature_columns=deep,
            dnn_hidden_units=[4],
            config=config,
        )
    raise ValueError(f"unknown model {model!r}; expected canned_v1, canned_v2 or embedding_lookup.")


def main(argv):
    model, model_dir, max_steps = argv[1], argv[2], int(argv[3])
    patches.install()
    strategy = get_strategy(StrategyConfig("multi_worker_mirrored", "RING"), num_gpus=0)
    config = tf.estimator.RunConfig(
        model_dir=model_dir, train_distribute=strategy, save_checkpoints_steps=max_steps
    )
    tf.estimator.train_and_evaluate(
        build(model, config),
        tf.estimator.TrainSpec(input_fn, max_steps=max_steps),
        tf.estimator.EvalSpec(input_fn, steps=1),
    )


if __name__ == "__main__":
    main(sys.argv)
