"""The census model: 13 feature columns, a wide-and-deep classifier, CSV input, exporters."""

import tensorflow as tf

CSV_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
    "occupation", "relationship", "race", "gender", "capital_gain", "capital_loss",
    "hours_per_week", "native_country", "income_bracket",
]  # fmt: skip
DEFAULTS = [[0], [""], [0], [""], [0], [""], [""], [""], [""], [""], [0], [0], [0], [""], [""]]
LABEL = "income_bracket"
LABELS = [" <=50K", " >50K"]
CATEGORIES = {
    "workclass": [" Private", " Self-emp", " Government"],
    "education": [" Bachelors", " HS-grad", " Masters"],
    "marital_status": [" Married", " Never-married", " Divorced"],
    "relationship": [" Husband", " Wife", " Own-child"],
    "race": [" White", " Black", " Other"],
    "gender": [" Female", " Male"],
}


def _columns():
    categorical = {
        name: tf.feature_column.categorical_column_with_vocabulary_list(name, values)
        for name, values in CATEGORIES.items()
    }
    occupation = tf.feature_column.categorical_column_with_hash_bucket("occupation", 50)
    country = tf.feature_column.categorical_column_with_hash_bucket("native_country", 50)
    age = tf.feature_column.numeric_column("age")
    age_buckets = tf.feature_column.bucketized_column(age, [25, 35, 45, 55, 65])
    numeric = [
        tf.feature_column.numeric_column(name)
        for name in ("education_num", "capital_gain", "capital_loss", "hours_per_week")
    ]
    wide = [
        *categorical.values(),
        occupation,
        country,
        age_buckets,
        tf.feature_column.crossed_column(["education", "occupation"], 100),
    ]
    deep = [
        tf.feature_column.indicator_column(categorical["workclass"]),
        tf.feature_column.indicator_column(categorical["education"]),
        tf.feature_column.indicator_column(categorical["gender"]),
        tf.feature_column.indicator_column(categorical["relationship"]),
        tf.feature_column.embedding_column(occupation, 4),
        tf.feature_column.embedding_column(country, 4),
        age,
        *numeric,
    ]
    return wide, deep


def _parse(line):
    columns = tf.io.decode_csv(line, record_defaults=DEFAULTS)
    features = dict(zip(CSV_COLUMNS, columns))
    features.pop("fnlwgt")
    label = features.pop(LABEL)
    return features, tf.cast(tf.equal(label, LABELS[1]), tf.int32)


def input_fn(files, batch_size, repeat):
    dataset = tf.data.TextLineDataset(files).map(_parse)
    dataset = dataset.repeat() if repeat else dataset
    return dataset.batch(batch_size)


def serving_input_fn():
    rows = tf.compat.v1.placeholder(tf.string, [None])
    features, _ = _parse(rows + ",0")
    return tf.estimator.export.ServingInputReceiver(features, {"csv_row": rows})


def train_and_evaluate(args):
    wide, deep = _columns()
    config = tf.estimator.RunConfig(
        model_dir=args.job_dir, save_checkpoints_steps=20, keep_checkpoint_max=3
    )
    estimator = tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=wide,
        dnn_feature_columns=deep,
        dnn_hidden_units=[16, 8],
        config=config,
    )
    train_spec = tf.estimator.TrainSpec(
        lambda: input_fn(args.train_files, args.batch_size, True), max_steps=args.train_steps
    )
    exporters = [
        tf.estimator.FinalExporter("census", serving_input_fn),
        tf.estimator.BestExporter("best", serving_input_fn, exports_to_keep=1),
    ]
    eval_spec = tf.estimator.EvalSpec(
        lambda: input_fn(args.eval_files, args.batch_size, False),
        steps=args.eval_steps,
        exporters=exporters,
        start_delay_secs=1,
        throttle_secs=1,
    )
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
