"""A directory at a URL, reached through fsspec: files, listings, the access check.

fsspec rather than pyarrow's file systems: one pure-Python interface for
every object store (`s3fs`, `gcsfs`, `adlfs`, and any other implementation
fsspec knows), each a small package that follows its cloud's own conventions
(s3fs reads AWS's standard variables and files through botocore,
`AWS_ENDPOINT_URL` included); pyarrow's S3 would add a 40 MB wheel whose C++
SDK reads the same settings on its own terms, and no Azure.

Every error a task or the launcher can meet at the start is one line
(`check_access`): refused credentials and a missing bucket are usage errors
(exit 2); a store that cannot be reached is retryable (exit 160), as it may
come back.
"""

from __future__ import annotations

import os
import posixpath
import threading
from typing import Dict, Iterable, Optional, Tuple

from estimator_dist.base.errors import StorageUnreachableError, UsageError
from estimator_dist.storage.location import scheme

#: The package each scheme needs, for the message when it is missing.
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs"}
#: The storage library is not installed.
NO_LIBRARY = (
    "{url}: reading and writing {scheme}:// needs the Python package {package}, which is not "
    "installed ({detail}). Install it, e.g. pip install 'estimator-dist[s3]' for s3://."
)
#: The scheme is one fsspec does not know.
UNKNOWN_SCHEME = (
    "{url}: no file-system library serves the scheme {scheme}:// ({detail}). Use s3://, gs://, "
    "az:// or another scheme fsspec lists, or a local path."
)
#: The storage refused the credentials or the write.
REFUSED = (
    "{url}: the storage refused access ({detail}). For s3:// the credentials come from AWS's "
    "standard variables and files (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
    "~/.aws/credentials; AWS_ENDPOINT_URL for another S3 service); give ones that may write "
    "there."
)
#: The bucket does not exist.
NO_BUCKET = (
    "{url}: the bucket {bucket!r} does not exist ({detail}). Create it first, or name an "
    "existing bucket."
)
#: The storage did not answer.
UNREACHABLE = (
    "{url}: the storage cannot be reached ({detail}); check the network and, for an "
    "S3-compatible service, AWS_ENDPOINT_URL."
)
#: The object a task writes and removes to check it may write.
PROBE = ".estimator_dist-probe-{role}"


class Remote:
    """A directory at `url`, read and written through fsspec.

    Each `Remote` has a file-system instance of its own, so threads that each
    hold one never share a connection pool.

    Args:
      url: The directory, e.g. `s3://bucket/run1`.

    Raises:
      UsageError: when no installed library serves the URL's scheme.
    """

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url.rstrip("/")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True)
        except ImportError as error:
            found = scheme(url) or "?"
            package = PACKAGES.get(found, f"that serves {found}://")
            raise UsageError(
                NO_LIBRARY.format(url=url, scheme=found, package=package, detail=error)
            ) from None
        except ValueError as error:
            raise UsageError(
                UNKNOWN_SCHEME.format(url=url, scheme=scheme(url), detail=error)
            ) from None
        self.root = self.root.rstrip("/")
        self._lock = threading.Lock()

    def path(self, relative: str) -> str:
        """The file system's path of `relative` (a `/`-separated path under the directory)."""
        return posixpath.join(self.root, relative) if relative else self.root

    def put(self, local: str, relative: str) -> None:
        """Uploads the local file `local` to `relative`, as one object."""
        self.fs.put_file(local, self.path(relative))

    def get(self, relative: str, local: str) -> None:
        """Downloads `relative` to the local file `local`, which appears whole or not at all."""
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        partial = f"{local}.part-{os.getpid()}-{threading.get_ident()}"
        try:
            self.fs.get_file(self.path(relative), partial)
            os.replace(partial, local)
        finally:
            if os.path.exists(partial):
                os.remove(partial)

    def read(self, relative: str) -> Optional[bytes]:
        """The bytes of `relative`, or None when there is no such object."""
        try:
            return self.fs.cat_file(self.path(relative))
        except FileNotFoundError:
            return None

    def write(self, relative: str, data: bytes) -> None:
        """Writes `data` to `relative` as one object."""
        self.fs.pipe_file(self.path(relative), data)

    def remove(self, relatives: Iterable[str]) -> None:
        """Removes the objects `relatives`; ones already gone are no error."""
        for relative in relatives:
            try:
                self.fs.rm_file(self.path(relative))
            except FileNotFoundError:
                pass

    def files_of(self, stem: str) -> Dict[str, int]:
        """The objects directly in the directory whose names start with `stem`, with sizes.

        One listing of the directory's own level (not of `eval/`, `export/`...).
        """
        self.fs.invalidate_cache(self.root)
        try:
            found = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return {}
        names = {}
        for info in found:
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if info.get("type") == "file" and name.startswith(stem):
                names[name] = int(info.get("size") or 0)
        return names

    def listing(self, relative: str = "") -> Dict[str, Tuple[int, str]]:
        """Every object under `relative`: its path relative to the directory, size and tag.

        The tag (an ETag, or the modification time) changes when the object
        is rewritten. Listings are never served from fsspec's cache.
        """
        top = self.path(relative)
        self.fs.invalidate_cache(top)
        try:
            found = self.fs.find(top, detail=True, withdirs=False)
        except FileNotFoundError:
            return {}
        prefix = self.root + "/"
        listing = {}
        for name, info in found.items():
            name = name.rstrip("/")
            if not name.startswith(prefix):
                continue
            tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("md5Hash")
            listing[name[len(prefix) :]] = (int(info.get("size") or 0), str(tag))
        return listing


def check_access(url: str, role: str) -> None:
    """Checks that this task may write, read and remove an object at `url`.

    Args:
      url: The job's storage URL.
      role: Names the probe object (`.estimator_dist-probe-<role>`).

    Raises:
      UsageError: for refused credentials, a missing bucket or a scheme no
        installed library serves (exit 2).
      StorageUnreachableError: when the storage does not answer (exit 160,
        retryable).
    """
    remote = Remote(url)
    probe = PROBE.format(role=role)
    try:
        remote.write(probe, b"estimator_dist\n")
        remote.read(probe)
        remote.remove([probe])
    except PermissionError as error:
        raise UsageError(REFUSED.format(url=url, detail=one_line(error))) from None
    except FileNotFoundError as error:
        bucket = remote.root.split("/", 1)[0]
        raise UsageError(NO_BUCKET.format(url=url, bucket=bucket, detail=one_line(error))) from None
    except Exception as error:  # Each library has its own connection errors (botocore's, ...).
        raise StorageUnreachableError(UNREACHABLE.format(url=url, detail=one_line(error))) from None


def one_line(error: BaseException) -> str:
    """An exception as one short line, for messages.

    >>> one_line(OSError("Could not connect\\nto the endpoint"))
    'OSError: Could not connect to the endpoint'
    """
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]
