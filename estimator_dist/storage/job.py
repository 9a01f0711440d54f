"""What the launcher reads and writes of a job's results, wherever they live.

The launcher reads a job's latest checkpoint step and final metrics, clears
a stopped attempt's preemption files and keeps each task's log. With a
local or shared model_dir (or `gs://`, which TensorFlow reads) that is
model_dir itself; with results at a URL TensorFlow cannot read (`s3://`),
the steps and metrics are read at the URL, and the logs are written to a
local directory (printed at the start) and uploaded under `URL/logs/`.
No TensorFlow import here for a URL: the launcher starts without it.

>>> results = JobResults("s3://bucket/run1", None, work_dir="/scratch")
>>> results.local_dir, results.where
('/scratch/s3/bucket/run1/launcher', 's3://bucket/run1')
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Optional

from estimator_dist.base import files
from estimator_dist.base.errors import StorageUnreachableError
from estimator_dist.storage import sync
from estimator_dist.storage.location import place
from estimator_dist.storage.remote import UNREACHABLE, Remote, check_access, one_line

#: The role whose directory the launcher keeps logs in, for a URL model_dir.
LAUNCHER = "launcher"
#: Longest the launcher retries a read at the URL (a storage briefly away) before it gives up.
READ_SECS = 120.0


class JobResults:
    """A job's results as the launcher sees them.

    Args:
      model_dir: The job's `--model_dir`.
      storage: Its `--storage`, or None.
      work_dir: Where the launcher's local directory goes for a URL model_dir
        (as `estimator_dist.storage.location.place`).

    Attributes:
      local_dir: The local directory the launcher writes logs to.
      where: Where the results live: model_dir, or the URL.
    """

    def __init__(
        self, model_dir: str, storage: Optional[str] = None, work_dir: Optional[str] = None
    ) -> None:
        self._placement = place(model_dir, storage, work_dir)
        self.local_dir = self._placement.local_dir(LAUNCHER)
        self.where = self._placement.url or model_dir
        self._remote: Optional[Remote] = None

    @property
    def synced(self) -> bool:
        """Whether the results live at a URL the package synchronises with."""
        return self._placement.synced

    def _at_url(self) -> Remote:
        if self._remote is None:
            self._remote = Remote(self.where)
        return self._remote

    def check(self) -> None:
        """Checks the launcher may write at the URL (exit 2 for credentials, a missing bucket)."""
        if self.synced:
            check_access(self.where, LAUNCHER)

    def checkpoint_step(self) -> int:
        """The global step of the latest checkpoint of the job, 0 if none."""
        if not self.synced:
            return files.checkpoint_step(self.where)
        text = self._read(sync.STATE_FILE)
        latest = sync.parse_state(text)[0] if text else None
        return int(latest.rsplit("-", 1)[1]) if latest else 0

    def final_metrics(self) -> Optional[dict]:
        """The evaluator's final metrics, or None."""
        if not self.synced:
            return files.read_final_metrics(self.where)
        import json

        text = self._read(files.METRICS_FILE)
        try:
            record = json.loads(text) if text else None
        except ValueError:
            return None
        return record.get("metrics") if isinstance(record, dict) and record.get("final") else None

    def _read(self, relative: str) -> Optional[bytes]:
        """The object `relative` at the URL, retried while the storage does not answer.

        Raises:
          StorageUnreachableError: after `READ_SECS` of failures (exit 160).
        """
        deadline, pause = time.monotonic() + READ_SECS, 1.0
        while True:
            try:
                return self._at_url().read(relative)
            except Exception as error:  # Each library has its own connection errors.
                if time.monotonic() + pause > deadline:
                    raise StorageUnreachableError(
                        UNREACHABLE.format(url=self.where, detail=one_line(error))
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 15.0)

    def remove(self, relative: str) -> None:
        """Removes the file or directory `relative` of the job's results."""
        if not self.synced:
            import tensorflow as tf

            path = os.path.join(self.where, relative)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            elif tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
            return
        remote = self._at_url()
        remote.remove(sorted(remote.listing(relative)))
        local = os.path.join(self.local_dir, relative)
        shutil.rmtree(local, ignore_errors=True)

    def upload_logs(self) -> None:
        """Uploads the launcher's `logs/` (every task's log) under the URL; nothing when local."""
        if not self.synced:
            return
        logs = os.path.join(self.local_dir, "logs")
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            self._at_url().put(os.path.join(logs, name), f"logs/{name}")
