"""Recording which examples each input pipeline reads (`record_read_ids`).

With `--params=record_read_ids=DIR`, every training input pipeline writes
the ids of the examples it reads in its first epoch to
`DIR/pipeline-<i>-of-<n>.ids`: a header line, one id per line, and `END`
once the pipeline has read its whole shard. `python -m input_fns.verify`
then checks across pipelines that the shards are disjoint and together
cover the data. Ids are an id feature (`id_feature`) or a content hash.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
import threading
from typing import Any, Callable, Dict

import tensorflow as tf

END = "# end of first epoch"
_NAME = re.compile(r"pipeline-(\d+)-of-(\d+)\.ids$")


def ids_path(directory: str, pipeline_id: int, pipelines: int) -> str:
    """The file where input pipeline `pipeline_id` of `pipelines` records its ids."""
    return os.path.join(directory, f"pipeline-{pipeline_id:03d}-of-{pipelines:03d}.ids")


class _Writers:
    """Id files written by this process.

    A file is rewritten on its first write; once a pipeline has finished
    its first epoch, later writes and ends are ignored, because later epochs
    read the same examples again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: Dict[str, Any] = {}
        self._complete: set = set()

    def _open(self, path: str, header: str) -> Any:
        if path not in self._files:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            stream = open(path, "w", encoding="utf-8")
            stream.write(f"# {header}\n")
            self._files[path] = stream
        return self._files[path]

    def write(self, path: str, header: str, values: tf.Tensor) -> tf.Tensor:
        with self._lock:
            if path not in self._complete:
                stream = self._open(path, header)
                stream.writelines(
                    f"{value.decode('utf-8', 'replace')}\n" for value in values.numpy()
                )
                stream.flush()
        return tf.constant(0, tf.int64)

    def finish(self, path: str, header: str) -> tf.Tensor:
        with self._lock:
            if path not in self._complete:
                stream = self._open(path, header)
                stream.write(END + "\n")
                stream.close()
                del self._files[path]
                self._complete.add(path)
        return tf.constant(0, tf.int64)

    def is_complete(self, path: str) -> bool:
        with self._lock:
            return path in self._complete

    def forget(self, path: str) -> None:
        """Lets a new pipeline record to `path` again (for `simulate`)."""
        with self._lock:
            stream = self._files.pop(path, None)
            self._complete.discard(path)
        if stream is not None:
            stream.close()


WRITERS = _Writers()


def record_ids(
    chunks: tf.data.Dataset,
    ids_fn: Callable[[Any], tf.Tensor],
    path: str,
    header: str,
) -> tf.data.Dataset:
    """Passes `chunks` through unchanged, writing the ids of their examples to `path`.

    Args:
      chunks: Batches of one epoch's examples (every component has a leading
        batch dimension and fully known inner dimensions).
      ids_fn: Returns the string ids [n] of one batch.
      path: The id file of this pipeline.
      header: Written as the file's first line (after `# `).

    Returns:
      The same batches; after the last one, `END` is written. Only the first
      epoch is recorded when the result is repeated.
    """

    def write(element: Any) -> Any:
        written = tf.py_function(
            functools.partial(WRITERS.write, path, header), [ids_fn(element)], tf.int64
        )
        with tf.control_dependencies([written]):
            return tf.nest.map_structure(tf.identity, element)

    def finish(element: Any) -> Any:
        done = tf.py_function(functools.partial(WRITERS.finish, path, header), [], tf.int64)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, element)

    empty = tf.nest.map_structure(
        lambda spec: tf.zeros([0, *spec.shape[1:]], spec.dtype), chunks.element_spec
    )
    # Sequential map: END is written only after every id before it.
    return chunks.map(write).concatenate(tf.data.Dataset.from_tensors(empty).map(finish))


def content_hash(values: tf.Tensor) -> tf.Tensor:
    """64-bit fingerprints of strings, as decimal strings: ids for records without one."""
    return tf.strings.as_string(tf.strings.to_hash_bucket_fast(values, tf.int64.max))


def as_id_strings(values: tf.Tensor) -> tf.Tensor:
    """An id feature's values as strings."""
    return values if values.dtype == tf.string else tf.strings.as_string(values)


@dataclasses.dataclass(frozen=True)
class PipelineIds:
    """The ids one pipeline recorded.

    Attributes:
      pipeline_id: The pipeline's index.
      pipelines: Pipelines in the job that wrote the file.
      ids: Each id read in the first epoch, in order, repeats included.
      complete: Whether the pipeline finished its first epoch.
      header: The file's first line.
    """

    pipeline_id: int
    pipelines: int
    ids: tuple
    complete: bool
    header: str


def read_ids(directory: str) -> Dict[int, PipelineIds]:
    """Reads every `pipeline-*.ids` file of `directory`, by pipeline id.

    Raises:
      ValueError: if there is no id file, or the files disagree on the
        number of pipelines.
    """
    paths = sorted(glob.glob(os.path.join(directory, "pipeline-*-of-*.ids")))
    counts = sorted({int(_NAME.search(path).group(2)) for path in paths})
    if len(counts) > 1:
        raise ValueError(
            f"The id files in {directory!r} come from jobs with {counts} pipelines; "
            "use a fresh directory for each job."
        )
    found: Dict[int, PipelineIds] = {}
    for path in paths:
        match = _NAME.search(path)
        with open(path, encoding="utf-8") as stream:
            lines = stream.read().splitlines()
        header = lines[0][2:] if lines and lines[0].startswith("# ") else ""
        body = lines[1:] if header else lines
        complete = END in body
        ids = tuple(body[: body.index(END)] if complete else body)
        pipeline = PipelineIds(int(match.group(1)), int(match.group(2)), ids, complete, header)
        found[pipeline.pipeline_id] = pipeline
    if not found:
        raise ValueError(
            f"No id files (pipeline-*-of-*.ids) in {directory!r}. Train with "
            f"--params=record_read_ids={directory} first, or check the directory."
        )
    return found
