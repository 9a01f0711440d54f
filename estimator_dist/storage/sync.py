"""Checkpoints and results moved between a task's local directory and the storage URL.

Three threads, none of them the training thread:

* `Publisher` (every task) uploads what the task writes. On the chief it
  uploads each new checkpoint whole, in an order that never shows a reader
  half of one: the data files, then the `.index`, then the `checkpoint`
  state file naming it; it removes at the URL the checkpoints TensorFlow
  rotated away locally. It starts an upload at most every
  `checkpoint_secs` (and at a flush), always of the newest checkpoint: each
  upload's requests cost the training process CPU and the interpreter lock,
  and a fast model checkpoints several times a second. Every task also
  uploads its results (the chief its event files, `run_record.json` and
  `graph.pbtxt`; the evaluator `eval/`, `export/` and `eval_metrics.json`;
  every task `logs/`), at most every `results_secs` and at a flush.
* `Fetcher` (the evaluator) downloads each new checkpoint the state file at
  the URL names, then writes the local state file, so that TensorFlow's
  evaluator finds it as it finds a checkpoint the chief wrote.
* `Mirror` (every task) keeps the small files the tasks coordinate through
  (preemption requests and decisions, the agreed last step, a program's
  loop results) the same locally and at the URL, both ways.

A failed transfer (the storage is down, say) is retried at the next cycle;
the training thread never waits for one, except at a flush. The upload and
download threads yield the cores to training: they run at nice
`BACKGROUND_NICE` (Linux keeps a nice value per thread). The mirror does not:
under load a niced mirror delivered a stop decision too late.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from absl import logging

from estimator_dist.storage.remote import Remote, one_line

#: TensorFlow's checkpoint state file, naming the latest checkpoint and the kept ones.
STATE_FILE = "checkpoint"
#: The files of a checkpoint `model.ckpt-N`: its data shards, `.index` and `.meta`.
CHECKPOINT_FILE = re.compile(r"^(?P<name>.+-\d+)\.(?P<part>index|meta|data-\d{5}-of-\d{5})$")
#: What each kind of task uploads besides checkpoints (prefixes of relative paths; "" is all).
RESULTS = {
    "chief": ("",),
    "evaluator": ("eval/", "export/", "eval_metrics.json", "logs/"),
    "worker": ("logs/",),
    "ps": ("logs/",),
}
#: Local files never uploaded as results: temporary, partial, locks, other tasks' scratch.
_SKIPPED = re.compile(
    r"(^|/)(tmp_worker_\d+|keras|corrupt)(/|$)|\.tmp-|\.part-|_temp|(^|/)\.[^/]*lock$"
    r"|(^|/)\.estimator_dist-probe"
)
#: The nice value of the threads that move files: training keeps the cores it needs.
BACKGROUND_NICE = 10
#: Least seconds between the starts of two checkpoint uploads (a flush uploads at once). At the
#: default cadence of a fast model (a checkpoint every 0.4 s) uploading each one cost the
#: chief about 7% of its steps (docs/running.md); the storage lags the chief by at most this
#: much and one upload's time.
CHECKPOINT_UPLOAD_SECS = 2.0
_STATE_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"(.*)"\s*$')


def parse_state(text: bytes) -> Tuple[Optional[str], List[str]]:
    """The latest checkpoint and the kept ones a state file names, as base names.

    >>> parse_state(b'model_checkpoint_path: "/a/model.ckpt-20"\\n'
    ...             b'all_model_checkpoint_paths: "/a/model.ckpt-10"\\n'
    ...             b'all_model_checkpoint_paths: "/a/model.ckpt-20"\\n')
    ('model.ckpt-20', ['model.ckpt-10', 'model.ckpt-20'])
    """
    latest, kept = None, []
    for line in text.decode("utf-8", "replace").splitlines():
        found = _STATE_LINE.match(line.strip())
        if found:
            name = os.path.basename(found.group(2).encode().decode("unicode_escape"))
            if found.group(1) == "model_checkpoint_path":
                latest = name
            else:
                kept.append(name)
    if latest is not None and latest not in kept:
        kept.append(latest)
    return latest, kept


def state_text(latest: str, kept: Sequence[str]) -> bytes:
    """A state file naming `latest` and `kept` by relative names, valid in any directory.

    >>> print(state_text("model.ckpt-20", ["model.ckpt-10", "model.ckpt-20"]).decode(), end="")
    model_checkpoint_path: "model.ckpt-20"
    all_model_checkpoint_paths: "model.ckpt-10"
    all_model_checkpoint_paths: "model.ckpt-20"
    """
    names = [name for name in kept if name != latest] + [latest]
    lines = [f'model_checkpoint_path: "{latest}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    return ("\n".join(lines) + "\n").encode()


def _part_order(name: str) -> Tuple[int, str]:
    """Data shards first, `.meta` next, `.index` last: a checkpoint is usable once its index is."""
    part = CHECKPOINT_FILE.match(name)
    rank = {"meta": 1, "index": 2}.get(part.group("part"), 0) if part else 0
    return rank, name


def local_files(local_dir: str, checkpoint: str) -> List[str]:
    """The files of `checkpoint` in `local_dir`, in upload order (index last)."""
    try:
        names = os.listdir(local_dir)
    except FileNotFoundError:
        return []
    found = [n for n in names if (m := CHECKPOINT_FILE.match(n)) and m.group("name") == checkpoint]
    return sorted(found, key=_part_order)


def write_local_state(local_dir: str, latest: str, kept: Sequence[str]) -> None:
    """Writes `local_dir/checkpoint` atomically, naming checkpoints by relative names."""
    path = os.path.join(local_dir, STATE_FILE)
    partial = f"{path}.part-{os.getpid()}"
    with open(partial, "wb") as stream:
        stream.write(state_text(latest, kept))
    os.replace(partial, path)


def download_checkpoint(remote: Remote, local_dir: str, checkpoint: str) -> bool:
    """Downloads the files of `checkpoint` not already here whole, index last.

    Returns:
      Whether the storage holds the checkpoint's index and data (a checkpoint
      rotated away meanwhile is not there).
    """
    sizes = remote.files_of(f"{checkpoint}.")
    parts = sorted(
        (n for n in sizes if (m := CHECKPOINT_FILE.match(n)) and m.group("name") == checkpoint),
        key=_part_order,
    )
    if not any(name.endswith(".index") for name in parts):
        return False
    for name in parts:
        local = os.path.join(local_dir, name)
        if os.path.exists(local) and os.path.getsize(local) == sizes[name]:
            continue
        try:
            remote.get(name, local)
        except FileNotFoundError:  # The chief rotated it away after the listing.
            return False
    return True


def _latest(remote: Remote) -> Optional[str]:
    """The checkpoint the storage's state file names latest, or None."""
    text = remote.read(STATE_FILE)
    return parse_state(text)[0] if text else None


def restore_latest(remote: Remote, local_dir: str) -> Optional[str]:
    """Makes `local_dir` hold the checkpoint the storage names latest, and name it alone.

    The storage is the truth every task agrees on: a local state file
    naming something else (a checkpoint the chief saved but never uploaded)
    is replaced, or removed when the storage has no checkpoint yet.

    Returns:
      The restored checkpoint's name, or None when the storage has none.
    """
    os.makedirs(local_dir, exist_ok=True)
    started = time.monotonic()
    latest, tried = _latest(remote), set()
    # The chief may rotate the checkpoint away while this task downloads it (an evaluator
    # starting mid-job); by then the storage names a newer one: take that instead.
    while latest is not None and latest not in tried:
        tried.add(latest)
        if download_checkpoint(remote, local_dir, latest):
            break
        latest = _latest(remote)
    else:
        latest = None
    state = os.path.join(local_dir, STATE_FILE)
    if latest is None:
        if os.path.exists(state):
            logging.warning(
                "estimator_dist: %s has no checkpoint; %s's local one is not used.",
                remote.url,
                local_dir,
            )
            os.remove(state)
        return None
    write_local_state(local_dir, latest, [latest])
    logging.info(
        "estimator_dist: restored %s from %s into %s in %.2f s.",
        latest,
        remote.url,
        local_dir,
        time.monotonic() - started,
    )
    return latest


class _Loop(threading.Thread):
    """A daemon thread that runs `cycle` every `poll_secs`, retrying failures, and flushes.

    `flush(timeout)` waits until one whole cycle that started after the call
    succeeded. A failed cycle is logged once (and its recovery too), then
    retried at the next one.
    """

    def __init__(self, name: str, url: str, poll_secs: float) -> None:
        super().__init__(name=name, daemon=True)
        self.remote = Remote(url)
        self._poll_secs = poll_secs
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._done = threading.Condition()
        self._asked = 0  # Flushes asked for.
        self._served = 0  # The flush generation the last successful cycle covered.
        self.failing: Optional[str] = None

    def cycle(self) -> None:
        raise NotImplementedError

    #: Whether this thread runs at `BACKGROUND_NICE`.
    background = True

    def run(self) -> None:
        if self.background:
            _yield_cores()
        while not self._stopped.is_set():
            with self._done:
                generation = self._asked
            try:
                self.cycle()
            except Exception as error:  # The storage's errors are many; each is retried.
                if self.failing is None:
                    logging.warning(
                        "estimator_dist: %s: %s failed (%s); retrying every %g s.",
                        self.name,
                        self.remote.url,
                        one_line(error),
                        self._poll_secs,
                    )
                self.failing = one_line(error)
            else:
                if self.failing is not None:
                    logging.warning(
                        "estimator_dist: %s: %s answers again.", self.name, self.remote.url
                    )
                self.failing = None
                with self._done:
                    self._served = generation
                    self._done.notify_all()
            self._wake.wait(self._poll_secs)
            self._wake.clear()

    def flush(self, timeout: float) -> bool:
        """Waits until a cycle started after this call succeeded; False at `timeout`."""
        with self._done:
            self._asked += 1
            wanted = self._asked
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._done:
            while self._served < wanted:
                left = deadline - time.monotonic()
                if left <= 0 or not self.is_alive():
                    return False
                self._done.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()


class Publisher(_Loop):
    """Uploads a task's new checkpoints (the chief's) and its results.

    Args:
      url: The job's storage URL.
      local_dir: The task's local model_dir.
      kind: `chief`, `worker`, `ps` or `evaluator`: what it uploads.
      uploaded: The checkpoint the storage already holds (restored at the start).
      shared: Relative paths the `Mirror` keeps, never uploaded as results.
      poll_secs: How often the local state file is looked at.
      results_secs: Least seconds between two uploads of the results.
      checkpoint_secs: Least seconds between the starts of two checkpoint uploads.
    """

    def __init__(
        self,
        url: str,
        local_dir: str,
        kind: str,
        uploaded: Optional[str] = None,
        shared: Sequence[str] = (),
        poll_secs: float = 0.5,
        results_secs: float = 10.0,
        checkpoint_secs: float = CHECKPOINT_UPLOAD_SECS,
    ) -> None:
        super().__init__(f"upload-{kind}", url, poll_secs)
        self._checkpoint_secs = checkpoint_secs
        self._checkpoint_at = -checkpoint_secs
        self._local = local_dir
        self._shared = tuple(p.strip("/") for p in shared)
        self._kind = kind
        self._results_secs = results_secs
        self._results_at = 0.0
        self._state_seen: Optional[Tuple[int, int]] = None
        self._at_url: Set[str] = {uploaded} if uploaded else set()
        # The files uploaded of each checkpoint at the URL, for its removal without a listing.
        self._parts: Dict[str, List[str]] = {}
        self._sent: Dict[str, Tuple[int, int]] = {}
        #: The checkpoints uploaded, in order, with the seconds each took.
        self.uploads: List[Tuple[str, float]] = []
        self._flushing = False

    def flush(self, timeout: float) -> bool:
        self._flushing = True
        return super().flush(timeout)

    def cycle(self) -> None:
        now = time.monotonic()
        if self._kind == "chief" and (
            self._flushing or now - self._checkpoint_at >= self._checkpoint_secs
        ):
            if self._checkpoints():
                self._checkpoint_at = now
        # Not at every checkpoint: event files grow, and each upload sends one whole.
        if self._flushing or now - self._results_at >= self._results_secs:
            self._results()
            self._results_at = now

    def _checkpoints(self) -> bool:
        """Uploads the latest local checkpoint if it is new; returns whether it did."""
        path = os.path.join(self._local, STATE_FILE)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return False
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._state_seen:
            return False
        with open(path, "rb") as stream:
            latest, kept = parse_state(stream.read())
        if latest is None or latest in self._at_url:
            self._state_seen = seen
            return False
        started = time.monotonic()
        parts = local_files(self._local, latest)
        if not any(name.endswith(".index") for name in parts):
            self._state_seen = seen  # Rotated away already: a newer one follows.
            return False
        for name in parts:
            self.remote.put(os.path.join(self._local, name), name)
        self._at_url.add(latest)
        self._parts[latest] = parts
        gone = self._at_url - set(kept)
        listed = [name for name in kept if name in self._at_url]
        self.remote.write(STATE_FILE, state_text(latest, listed))
        self._remove(gone)
        self._state_seen = seen
        self.uploads.append((latest, time.monotonic() - started))
        logging.info(
            "estimator_dist: uploaded %s to %s in %.2f s.",
            latest,
            self.remote.url,
            self.uploads[-1][1],
        )
        return True

    def _remove(self, checkpoints: Set[str]) -> None:
        """Removes at the URL the checkpoints TensorFlow rotated away here, index first."""
        for checkpoint in checkpoints:
            parts = self._parts.pop(checkpoint, None)
            if parts is None:  # Uploaded by an earlier attempt: its files are listed once.
                parts = list(self.remote.files_of(f"{checkpoint}."))
            self.remote.remove(sorted(parts, key=_part_order, reverse=True))
            self._at_url.discard(checkpoint)

    def _results(self) -> None:
        """Uploads this kind of task's result files that are new or changed since last time."""
        prefixes = RESULTS[self._kind]
        for relative, seen in _walk(self._local):
            if not any(relative.startswith(p) for p in prefixes) or _not_result(relative):
                continue
            if _is_shared(relative, self._shared):
                continue
            if self._sent.get(relative) != seen:
                self.remote.put(os.path.join(self._local, relative), relative)
                self._sent[relative] = seen


class Fetcher(_Loop):
    """The evaluator's: downloads each new checkpoint the storage names, keeping `keep` locally.

    Args:
      url: The job's storage URL.
      local_dir: The evaluator's local model_dir.
      current: The checkpoint already downloaded (at the start), if any.
      poll_secs: How often the storage's state file is read.
      keep: Checkpoints kept locally (the one TensorFlow may be restoring included).
    """

    def __init__(
        self,
        url: str,
        local_dir: str,
        current: Optional[str] = None,
        poll_secs: float = 1.0,
        keep: int = 3,
    ) -> None:
        super().__init__("download-checkpoints", url, poll_secs)
        self._local = local_dir
        self._have: List[str] = [current] if current else []
        self._keep = keep

    def cycle(self) -> None:
        text = self.remote.read(STATE_FILE)
        latest = parse_state(text)[0] if text else None
        if latest is None or (self._have and self._have[-1] == latest):
            return
        if not download_checkpoint(self.remote, self._local, latest):
            return  # Rotated away between the two reads; the next cycle sees the newer one.
        self._have.append(latest)
        dropped, self._have = self._have[: -self._keep], self._have[-self._keep :]
        write_local_state(self._local, latest, self._have)
        for checkpoint in dropped:
            for name in local_files(self._local, checkpoint):
                os.remove(os.path.join(self._local, name))
        logging.info("estimator_dist: downloaded %s from %s.", latest, self.remote.url)


class Mirror(_Loop):
    """Keeps the files the tasks coordinate through the same here and at the URL, both ways.

    Each such file has one writer (a task's own request, the chief's
    decision), so a file changed here is uploaded and one changed at the URL
    is downloaded; a removal travels too. Files under `shared` present here
    at the start are removed first: the storage holds the job's state.

    Args:
      url: The job's storage URL.
      local_dir: The task's local model_dir.
      shared: Relative paths (files or directories) kept the same.
      poll_secs: How often both sides are listed.
    """

    def __init__(
        self, url: str, local_dir: str, shared: Sequence[str], poll_secs: float = 1.0
    ) -> None:
        super().__init__("mirror", url, poll_secs)
        self.background = False
        self._local = local_dir
        self._shared = tuple(p.strip("/") for p in shared)
        # relative path -> (local (mtime_ns, size), the storage's tag) when last the same.
        self._known: Dict[str, Tuple[Tuple[int, int], str]] = {}
        for relative, _ in self._here():
            os.remove(os.path.join(local_dir, relative))

    def _here(self) -> Iterable[Tuple[str, Tuple[int, int]]]:
        for relative, seen in _walk(self._local):
            if _is_shared(relative, self._shared) and not _not_result(relative):
                yield relative, seen

    def cycle(self) -> None:
        there: Dict[str, str] = {}
        for path in self._shared:
            for relative, (_, tag) in self.remote.listing(path).items():
                if _is_shared(relative, self._shared):
                    there[relative] = tag
        here = dict(self._here())
        for relative, seen in here.items():
            known = self._known.get(relative)
            if known is None and relative in there:
                continue  # Downloaded below.
            if known is None or known[0] != seen:
                self.remote.put(os.path.join(self._local, relative), relative)
                tag = self.remote.listing(relative).get(relative, (0, ""))[1]
                self._known[relative] = (seen, tag)
                there[relative] = tag
        for relative, tag in there.items():
            known = self._known.get(relative)
            if known is None or known[1] != tag:
                local = os.path.join(self._local, relative)
                self.remote.get(relative, local)
                stat = os.stat(local)
                self._known[relative] = ((stat.st_mtime_ns, stat.st_size), tag)
                here[relative] = self._known[relative][0]
        for relative in list(self._known):
            if relative not in here:
                self.remote.remove([relative])
                del self._known[relative]
            elif relative not in there:
                os.remove(os.path.join(self._local, relative))
                del self._known[relative]


def _yield_cores() -> None:
    """Lowers this thread's priority to `BACKGROUND_NICE`."""
    try:
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(own, BACKGROUND_NICE))
    except (AttributeError, OSError):  # Not Linux, or not allowed: full priority then.
        pass


def _walk(local_dir: str) -> Iterable[Tuple[str, Tuple[int, int]]]:
    """Every file under `local_dir`: its `/`-separated relative path and (mtime_ns, size)."""
    for top, dirs, names in os.walk(local_dir):
        dirs[:] = [d for d in dirs if not _SKIPPED.search(d + "/")]
        for name in names:
            path = os.path.join(top, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            yield (
                os.path.relpath(path, local_dir).replace(os.sep, "/"),
                (stat.st_mtime_ns, stat.st_size),
            )


def _not_result(relative: str) -> bool:
    """Checkpoints, the state file and scratch files: never uploaded as results."""
    name = relative.rsplit("/", 1)[-1]
    return bool(
        CHECKPOINT_FILE.match(name)
        and "/" not in relative
        or relative == STATE_FILE
        or _SKIPPED.search(relative)
    )


def _is_shared(relative: str, shared: Sequence[str]) -> bool:
    return any(relative == p or relative.startswith(p + "/") for p in shared)
