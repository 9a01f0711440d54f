"""Checks serialized `tf.train.Example` records against a feature spec, without raising.

`tf.io.parse_example` fails a whole batch, with no record position, when
one record lacks a feature or holds values of another dtype or count. This
module finds those problems first, record by record, by decoding the
Example's wire format with `tf.io.decode_proto`, which never raises:

- `example_problems` gives a problem code (`OK` or another) and a detail
  (kind index, value count or byte length) per record and feature;
- `describe_problems` turns each bad record's first problem into a message;
- `first_record_problem` checks the first record of one file, for checks
  made before any worker starts.

Example:
  >>> import tensorflow as tf
  >>> from input_fns.specs import parse_specs
  >>> specs = parse_specs("label:int64", "features")
  >>> codes, details = example_problems(tf.constant([b""]), specs)  # doctest: +SKIP
  >>> describe_problems(codes, details, specs).numpy()  # doctest: +SKIP
  array([b"feature 'label' is missing (features spec: label:int64)"], dtype=object)
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

from input_fns.specs import FeatureSpec

#: The value lists of `tf.train.Feature`, in the order decoded.
LIST_KINDS = ("bytes", "float", "int64")
_LIST_TYPES = ("tensorflow.BytesList", "tensorflow.FloatList", "tensorflow.Int64List")
_LIST_DTYPES = (tf.string, tf.float32, tf.int64)
_KIND_OF = {"string": 0, "uint8": 0, "float32": 1, "int64": 2}
#: Problem codes of a record's feature; `OK` is no problem.
OK, MISSING, WRONG_KIND, WRONG_COUNT, WRONG_BYTES = range(5)


def _first(values: tf.Tensor, default: Any) -> tf.Tensor:
    """The first element along the last axis, or `default` where there is none."""
    pad = tf.fill(tf.concat([tf.shape(values)[:-1], [1]], 0), tf.constant(default, values.dtype))
    return tf.concat([values, pad], axis=-1)[..., 0]


def example_problems(records: tf.Tensor, specs: Tuple[FeatureSpec, ...]) -> tuple:
    """Checks serialized Examples against `specs` without raising for a bad feature.

    Args:
      records: string [n], serialized `tf.train.Example`s; may be empty.
      specs: The feature spec the records should follow.

    Returns:
      `(codes, details)`, int64 [n, features]: `OK` or the problem of each
      feature, and the kind index, value count or byte length it concerns.
    """
    empty = tf.zeros([0, len(specs)], tf.int64)
    # decode_proto refuses an empty batch (an end-of-file chunk).
    return tf.cond(
        tf.size(records) > 0,
        lambda: _decode_problems(records, specs),
        lambda: (empty, empty),
    )


def _decode_problems(records: tf.Tensor, specs: Tuple[FeatureSpec, ...]) -> tuple:
    _, (features,) = tf.io.decode_proto(records, "tensorflow.Example", ["features"], [tf.string])
    _, (entries,) = tf.io.decode_proto(
        _first(features, ""), "tensorflow.Features", ["feature"], [tf.string]
    )
    _, (keys, values) = tf.io.decode_proto(
        entries, "tensorflow.Features.FeatureEntry", ["key", "value"], [tf.string, tf.string]
    )
    keys, values = _first(keys, ""), _first(values, "")
    kind_sizes, lists = tf.io.decode_proto(
        values, "tensorflow.Feature", ["bytes_list", "float_list", "int64_list"], [tf.string] * 3
    )
    kind_sizes = tf.cast(kind_sizes, tf.int64)
    counts, byte_lengths = {}, None
    for kind in sorted({_KIND_OF[spec.dtype] for spec in specs}):
        sizes, (decoded,) = tf.io.decode_proto(
            _first(lists[kind], ""), _LIST_TYPES[kind], ["value"], [_LIST_DTYPES[kind]]
        )
        counts[kind] = tf.cast(sizes[..., 0], tf.int64)
        if kind == 0:
            byte_lengths = tf.cast(tf.strings.length(_first(decoded, "")), tf.int64)
    codes, details = [], []
    for spec in specs:
        kind = _KIND_OF[spec.dtype]
        match = tf.equal(keys, spec.name)
        found = tf.reduce_any(match, axis=1)
        kinds = tf.reduce_max(tf.where(match[..., None], kind_sizes, 0), axis=1)
        wrong_kind = tf.logical_and(tf.equal(kinds[:, kind], 0), tf.reduce_sum(kinds, axis=1) > 0)
        count = tf.reduce_sum(tf.where(match, counts[kind], 0), axis=1)
        expected_count = 1 if kind == 0 else spec.size
        if spec.dtype == "uint8":
            length = tf.reduce_sum(tf.where(match, byte_lengths, 0), axis=1)
            wrong_bytes = tf.not_equal(length, spec.size)
        else:
            length = tf.zeros_like(count)
            wrong_bytes = tf.zeros_like(found)
        code = tf.where(
            tf.logical_not(found),
            MISSING,
            tf.where(
                wrong_kind,
                WRONG_KIND,
                tf.where(
                    tf.not_equal(count, expected_count),
                    WRONG_COUNT,
                    tf.where(wrong_bytes, WRONG_BYTES, 0),
                ),
            ),
        )
        detail = tf.where(
            tf.equal(code, WRONG_KIND),
            tf.argmax(kinds, axis=1),
            tf.where(tf.equal(code, WRONG_COUNT), count, length),
        )
        codes.append(tf.cast(code, tf.int64))
        details.append(detail)
    return tf.stack(codes, axis=1), tf.stack(details, axis=1)


def describe_problems(
    codes: tf.Tensor, details: tf.Tensor, specs: Tuple[FeatureSpec, ...]
) -> tf.Tensor:
    """One message per row of codes: the problem of its first bad feature.

    Args:
      codes: int64 [n, features], from `example_problems`.
      details: int64 [n, features], from `example_problems`.
      specs: The feature spec the codes were computed for.

    Returns:
      string [n]; meaningful for rows with a problem only.
    """
    kind_names = tf.constant(LIST_KINDS)
    messages = []
    for column, spec in enumerate(specs):
        code, detail = codes[:, column], details[:, column]
        expected_kind = LIST_KINDS[_KIND_OF[spec.dtype]]
        expected_count = 1 if spec.dtype in ("uint8", "string") else spec.size
        text = tf.strings.as_string(detail)
        name = f"feature '{spec.name}'"
        messages.append(
            tf.where(
                tf.equal(code, MISSING),
                f"{name} is missing (features spec: {spec})",
                tf.where(
                    tf.equal(code, WRONG_KIND),
                    tf.strings.join(
                        [
                            f"{name} holds ",
                            tf.gather(kind_names, tf.clip_by_value(detail, 0, 2)),
                            f" values; the spec {spec} expects {expected_kind} values",
                        ]
                    ),
                    tf.where(
                        tf.equal(code, WRONG_COUNT),
                        tf.strings.join(
                            [
                                f"{name} has ",
                                text,
                                f" value(s); the spec {spec} expects {expected_count}",
                            ]
                        ),
                        tf.strings.join(
                            [f"{name} holds ", text, f" bytes; the spec {spec} expects {spec.size}"]
                        ),
                    ),
                ),
            )
        )
    first_bad = tf.argmax(tf.cast(tf.not_equal(codes, OK), tf.int32), axis=1)
    return tf.gather(tf.stack(messages, axis=1), first_bad, batch_dims=1)


def first_record_problem(path: str, specs: Tuple[FeatureSpec, ...]) -> Optional[str]:
    """The problem of the first record of `path`, or None; runs in a scratch graph.

    Args:
      path: A TFRecord file.
      specs: The feature spec its records should follow.

    Returns:
      A message without the file's name, or None if the first record matches.
    """
    with tf.Graph().as_default():
        batch = tf.data.TFRecordDataset(path).take(1).batch(1)
        record = tf.compat.v1.data.make_one_shot_iterator(batch).get_next()
        codes, details = example_problems(record, specs)
        bad = tf.reduce_any(tf.not_equal(codes, OK))
        message = describe_problems(codes, details, specs)[0]
        with tf.compat.v1.Session() as session:
            try:
                is_bad, text = session.run([bad, message])
            except tf.errors.OutOfRangeError:
                return "no complete record could be read (the file is empty or not a TFRecord file)"
            except tf.errors.DataLossError:
                return (
                    "the first record is corrupt or not a serialized tf.train.Example "
                    "(these are not TFRecord files of tf.train.Example)"
                )
    return text.decode("utf-8", "replace") if is_bad else None
