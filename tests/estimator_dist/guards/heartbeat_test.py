"""Heartbeat: two tasks' heartbeats on loopback ports in one process, with short timeouts.

`exit_fn` records its arguments instead of ending the process. A frozen peer
is a heartbeat stopped and replaced by a plain UDP socket on its port: the
kernel queues the datagrams, nothing answers them, as with SIGSTOP. Every
wait is for a condition, bounded; the ones that must not happen are waited
for several timeouts.
"""

import logging
import socket
import threading
import time
from types import SimpleNamespace

import portpicker
import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.cluster.tf_config import ClusterConfig
from estimator_dist.guards import heartbeat
from estimator_dist.guards.heartbeat import FINISHED, STOPPING, TRAINING, Heartbeat

pytestmark = pytest.mark.timeout(60)

#: The heartbeat timeout of these tests; pings go every tenth of it.
TIMEOUT = 0.6
#: How long a peer that must not be judged is watched: several timeouts.
WATCH = 4 * TIMEOUT


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        time.sleep(0.01)


class Exits:
    """A fake `exit_fn`: records each call and sets an event."""

    def __init__(self):
        self.calls = []
        self.called = threading.Event()

    def __call__(self, role, code, cause):
        self.calls.append((role, code, cause))
        self.called.set()


class Pair:
    """chief-0 and worker-0, each with its heartbeat on a free loopback port."""

    def __init__(self, worker_job="job"):
        self.ports = {"chief-0": portpicker.pick_unused_port()}
        self.ports["worker-0"] = portpicker.pick_unused_port()
        self.addresses = {name: f"127.0.0.1:{port}" for name, port in self.ports.items()}
        self.exits = {name: Exits() for name in self.ports}
        self.preempted = {name: False for name in self.ports}
        jobs = {"chief-0": "job", "worker-0": worker_job}
        self.beats = {name: self.make(name, jobs[name]) for name in self.ports}
        self.frozen = []

    def make(self, name, job):
        (other,) = set(self.ports) - {name}
        beat = Heartbeat(
            name,
            self.ports[name],
            {other: self.addresses[other]},
            job,
            TIMEOUT,
            preempted=lambda: self.preempted[name],
            exit_fn=self.exits[name],
        )
        if name == "chief-0":
            beat.progress(212)  # As its hook would have fetched it.
        return beat

    def start(self):
        for beat in self.beats.values():
            assert beat.start()

    def freeze(self, name):
        """Stops `name`'s heartbeat; its port queues datagrams that nobody answers."""
        self.beats[name].stop()
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("", self.ports[name]))
        self.frozen.append(sock)

    def close(self):
        for beat in self.beats.values():
            beat.stop()
        for sock in self.frozen:
            sock.close()


@pytest.fixture
def pair():
    made = []

    def make(**kwargs):
        made.append(Pair(**kwargs))
        made[-1].start()
        return made[-1]

    yield make
    for one in made:
        one.close()


def test_a_peer_that_falls_silent_is_judged_after_the_timeout(pair):
    tasks = pair()
    chief = tasks.beats["chief-0"]
    chief.training()
    wait_until(lambda: chief.phase_of("worker-0") is not None)
    tasks.freeze("worker-0")
    frozen = time.monotonic()
    assert tasks.exits["chief-0"].called.wait(10), "the silent peer was never judged"
    elapsed = time.monotonic() - frozen
    ((role, code, cause),) = tasks.exits["chief-0"].calls[:1]
    assert (role, code) == ("chief-0", exit_codes.PEER_UNRESPONSIVE)
    # Silence counts from the last answer, at most one ping interval before the freeze.
    assert TIMEOUT - TIMEOUT / 10 - 0.05 <= elapsed < TIMEOUT + 1.0, elapsed
    assert cause.startswith(
        f"peer worker-0 ({tasks.addresses['worker-0']}) has not answered the heartbeat for "
    ), cause
    assert "(--heartbeat_timeout=0.6); the latest global step known is 212." in cause, cause


def answering(tasks):
    """Both train, both answer."""
    for beat in tasks.beats.values():
        beat.training()
    wait_until(lambda: tasks.beats["chief-0"].phase_of("worker-0") == TRAINING)
    wait_until(lambda: tasks.beats["worker-0"].phase_of("chief-0") == TRAINING)


def peer_finished(tasks):
    """The worker's training ended, then it fell silent."""
    tasks.beats["chief-0"].training()
    tasks.beats["worker-0"].training()
    tasks.beats["worker-0"].finished()
    wait_until(lambda: tasks.beats["chief-0"].phase_of("worker-0") == FINISHED)
    tasks.freeze("worker-0")


def peer_preempted(tasks):
    """The worker stops for a preemption, then falls silent."""
    tasks.beats["chief-0"].training()
    tasks.preempted["worker-0"] = True
    wait_until(lambda: tasks.beats["chief-0"].phase_of("worker-0") == STOPPING)
    tasks.freeze("worker-0")


def before_the_first_step(tasks):
    """The worker falls silent before the chief's first step."""
    wait_until(lambda: tasks.beats["chief-0"].phase_of("worker-0") is not None)
    tasks.freeze("worker-0")


def after_training(tasks):
    """The worker falls silent once the chief's training ended."""
    tasks.beats["chief-0"].training()
    wait_until(lambda: tasks.beats["chief-0"].phase_of("worker-0") is not None)
    tasks.beats["chief-0"].finished()
    tasks.freeze("worker-0")


def stopping_itself(tasks):
    """The chief stops for a preemption; the worker falls silent."""
    tasks.beats["chief-0"].training()
    wait_until(lambda: tasks.beats["chief-0"].phase_of("worker-0") is not None)
    tasks.preempted["chief-0"] = True
    tasks.freeze("worker-0")


def test_no_one_is_judged_unless_both_train_and_the_peer_falls_silent(pair):
    # The cases share one watch of several timeouts, each on its own pair of ports.
    cases = (
        answering,
        peer_finished,
        peer_preempted,
        before_the_first_step,
        after_training,
        stopping_itself,
    )
    watched = {case.__name__: (case, pair()) for case in cases}
    for case, tasks in watched.values():
        case(tasks)
    time.sleep(WATCH)  # Nothing may happen in this time: there is no condition to await.
    judged = {
        name: [call for beat in tasks.exits.values() for call in beat.calls]
        for name, (_, tasks) in watched.items()
    }
    assert judged == {name: [] for name in watched}


def test_another_job_on_the_same_ports_is_ignored_and_warned_about(pair, caplog):
    tasks = pair(worker_job="another job")
    chief = tasks.beats["chief-0"]
    expected = (
        f"peer worker-0 ({tasks.addresses['worker-0']}) has not answered the heartbeat since "
        "training began"
    )
    with caplog.at_level(logging.WARNING):
        chief.training()
        wait_until(lambda: any(expected in r.getMessage() for r in caplog.records))
    assert chief.phase_of("worker-0") is None
    assert not tasks.exits["chief-0"].calls


def test_datagrams_of_the_wrong_format_or_an_unknown_sender_are_ignored(pair):
    tasks = pair()
    chief = tasks.beats["chief-0"]
    tasks.beats["worker-0"].stop()  # No real peer: only the datagrams below reach the chief.
    target = ("127.0.0.1", tasks.ports["chief-0"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for data in (
            b"hello",
            heartbeat.MAGIC + b"{not json",
            heartbeat.MAGIC + b'{"job": "job", "from": "worker-0", "kind": "ping"}',
            heartbeat.encode("job", "worker-7", "ping", TRAINING, 3),
            heartbeat.encode("job", "chief-0", "ping", TRAINING, 3),
        ):
            sender.sendto(data, target)
        # A well-formed datagram sent last: once it is seen, the ones before were read.
        sender.sendto(heartbeat.encode("job", "worker-0", "pong", FINISHED, 5), target)
        wait_until(lambda: chief.phase_of("worker-0") == FINISHED)


def test_a_ping_is_answered_to_its_sender(pair):
    tasks = pair()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.settimeout(5)
        ping = heartbeat.encode("job", "worker-0", "ping", TRAINING, 3)
        sender.sendto(ping, ("127.0.0.1", tasks.ports["chief-0"]))
        answer = heartbeat.decode(sender.recv(4096))
    assert answer == {"job": "job", "from": "chief-0", "kind": "pong", "phase": "starting",
                      "step": 212}  # fmt: skip


def test_a_task_that_did_not_run_for_a_while_does_not_blame_its_peers(pair):
    """Its own freeze (or starvation) looks like everyone's silence: it restarts the counts."""
    tasks = pair()
    offset = [0.0]
    chief = Heartbeat(
        "chief-0",
        portpicker.pick_unused_port(),
        {"worker-0": tasks.addresses["worker-0"]},
        "job",
        TIMEOUT,
        exit_fn=tasks.exits["chief-0"],
        clock=lambda: time.monotonic() + offset[0],
    )
    # The worker's heartbeat answers pings from any port of the job.
    assert chief.start()
    try:
        chief.training()
        wait_until(lambda: chief.phase_of("worker-0") is not None)
        tasks.freeze("worker-0")
        offset[0] = 100.0  # The clock jumps past the timeout between two turns of the thread.
        time.sleep(3 * chief._interval)
        assert not tasks.exits["chief-0"].calls, tasks.exits["chief-0"].calls
        # It then judges the silence it sees itself.
        assert tasks.exits["chief-0"].called.wait(10)
    finally:
        chief.stop()


def test_a_port_that_cannot_be_bound_leaves_the_task_without_a_heartbeat(caplog):
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as holder:
        holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        holder.bind(("", 0))
        port = holder.getsockname()[1]
        beat = Heartbeat("worker-0", port, {"chief-0": "127.0.0.1:1"}, "job", TIMEOUT)
        with caplog.at_level(logging.WARNING):
            assert beat.start() is False
    assert not beat.running
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert message.startswith(
        f"estimator_dist: task worker-0 runs without a heartbeat: UDP port {port} (its gRPC "
        "port's number) cannot be bound (Address already in use)."
    ), message


def test_the_hook_says_when_training_runs_its_step_and_when_it_ended():
    beat = Heartbeat("chief-0", 1, {}, "job", TIMEOUT)
    hook = beat.hook()
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        hook.begin()
    hook.after_create_session(None, None)
    assert beat.phase() == "starting"
    assert hook.before_run(None) is not None  # Due at first: the step is fetched.
    hook.after_run(None, SimpleNamespace(results=7))
    assert (beat.phase(), beat.step) == (TRAINING, 7)
    assert hook.before_run(None) is None  # Not again before the next round of pings.
    hook.after_run(None, SimpleNamespace(results=None))
    assert beat.step == 8  # A run since the fetch: a global step more.
    beat.due = True  # As the next round of pings sets it.
    hook.before_run(None)
    hook.after_run(None, SimpleNamespace(results=9))
    hook.after_run(None, SimpleNamespace(results=None))
    assert beat.step == 10
    hook.end(None)
    assert beat.phase() == FINISHED


CLUSTER = {"chief": ["h0:2000"], "worker": ["h1:2001", "h2:2002"]}


class FakePreemption:
    requested = False
    stop_at = None


@pytest.mark.parametrize(
    "jobs, task_type, timeout",
    [
        (CLUSTER, "evaluator", 15.0),
        ({**CLUSTER, "ps": ["h3:2003"]}, "worker", 15.0),
        (CLUSTER, "worker", 0.0),
    ],
    ids=["evaluator", "parameter servers", "turned off"],
)
def test_no_heartbeat_where_it_takes_no_part(jobs, task_type, timeout):
    cluster = ClusterConfig(jobs, task_type, 0)
    assert heartbeat.start_heartbeat(cluster, "/m", "a", timeout, FakePreemption()) is None


def test_a_task_pings_every_other_training_task_on_its_grpc_port_number():
    cluster = ClusterConfig(CLUSTER, "worker", 1)
    assert heartbeat.training_peers(cluster) == {"chief-0": "h0:2000", "worker-0": "h1:2001"}


def test_the_job_id_changes_with_the_attempt_the_cluster_and_the_model_dir():
    cluster = ClusterConfig(CLUSTER, "worker", 1)
    other = ClusterConfig({**CLUSTER, "chief": ["h0:3000"]}, "worker", 1)
    ids = {
        heartbeat.job_id(cluster, "/m", "a"),
        heartbeat.job_id(cluster, "/m", "b"),
        heartbeat.job_id(cluster, "/n", "a"),
        heartbeat.job_id(other, "/m", "a"),
    }
    assert len(ids) == 4
    assert heartbeat.job_id(ClusterConfig(CLUSTER, "chief", 0), "/m", "a") in ids


def test_a_later_training_call_goes_on_with_the_running_heartbeat():
    running = Heartbeat("worker-1", 1, {}, "job", TIMEOUT)
    running.training()
    running.finished()
    cluster = ClusterConfig(CLUSTER, "worker", 1)
    again = heartbeat.start_heartbeat(cluster, "/m", "a", 15.0, FakePreemption(), running)
    assert again is running
    assert running.phase() == "starting"  # Judging waits for this run's first step.


def test_the_step_between_fetches_follows_the_global_steps_a_run_adds():
    beat = Heartbeat("chief-0", 1, {}, "job", TIMEOUT)
    assert beat.step is None
    # Gradient accumulation over 2 runs: 4 runs from one fetch to the next add 2 global steps.
    for step in (0, None, None, None, 2, None, None):
        if step is not None:
            beat.due = True
        beat.progress(step)
    assert beat.step == 3
