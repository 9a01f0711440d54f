"""A real S3-protocol server for the tests: moto's standalone server, on loopback.

`S3Server` starts `python -m moto.server` on a free loopback port with
request authentication on (`INITIAL_NO_AUTH_ACTION_COUNT`: the first few
requests create a user, its access key and policy, and the bucket; every
later one must be signed with that key), and gives the environment a task
needs to reach it through AWS's standard variables, `AWS_ENDPOINT_URL`
included. `paused()` stops the server's process (SIGSTOP) for a while and
lets it go on: a storage that answers nothing, then comes back with every
object it held.

  with S3Server() as server:
      run_module("estimator_dist.train", ["--model_dir=s3://bucket/run1"], 120, env=server.env)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, Iterator, Optional, Tuple

import portpicker

#: The first two octets of the addresses `remote_network` gives a server and the host.
_SUBNET = "10.235"

#: The bucket every server has.
BUCKET = "bucket"
#: Requests the server serves unsigned: the user, its key, its policy, the bucket.
_SETUP_REQUESTS = 4
_POLICY = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}'


class S3Server:
    """moto's S3 server on `127.0.0.1`, with a bucket and one user allowed to use it.

    Args:
      host: The address it listens on (a test's network namespace may give another).
      prefix: A command to run the server under, such as `ip netns exec NAME`.
    """

    def __init__(self, host: str = "127.0.0.1", prefix: tuple = ()) -> None:
        self.host = host
        self.port = portpicker.pick_unused_port()
        self._prefix = prefix
        self._process: Optional[subprocess.Popen] = None
        self.url = f"http://{host}:{self.port}"
        self.env: Dict[str, str] = {}

    def __enter__(self) -> S3Server:
        self.start()
        import boto3

        plain = {"endpoint_url": self.url, "region_name": "us-east-1"}
        dummy = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", **plain, **dummy)
        iam.create_user(UserName="tests")
        key = iam.create_access_key(UserName="tests")["AccessKey"]
        iam.put_user_policy(UserName="tests", PolicyName="s3", PolicyDocument=_POLICY)
        boto3.client("s3", **plain, **dummy).create_bucket(Bucket=BUCKET)
        self.env = {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": "us-east-1",
            # A developer's own AWS files never reach the tests.
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The server's process stopped (SIGSTOP) inside the block, running again after it."""
        assert self._process is not None, "the server is not running"
        os.killpg(self._process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self._process.pid, signal.SIGCONT)

    def start(self) -> None:
        """Starts the server and waits until it answers."""
        environ = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_SETUP_REQUESTS))
        self._process = subprocess.Popen(
            [
                *self._prefix,
                sys.executable,
                "-m",
                "moto.server",
                "-H",
                self.host,
                "-p",
                str(self.port),
            ],
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((self.host, self.port), 0.5).close()
                return
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on {self.url}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stops the server; its objects are gone with it."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._process = None


@contextlib.contextmanager
def remote_network() -> Iterator[Tuple[str, tuple]]:
    """A network namespace of this test's own, reached from the host over a veth pair.

    A server started there (`S3Server(host, prefix)`) is remote for a job: not
    on its loopback, reachable only through the host's network. Needs root.

    Yields:
      The address a server there listens on, and the command prefix that
      runs a program inside the namespace.
    """
    name = f"ed35s3-{os.getpid()}"
    octet = os.getpid() % 250 + 1
    host_end, far_end = f"es{os.getpid()}"[:15], f"er{os.getpid()}"[:15]
    commands = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end],
        ["ip", "link", "set", far_end, "netns", name],
        ["ip", "addr", "add", f"{_SUBNET}.{octet}.1/30", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        ["ip", "-n", name, "addr", "add", f"{_SUBNET}.{octet}.2/30", "dev", far_end],
        ["ip", "-n", name, "link", "set", far_end, "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=30)
        yield f"{_SUBNET}.{octet}.2", ("ip", "netns", "exec", name)
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
