"""Collective cost alone: all-reduce time against size, next to the loopback floor.

  python -m benchmarks.allreduce --workers=2 --sizes=1,1024,262144,4194304

Each worker process (pinned to its own core where cores allow) builds
MultiWorkerMirroredStrategy in graph mode and starts its gRPC server with
the strategy's session configuration, as Estimator's distribute coordinator
does. It then times chains of all-reduces of a float tensor of each size
(up to 16 in one `session.run`, so session overhead is spread out), as a
strategy's replica context all-reduces gradients.

The floor is what moving the same bytes costs without TensorFlow: one
process sends them over a loopback TCP socket to another, pinned to the
other core, which answers with one byte. A two-worker ring all-reduce sends
and receives that many bytes per worker (two halves, each way at once), so
it cannot beat this copy.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence

from absl import app, flags

from benchmarks import common
from benchmarks.contenders import one_core_each

FLOAT_BYTES = 4
#: 1 float to 4 Mi floats (16 MiB), in steps of 4x.
DEFAULT_SIZES = tuple(4**i for i in range(12))
MAX_CHAIN = 16
CALIBRATION_RUNS = 3
MIN_RUNS = 5
MAX_RUNS = 100_000
PEER_TIMEOUT_SECONDS = 120.0
PEER_POLL_SECONDS = 0.05


def measure_allreduce(
    sizes: Sequence[int],
    seconds: float,
    communication: str = "RING",
    wire_dtype: str = "float32",
) -> Dict[int, float]:
    """Seconds per all-reduce of each size (in values) on this task of TF_CONFIG's cluster.

    Every task of the cluster must call this with the same arguments.
    """
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, communication)
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    config = strategy.extended._update_config_proto(tf.compat.v1.ConfigProto())
    resolver = strategy.cluster_resolver
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        config=config,
        start=True,
    )
    results = {}
    for size in sizes:
        chain = max(1, min(MAX_CHAIN, (1 << 20) // size))
        with tf.Graph().as_default(), strategy.scope():
            start = tf.ones([size], wire_dtype)

            def replica_fn(value: tf.Tensor = start, chain: int = chain) -> tf.Tensor:
                context = tf.distribute.get_replica_context()
                for _ in range(chain):
                    value = context.all_reduce(tf.distribute.ReduceOp.MEAN, value)
                return value

            reduced = strategy.experimental_local_results(strategy.run(replica_fn))[0]
            step = tf.reduce_sum(reduced[:1])
            agree = _run_count_agreement(strategy)
            with tf.compat.v1.Session(server.target, config=config) as session:
                session.run(step)
                times = [_timed(session, step) for _ in range(CALIBRATION_RUNS)]
                runs = agree(session, seconds / statistics.median(times))
                times = [_timed(session, step) / chain for _ in range(runs)]
        results[size] = statistics.median(times)
    return results


def _timed(session: Any, fetch: Any) -> float:
    begin = time.perf_counter()
    session.run(fetch)
    return time.perf_counter() - begin


def _run_count_agreement(strategy: Any) -> Callable[[Any, float], int]:
    """Adds to the current graph what makes every task time the same number of runs.

    Each `session.run` of a collective needs its peer's matching run, so a
    task that stopped after its own time budget would leave its peers
    waiting for a run that never comes (a hang) or failing with "Socket
    closed" when it exits. Every task proposes a count; all take the mean,
    which the all-reduce makes identical on every task.

    Returns:
      `agree(session, proposed_runs)`, the agreed count of runs.
    """
    import tensorflow as tf

    proposed = tf.compat.v1.placeholder(tf.float32, [])
    total = strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(proposed)), axis=None
    )
    workers = strategy.num_replicas_in_sync

    def agree(session: Any, runs: float) -> int:
        mine = float(max(MIN_RUNS, min(MAX_RUNS, round(runs))))
        return max(MIN_RUNS, round(session.run(total, {proposed: mine}) / workers))

    return agree


def _await_peers(outputs: Sequence[str], timeout: float) -> None:
    """Returns once every worker has written its output.

    A task whose last all-reduce has finished may still hold buffers its
    peers have yet to fetch from its gRPC server; exiting then fails their
    fetch with "Socket closed". A written output means that task is done.
    """
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(output) for output in outputs):
        if time.monotonic() > deadline:
            missing = [output for output in outputs if not os.path.exists(output)]
            raise TimeoutError(f"peers did not finish within {timeout:.0f} s: {missing}")
        time.sleep(PEER_POLL_SECONDS)


def _receive(peer: socket.socket, buffer: memoryview) -> None:
    received = 0
    while received < len(buffer):
        received += peer.recv_into(buffer[received:])


def measure_floor(
    sizes: Sequence[int], seconds: float, cores: Sequence[Optional[frozenset]] = (None, None)
) -> Dict[int, float]:
    """Seconds to copy `size` float32 values' bytes to another process over loopback TCP."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    pid = os.fork()
    if pid == 0:
        if cores[1] is not None:
            os.sched_setaffinity(0, cores[1])
        peer = socket.create_connection(listener.getsockname())
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = memoryview(bytearray(max(sizes) * FLOAT_BYTES))
        header = bytearray(8)
        while True:
            _receive(peer, memoryview(header))
            nbytes = int.from_bytes(header, "little")
            if nbytes == 0:
                os._exit(0)
            _receive(peer, buffer[:nbytes])
            peer.sendall(b"k")
    if cores[0] is not None:
        os.sched_setaffinity(0, cores[0])
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    results = {}
    for size in sizes:
        nbytes = size * FLOAT_BYTES
        payload = nbytes.to_bytes(8, "little") + bytes(nbytes)
        times, started = [], time.monotonic()
        while time.monotonic() - started < seconds or len(times) < 5:
            begin = time.perf_counter()
            sock.sendall(payload)
            sock.recv(1)
            times.append(time.perf_counter() - begin)
        results[size] = statistics.median(times)
    sock.sendall(bytes(8))
    os.waitpid(pid, 0)
    sock.close()
    listener.close()
    return results


def benchmark(
    sizes: Sequence[int],
    workers: int = 2,
    seconds: float = 2.0,
    communication: str = "RING",
    wire_dtype: str = "float32",
) -> Dict[int, float]:
    """Seconds per all-reduce of each size on a fresh cluster of `workers` processes."""
    with tempfile.TemporaryDirectory(prefix="allreduce-") as log_dir:
        return _benchmark_in(log_dir, sizes, workers, seconds, communication, wire_dtype)


def _benchmark_in(
    log_dir: str,
    sizes: Sequence[int],
    workers: int,
    seconds: float,
    communication: str,
    wire_dtype: str,
) -> Dict[int, float]:
    outputs = [os.path.join(log_dir, f"result-{i}.json") for i in range(workers)]
    args = [
        f"--sizes={','.join(map(str, sizes))}",
        f"--seconds={seconds}",
        f"--communication={communication}",
        f"--wire_dtype={wire_dtype}",
    ]
    commands = [
        common.python_module(
            "benchmarks.allreduce",
            *args,
            f"--child_output={output}",
            f"--child_peers={','.join(outputs)}",
        )
        for output in outputs
    ]
    envs = [{"TF_CONFIG": tf_config} for tf_config in common.tf_configs(workers)]
    timeout = 120 + 4 * len(sizes) * seconds
    common.run_tasks(commands, envs, one_core_each(workers), log_dir, timeout)
    with open(outputs[0], encoding="utf-8") as stream:
        return {int(size): value for size, value in json.load(stream).items()}


def define_flags() -> None:
    """Defines this program's flags (only when it runs as a program)."""
    flags.DEFINE_list("sizes", [str(s) for s in DEFAULT_SIZES], "Tensor sizes in values.")
    flags.DEFINE_integer("workers", 2, "Workers in the all-reduce.", lower_bound=2)
    flags.DEFINE_float("seconds", 2.0, "Measuring time per size.", lower_bound=0.1)
    flags.DEFINE_enum("communication", "RING", ["RING", "AUTO"], "Collectives.")
    flags.DEFINE_enum("wire_dtype", "float32", ["float32", "bfloat16"], "Values' dtype.")
    flags.DEFINE_string("child_output", None, "Internal: run as one worker; write here.")
    flags.DEFINE_list("child_peers", [], "Internal: every worker's output; exit when all exist.")


def main(argv: Sequence[str]) -> None:
    """Measures and prints all-reduce and floor times per size."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}", exitcode=2)
    f = flags.FLAGS
    sizes = [int(s) for s in f.sizes]
    if f.child_output:
        result = measure_allreduce(sizes, f.seconds, f.communication, f.wire_dtype)
        partial = f.child_output + ".partial"
        with open(partial, "w", encoding="utf-8") as stream:
            json.dump(result, stream)
        os.replace(partial, f.child_output)
        _await_peers(f.child_peers, PEER_TIMEOUT_SECONDS)
        return
    floor = measure_floor(sizes, f.seconds / 2, one_core_each(2))
    reduce = benchmark(sizes, f.workers, f.seconds, f.communication, f.wire_dtype)
    print(f"{'values':>10} {'bytes':>10} {'all-reduce ms':>14} {'floor ms':>9} {'ratio':>7}")
    for size in sizes:
        a, b = reduce[size] * 1e3, floor[size] * 1e3
        print(f"{size:>10} {size * FLOAT_BYTES:>10} {a:>14.3f} {b:>9.3f} {a / b:>7.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    define_flags()
    app.run(main)
