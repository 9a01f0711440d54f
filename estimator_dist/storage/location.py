"""Where a task works and where the job's results live.

TensorFlow 2.15 to 2.21 reads and writes `gs://` itself but has no `s3://`
(tensorflow-io, which added it, is no longer released). So a job whose results
live at a URL TensorFlow cannot write works in a local directory on each task,
and `estimator_dist.storage.sync` keeps the URL up to date:

* `--model_dir=s3://bucket/run1`: every task works in a directory of its own
  that the package chooses (`$ESTIMATOR_DIST_WORK_DIR`, else the system's
  temporary directory, then the URL and the task's role);
* `--model_dir=/local/run1 --storage=s3://bucket/run1`: every task works in
  `/local/run1` on its own machine (no shared file system), the results live
  at the URL;
* a local path, or a URL TensorFlow writes itself (`gs://`) with no
  `--storage`: TensorFlow writes there directly, as before.

>>> placement = place("s3://bucket/run1", None, work_dir="/scratch")
>>> placement.url, placement.local_dir("worker-0")
('s3://bucket/run1', '/scratch/s3/bucket/run1/worker-0')
>>> place("/shared/run1", None).url is None
True
>>> place("/data/run1", "s3://bucket/run1").local_dir("chief-0")
'/data/run1'
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from typing import Optional

from estimator_dist.base.errors import UsageError

#: Schemes TensorFlow 2.15-2.21 reads and writes itself: a model_dir there needs no sync.
TF_SCHEMES = ("gs", "hdfs", "viewfs", "file", "ram")
#: The environment variable naming the directory tasks work in for a URL model_dir.
WORK_DIR_ENV = "ESTIMATOR_DIST_WORK_DIR"
#: `--storage` given with a model_dir that is itself a URL.
TWO_URLS = (
    "--storage={storage} names where results live, so --model_dir must be a local path on "
    "each task's machine; received --model_dir={model_dir}. Drop --storage to work in "
    "--model_dir={model_dir} directly, or give --model_dir a local path such as /tmp/run1."
)
#: `--storage` that is not a URL.
NOT_A_URL = (
    "--storage={storage} is not a URL such as s3://bucket/run1 or gs://bucket/run1; it names "
    "the object storage the job's results go to. Give a URL, or drop --storage to keep "
    "results in --model_dir."
)

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)$")


def scheme(path: str) -> Optional[str]:
    """The URL scheme of `path` (`s3`, `gs`, ...), or None for a local path.

    >>> scheme("s3://bucket/run1"), scheme("/tmp/run1"), scheme("file:///tmp/x")
    ('s3', None, 'file')
    """
    found = _URL.match(path)
    return found.group(1).lower() if found else None


def is_url(path: Optional[str]) -> bool:
    """Whether `path` is a URL (`scheme://...`) rather than a local path."""
    return bool(path) and scheme(path) is not None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a job's tasks work and where its results live.

    Attributes:
      model_dir: The job's `--model_dir`, as given.
      url: Where the results live when the package synchronises them (the
        URL `--model_dir` or `--storage` names); None when TensorFlow writes
        `model_dir` directly.
      work_root: The local directory the tasks work in: `--model_dir` itself
        with `--storage`, or the root of per-task directories for a URL.
      per_task: Whether each task works in `work_root/<role>`.
    """

    model_dir: str
    url: Optional[str] = None
    work_root: Optional[str] = None
    per_task: bool = False

    @property
    def synced(self) -> bool:
        """Whether the package moves files between the tasks' disks and `url`."""
        return self.url is not None

    def local_dir(self, role: str) -> str:
        """The directory the task `role` gives TensorFlow as its model_dir."""
        root = self.work_root or self.model_dir
        if not self.synced:
            return self.model_dir
        return os.path.join(root, role) if self.per_task else root


def place(model_dir: str, storage: Optional[str], work_dir: Optional[str] = None) -> Placement:
    """Decides where the job's tasks work and where its results live.

    Args:
      model_dir: `--model_dir`: a local path or a URL.
      storage: `--storage`: the URL results go to when model_dir is local on
        each machine; None otherwise.
      work_dir: Where per-task directories go for a URL model_dir; by default
        `$ESTIMATOR_DIST_WORK_DIR`, else the temporary directory's
        `estimator_dist/`.

    Raises:
      UsageError: for a `--storage` that is not a URL, or one given with a
        model_dir that is a URL.
    """
    if storage:
        if not is_url(storage):
            raise UsageError(NOT_A_URL.format(storage=storage))
        if is_url(model_dir):
            raise UsageError(TWO_URLS.format(storage=storage, model_dir=model_dir))
        return Placement(model_dir, storage.rstrip("/"), model_dir)
    if not is_url(model_dir) or scheme(model_dir) in TF_SCHEMES:
        return Placement(model_dir)
    root = (
        work_dir
        or os.environ.get(WORK_DIR_ENV)
        or os.path.join(tempfile.gettempdir(), "estimator_dist")
    )
    return Placement(model_dir, model_dir.rstrip("/"), os.path.join(root, _key(model_dir)), True)


def _key(url: str) -> str:
    """A relative path naming `url`: `s3://bucket/run1` is `s3/bucket/run1`."""
    scheme_, _, rest = url.rstrip("/").partition("://")
    parts = [scheme_.lower(), *[p for p in rest.split("/") if p]]
    return os.path.join(*[re.sub(r"[^A-Za-z0-9._=-]", "_", p) for p in parts if p not in ("..",)])
