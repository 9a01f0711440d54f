"""The status channel: events round-trip as JSON lines, malformed lines are skipped, and
`emit` neither blocks nor fails, with or without a launcher reading."""

import contextlib
import fcntl
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from estimator_dist.report import status

EVENTS = [
    status.Started(task="worker-0", pid=4242),
    status.Heartbeat(),
    status.RendezvousMet(tasks=3, secs=1.5),
    status.FirstStep(step=0),
    status.Progress(
        step=200,
        last_step=400,
        loss=0.232,
        examples_per_sec=6830.4,
        interval_steps=100,
        interval_secs=0.94,
    ),
    status.Progress(200, 400, None, None, 100, None),
    status.StopStep(step=321, how=status.INPUTS_COUNTED),
    status.Evaluated(step=400, metrics={"accuracy": 0.96, "global_step": 400}, final=True),
    status.Exiting(exit_code=152, cause="the global step stayed at 200"),
    status.Exiting(exit_code=0),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind)
def test_every_event_round_trips_as_one_versioned_json_line(event):
    line = status.encode(event)
    assert line.endswith("\n") and "\n" not in line[:-1]
    fields = json.loads(line)
    assert (fields["v"], fields["kind"]) == (status.VERSION, event.kind)
    assert status.decode(line) == event


def test_every_kind_has_a_class_of_its_own():
    assert sorted(status.KINDS) == sorted({type(e).kind for e in EVENTS})


MALFORMED = [
    "global step 999\n",
    "\n",
    "[1, 2]\n",
    '{"kind": "first_step", "step": 1}\n',  # no version
    '{"v": 2, "kind": "first_step", "step": 1}\n',  # another version
    '{"v": 1, "kind": "launched", "step": 1}\n',  # no such kind
    '{"v": 1, "kind": "first_step"}\n',  # a field missing
    '{"v": 1, "kind": "first_step", "step": "1"}\n',  # a field of the wrong type
    '{"v": 1, "kind": "first_step", "step": true}\n',  # a bool is no step
    '{"v": 1, "kind": "first_step", "step": 1, "extra": 2}\n',  # a field unknown
    '{"v": 1, "kind": "stop_step", "step": 1, "how": null}\n',
    '{"v": 1, "kind": "stop_step", "step": 1, "how": "whenever"}\n',  # no STOP_HOWS value
    '{"v": 1, "kind": "first_st',  # cut short
]


def test_the_reader_skips_and_counts_malformed_lines_and_reports_the_first_once():
    good = [status.encode(e) for e in EVENTS]
    lines = [x for pair in itertools.zip_longest(good, MALFORMED) for x in pair if x is not None]
    reported = []
    reader = status.EventReader(lambda line, why: reported.append((line, why)))
    assert list(reader.read(lines)) == EVENTS
    assert reader.malformed == len(MALFORMED)
    assert reported == [("global step 999", "not JSON: Expecting value: line 1 column 1 (char 0)")]


def run_task(code, env=None, pass_fds=()):
    """Runs `code` in a child Python with the package importable; returns its result."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **(env or {})},
        pass_fds=pass_fds,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.multiprocess
def test_a_task_sends_events_through_the_inherited_descriptor_and_hides_its_name():
    read_fd, write_fd = os.pipe()
    try:
        done = run_task(
            """
            import os
            from estimator_dist.report import status
            assert status.connect()
            assert status.STATUS_FD_ENV not in os.environ  # a child of the task gets no name
            status.emit(status.FirstStep(step=3))
            status.emit(status.Exiting(exit_code=0))
            """,
            {status.STATUS_FD_ENV: str(write_fd)},
            (write_fd,),
        )
    finally:
        os.close(write_fd)
    assert done.returncode == 0, done.stderr
    with open(read_fd) as channel:
        events = list(status.EventReader().read(channel))
    # The heartbeat thread sent one as the task connected, before or between the others.
    assert status.Heartbeat() in events
    others = [e for e in events if e != status.Heartbeat()]
    assert others == [status.FirstStep(step=3), status.Exiting(exit_code=0)]


@pytest.mark.multiprocess
def test_a_connected_task_sends_heartbeats_while_its_main_thread_is_busy_and_none_frozen():
    read_fd, write_fd = os.pipe()
    try:
        task = subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    """
                    import time
                    from estimator_dist.report import status
                    status.HEARTBEAT_SECS = 0.05
                    assert status.connect()
                    print("connected", flush=True)
                    time.sleep(60)  # The main thread never emits: only the heartbeat thread.
                    """
                ),
            ],
            env={**os.environ, status.STATUS_FD_ENV: str(write_fd)},
            pass_fds=(write_fd,),
            stdout=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_fd)
    channel = open(read_fd)
    try:
        assert task.stdout.readline() == "connected\n"
        beats = [status.decode(channel.readline()) for _ in range(5)]  # 0.25 s of heartbeats
        assert beats == [status.Heartbeat()] * 5
        task.send_signal(signal.SIGSTOP)  # Frozen: the pipe stays open, and silent.
        time.sleep(0.2)  # Heartbeats already in the pipe when it stopped.
        fcntl.fcntl(read_fd, fcntl.F_SETFL, os.O_NONBLOCK)
        with contextlib.suppress(BlockingIOError):
            os.read(read_fd, 65536)
        readable, _, _ = select.select([read_fd], [], [], 0.5)  # 10 heartbeat intervals
        assert readable == [], "a stopped task sent a heartbeat"
    finally:
        task.kill()
        task.wait()
        channel.close()


@pytest.mark.multiprocess
def test_without_a_launcher_emit_does_nothing():
    done = run_task(
        """
        from estimator_dist.report import status
        assert not status.connect()
        status.emit(status.FirstStep(step=3))
        print("ok")
        """,
        {status.STATUS_FD_ENV: ""},
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


@pytest.mark.multiprocess
def test_a_full_pipe_drops_events_instead_of_blocking():
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, 1031, 4096)  # F_SETPIPE_SZ: one page, full after a few events.
    try:
        done = run_task(
            """
            from estimator_dist.report import status
            for step in range(1000):  # Nobody reads: the pipe fills, emit must not block.
                status.emit(status.FirstStep(step=step))
            assert status._channel.dropped > 0, status._channel.dropped
            print("ok", status._channel.dropped)
            """,
            {status.STATUS_FD_ENV: str(write_fd)},
            (write_fd,),
        )
    finally:
        os.close(write_fd)
    assert done.returncode == 0, done.stderr
    with open(read_fd) as channel:
        events = list(status.EventReader().read(channel))
    # What fitted arrived whole, in order; the rest was dropped.
    assert events == [status.FirstStep(step=i) for i in range(len(events))]
    assert len(events) + int(done.stdout.split()[1]) == 1000
    # The loss is in the task's log: at the first drop, and the count at exit.
    assert done.stderr.count("the status channel dropped a first_step event") == 1, done.stderr
    assert f"dropped {done.stdout.split()[1]} event(s) in all" in done.stderr, done.stderr


@pytest.mark.multiprocess
def test_emit_after_the_launcher_is_gone_is_ignored():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # The launcher died: a write gets EPIPE.
    try:
        done = run_task(
            """
            from estimator_dist.report import status
            status.emit(status.FirstStep(step=1))
            status.emit(status.Exiting(exit_code=0))
            print("ok")
            """,
            {status.STATUS_FD_ENV: str(write_fd)},
            (write_fd,),
        )
    finally:
        os.close(write_fd)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_an_event_too_long_for_one_atomic_write_is_dropped_not_split(monkeypatch):
    read_fd, write_fd = os.pipe()
    channel = status._Channel()
    monkeypatch.setenv(status.STATUS_FD_ENV, str(write_fd))
    try:
        metrics = {f"metric_{i}": float(i) for i in range(500)}
        channel.write(status.encode(status.Evaluated(step=1, metrics=metrics)))
        channel.write(status.encode(status.FirstStep(step=1)))
    finally:
        os.close(write_fd)
    with open(read_fd) as stream:
        assert list(status.EventReader().read(stream)) == [status.FirstStep(step=1)]
    assert channel.dropped == 1


def test_a_long_cause_is_shortened_to_its_first_lines_to_fit_one_atomic_write():
    trace = "\n".join(f"  frame {i}: " + "x" * 60 for i in range(200))
    cause = "the training input raised InvalidArgumentError: bad record\n" + trace
    line = status.encode(status.Exiting(exit_code=1, cause=cause))
    assert len(line.encode("utf-8")) <= status.MAX_LINE_BYTES
    event = status.decode(line)
    assert event.exit_code == 1
    assert event.cause.startswith("the training input raised InvalidArgumentError: bad record\n")
    assert event.cause.endswith(status.ELLIPSIS) and cause.startswith(event.cause[:-1])
    assert event.cause[:-1].endswith("x" * 60)  # Whole lines only.
    assert len(event.cause) > 3000  # As much as fits.


def test_a_single_long_line_and_non_ascii_text_are_cut_to_fit():
    for text in ("y" * 10_000, "é" * 10_000, "\x00" * 10_000):
        line = status.encode(status.Exiting(exit_code=3, cause=text))
        assert len(line.encode("utf-8")) <= status.MAX_LINE_BYTES
        cause = status.decode(line).cause
        assert cause.endswith(status.ELLIPSIS) and text.startswith(cause[:-1])


def test_an_exiting_event_with_a_long_cause_arrives_instead_of_being_dropped(monkeypatch):
    read_fd, write_fd = os.pipe()
    channel = status._Channel()
    monkeypatch.setenv(status.STATUS_FD_ENV, str(write_fd))
    try:
        channel.write(status.encode(status.Exiting(exit_code=152, cause="stalled\n" + "z" * 9000)))
        channel.write(status.encode(status.StopStep(step=7, how=status.MAX_STEPS)))
    finally:
        os.close(write_fd)
    with open(read_fd) as stream:
        events = list(status.EventReader().read(stream))
    assert [type(e) for e in events] == [status.Exiting, status.StopStep]
    assert events[0].cause == "stalled" + status.ELLIPSIS
    assert channel.dropped == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_forked_child_does_not_keep_the_channel_open_after_the_task_exits():
    read_fd, write_fd = os.pipe()
    hold_read, hold_write = os.pipe()  # The child blocks reading this until the test releases it.
    task = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os
                from estimator_dist.report import status
                assert status.connect()
                status.emit(status.FirstStep(step=1))
                child = os.fork()
                if child == 0:
                    status.emit(status.FirstStep(step=99))  # The child has no channel.
                    os.read({hold_read}, 1)
                    os._exit(0)
                print(child, flush=True)
                status.emit(status.Exiting(exit_code=0))
                """
            ),
        ],
        env={**os.environ, status.STATUS_FD_ENV: str(write_fd)},
        pass_fds=(write_fd, hold_read),
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(write_fd)
    os.close(hold_read)
    events = []

    def read():
        with open(read_fd) as channel:
            events.extend(status.EventReader().read(channel))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    child = None
    try:
        child = int(task.stdout.readline())
        assert task.wait(timeout=60) == 0
        reader.join(timeout=60)
        assert not reader.is_alive(), "the channel stayed open after the task exited"
        os.kill(child, 0)  # The child still runs: only its copy of the descriptor was closed.
        others = [e for e in events if e != status.Heartbeat()]
        assert others == [status.FirstStep(step=1), status.Exiting(exit_code=0)]
    finally:
        os.close(hold_write)  # Releases the child.
        task.stdout.close()
        if task.poll() is None:
            task.kill()
