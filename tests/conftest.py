"""Shared fixtures, and the check that keeps `make test-fast` free of processes.

`shared_run` lets one end-to-end job serve several tests that assert different
things about it: the first test that asks for a scenario runs it, the others
read its result (or fail with its error). The set-ups themselves (clusters of
tasks on free ports, waiting for a step or a checkpoint) are in `tests/procs.py`.

A test that starts a Python process (a task, the launcher, any entry point)
must carry the `multiprocess` mark, on the test or as the module's
`pytestmark`: `make test-fast` (`pytest -m "not multiprocess"`) leaves those
out. An unmarked test that starts one fails at once, saying so.

The fault suite: a test marked `fault` injects one fault into a real job and
asserts its end (the final step, the steps lost, the time to detection). It
takes the `fault_seed` argument, one run per seed in `ESTIMATOR_DIST_FAULT_SEEDS`
(comma-separated; "1" when unset, which is what `make test` runs), and while it
runs, `ESTIMATOR_DIST_BUSY_CORES=n` keeps n other processes spinning on the
CPU. `make faults` runs every fault with seeds 1 to 5, once on a quiet machine
and once with one core busy.
"""

import os
import subprocess
import sys
from typing import Any, Callable, Dict, Hashable, Tuple

import pytest

# Before any test module imports TensorFlow, as every entry point of the package does:
# on TensorFlow 2.16+, tf.estimator needs the compatibility layer (tf_runtime/compat.py).
import estimator_dist  # noqa: F401

#: The mark of tests that start worker processes, a launcher or a cluster (see pytest.ini).
MULTIPROCESS = "multiprocess"

#: The mark of the fault suite's tests (see pytest.ini), and the environment variables it reads.
FAULT = "fault"
FAULT_SEEDS_ENV = "ESTIMATOR_DIST_FAULT_SEEDS"
BUSY_CORES_ENV = "ESTIMATOR_DIST_BUSY_CORES"


def _fault_seeds() -> Tuple[int, ...]:
    text = os.environ.get(FAULT_SEEDS_ENV, "1")
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        seeds = ()
    if not seeds:
        raise pytest.UsageError(
            f"{FAULT_SEEDS_ENV}={text!r} is not a list of seeds: expected integers separated "
            f"by commas, such as {FAULT_SEEDS_ENV}=1,2,3,4,5"
        )
    return seeds


def pytest_configure(config: pytest.Config) -> None:
    """Refuses a malformed seed list before collection, in one line."""
    _fault_seeds()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One run of each fault test per seed of the fault suite."""
    if "fault_seed" in metafunc.fixturenames:
        metafunc.parametrize("fault_seed", _fault_seeds())


@pytest.fixture(autouse=True)
def _busy_cores(request: pytest.FixtureRequest):
    """Keeps `ESTIMATOR_DIST_BUSY_CORES` processes spinning while a fault test runs."""
    count = int(os.environ.get(BUSY_CORES_ENV, "0") or 0)
    if count <= 0 or request.node.get_closest_marker(FAULT) is None:
        yield
        return
    spinners = [
        subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A TFDS data_dir holding the prepared embedded digits dataset."""
    from input_fns import digits

    path = str(tmp_path_factory.mktemp("tfds"))
    digits.prepare({"data_dir": path})
    return path


@pytest.fixture(scope="session")
def shared_run() -> Callable[[Hashable, Callable[[], Any]], Any]:
    """`shared_run(key, run)`: `run()` the first time `key` is asked for, its result after.

    For a scenario (a cluster started, faulted, waited for) whose outcome several tests
    check, each its own point. A run that failed (a timeout, a task that did not start)
    fails every test that asks for it, with the same message; a skip is not kept, so each
    test skips for itself. Every test still makes its own assertions on the result.
    """
    done: Dict[Hashable, Tuple[Any, BaseException]] = {}

    def get(key: Hashable, run: Callable[[], Any]) -> Any:
        if key not in done:
            try:
                done[key] = (run(), None)
            except Exception as error:  # re-raised below, in every test that asks
                done[key] = (None, error)
        result, error = done[key]
        if error is not None:
            raise AssertionError(f"the shared run {key!r} failed: {error}") from error
        return result

    return get


@pytest.fixture(autouse=True)
def no_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without TF_CONFIG, as in a fresh shell: RunConfig and the strategies
    read it, and a value left in the environment would turn a local test into a cluster task."""
    monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture
def patches_installed():
    """The package's TensorFlow patches, installed as the driver does, and removed after."""
    from estimator_dist.tf_runtime import patches

    patches.install()
    yield
    patches.uninstall()


@pytest.fixture
def fresh_bad_data_counter():
    """The process-wide count of skipped bad records, zero before and after the test."""
    from input_fns import bad_data

    bad_data.COUNTER.reset()
    yield
    bad_data.COUNTER.reset()


def _is_python(args: object) -> bool:
    """Whether a command line starts Python (possibly under a prefix such as `unshare ...`)."""
    words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    words = [os.fsdecode(word) for word in words]
    return sys.executable in words or any(
        os.path.basename(word).startswith("python") for word in words
    )


@pytest.fixture(autouse=True)
def _processes_only_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Fails a test that starts a Python process without the `multiprocess` mark."""
    if request.node.get_closest_marker(MULTIPROCESS) is not None:
        return
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        if _is_python(args):
            pytest.fail(
                f"{request.node.nodeid} starts a Python process ({args!r:.120}) but is not "
                f"marked `{MULTIPROCESS}`: add `@pytest.mark.{MULTIPROCESS}` to the test (or "
                f"`pytestmark = pytest.mark.{MULTIPROCESS}` to its module), so that "
                "`make test-fast` leaves it out.",
                pytrace=False,
            )
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
