"""Bad records: stop training with a message that names them, or skip and count them.

The file readers check every record inside the tf.data pipeline, without
raising, and describe each bad one as `"<file>, record <n>: <problem>"`.
By default the first bad record stops the pipeline with that description
between `START` and `END` markers; `data_error_from` finds it in the
TensorFlow error that training raises and turns it into a `DataError`
(exit code 3 from `estimator_dist.train`). With `skip_bad_records` the
records are dropped instead, logged (the first `LOGGED`), and counted once
each in this process, whatever the epochs; `summary()` reports the count
when training ends.
"""

from __future__ import annotations

import collections
import re
import threading
from typing import Callable, Optional

import tensorflow as tf
from absl import logging

from estimator_dist.base.errors import DataError

START = "<bad-data>"
END = "</bad-data>"
#: Ends every DataError message.
FIX_HINT = (
    "Fix or remove the bad data and run again, or pass --params=skip_bad_records=true "
    "to skip bad records and count them instead. Retrying as it is fails the same way."
)
#: Bad records logged one by one; the rest are only counted.
LOGGED = 10

_ESCAPE = re.compile(r"\\([0-7]{3}|x[0-9a-fA-F]{2}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def _unescape(text: str) -> str:
    """Undoes the C escaping TensorFlow's Assert applies to the strings it prints."""
    out = bytearray()
    position = 0
    for match in _ESCAPE.finditer(text):
        out += text[position : match.start()].encode("utf-8")
        code = match.group(1)
        if len(code) == 3 and code.isdigit():
            out.append(int(code, 8) & 0xFF)
        elif code.startswith("x") and len(code) == 3:
            out.append(int(code[1:], 16))
        else:
            out += _SIMPLE_ESCAPES.get(code, code).encode("utf-8")
        position = match.end()
    out += text[position:].encode("utf-8")
    return out.decode("utf-8", errors="replace")


def data_error_from(error: BaseException) -> Optional[DataError]:
    """Returns the DataError a bad record raised inside tf.data, or None for other errors."""
    text = getattr(error, "message", None) or str(error)
    match = re.search(re.escape(START) + "(.*?)" + re.escape(END), text, re.S)
    if match is None:
        return None
    return DataError(f"Bad input data: {_unescape(match.group(1))}. {FIX_HINT}")


class BadRecordCounter:
    """Counts the bad records skipped in this process, per file; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_file: collections.Counter = collections.Counter()
        self._seen: set = set()
        self._first: list = []

    def note(self, files: tf.Tensor, messages: tf.Tensor) -> tf.Tensor:
        """Counts and logs skipped records; the body of a `tf.py_function`.

        A record met again in a later epoch is counted once: its message,
        which names its file and position, is the key.
        """
        files = [name.decode("utf-8", "replace") for name in files.numpy()]
        messages = [text.decode("utf-8", "replace") for text in messages.numpy()]
        with self._lock:
            for file, message in zip(files, messages):
                if message in self._seen:
                    continue
                self._seen.add(message)
                self._per_file[file] += 1
                if len(self._first) < LOGGED:
                    self._first.append(message)
                    logging.warning("Skipped a bad record: %s.", message)
                    if len(self._first) == LOGGED:
                        logging.warning("Further bad records are skipped and counted, not logged.")
        return tf.constant(len(messages), tf.int64)

    def total(self) -> int:
        """Bad records skipped so far."""
        with self._lock:
            return sum(self._per_file.values())

    def per_file(self) -> dict:
        """Bad records skipped so far, by file."""
        with self._lock:
            return dict(self._per_file)

    def summary(self) -> Optional[str]:
        """One line for the end of training, or None when nothing was skipped."""
        with self._lock:
            total = sum(self._per_file.values())
            if not total:
                return None
            files = ", ".join(
                f"{count} in {name}" for name, count in sorted(self._per_file.items())
            )
            return (
                f"Skipped {total} bad record(s) of input data (skip_bad_records=true): {files}. "
                f"First: {self._first[0]}."
            )

    def reset(self) -> None:
        """Forgets every count (for tests and for a second job in one process)."""
        with self._lock:
            self._per_file.clear()
            self._seen.clear()
            self._first.clear()


#: The process-wide count of skipped records.
COUNTER = BadRecordCounter()


def summary() -> Optional[str]:
    """The end-of-training report of skipped records, or None if there were none."""
    return COUNTER.summary()


def check(
    ok: tf.Tensor,
    describe: Callable[[tf.Tensor], tuple],
    skip: bool,
) -> tf.Tensor:
    """Fails on, or counts, the records of a chunk whose `ok` is False.

    The description is built only when a chunk holds a bad record, so good
    data pays for one `reduce_all`.

    Args:
      ok: bool [n], whether each record of the chunk is usable.
      describe: Given the int64 indexes of the bad records, returns string
        tensors `(files, messages)`, each message `"<file>, record <n>: <problem>"`.
      skip: Count and drop bad records instead of failing.

    Returns:
      An int64 scalar (bad records noted) that the chunk's output must depend on.
    """

    def on_bad() -> tf.Tensor:
        files, messages = describe(tf.where(tf.logical_not(ok))[:, 0])
        if skip:
            return tf.py_function(COUNTER.note, [files, messages], tf.int64)
        failure = tf.debugging.Assert(
            False, [tf.strings.join([START, messages[0], END])], summarize=1
        )
        with tf.control_dependencies([failure]):
            return tf.constant(0, tf.int64)

    return tf.cond(tf.reduce_all(ok), lambda: tf.constant(0, tf.int64), on_bad)
