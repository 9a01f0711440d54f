"""The Ray actor's stream: a task's output lines and its status lines, tagged, then its exit."""

import os
import subprocess
import sys
import threading

import pytest

from estimator_dist.launcher.ray.actor import OUTPUT, STATUS, TaskHost
from estimator_dist.report import status

TASK = """
from estimator_dist.report import status
print("global step 999", flush=True)
status.emit(status.FirstStep(step=3))
print("done", flush=True)
status.emit(status.Exiting(exit_code=7, cause="why"))
raise SystemExit(7)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_the_stream_tags_output_and_status_lines_and_ends_with_the_exit_code():
    host = TaskHost.__new__(TaskHost)  # The stream only: no Ray node, no held port.
    read_fd, write_fd = os.pipe()
    try:
        host._process = subprocess.Popen(
            [sys.executable, "-c", TASK],
            env={**os.environ, status.STATUS_FD_ENV: str(write_fd)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(write_fd,),
        )
    finally:
        os.close(write_fd)
    host._status = open(read_fd)
    items = list(host.output())
    assert items[-1] == 7
    tagged = [pair for batch in items[:-1] for pair in batch]
    assert [line for tag, line in tagged if tag == OUTPUT] == ["global step 999\n", "done\n"]
    events = status.EventReader().read(line for tag, line in tagged if tag == STATUS)
    assert list(events) == [status.FirstStep(step=3), status.Exiting(exit_code=7, cause="why")]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_stream_ends_with_the_exit_once_the_status_channel_drained_for_a_bounded_time(
    monkeypatch,
):
    from estimator_dist.launcher.ray import actor

    monkeypatch.setattr(actor, "STATUS_DRAIN_SECS", 0.5)
    host = TaskHost.__new__(TaskHost)
    read_fd, held_fd = os.pipe()  # The test holds a write end, as a task's child might.
    host._process = subprocess.Popen(
        [sys.executable, "-c", TASK],
        env={**os.environ, status.STATUS_FD_ENV: str(held_fd)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        pass_fds=(held_fd,),
    )
    host._status = open(read_fd)
    items = []
    streamed = threading.Thread(target=lambda: items.extend(host.output()), daemon=True)
    streamed.start()
    try:
        streamed.join(timeout=60)
        assert not streamed.is_alive(), "the stream waited for a status channel still open"
        assert items[-1] == 7
        tagged = [pair for batch in items[:-1] for pair in batch]
        events = status.EventReader().read(line for tag, line in tagged if tag == STATUS)
        assert list(events) == [status.FirstStep(step=3), status.Exiting(exit_code=7, cause="why")]
    finally:
        os.close(held_fd)
        host._process.stdout.close()
