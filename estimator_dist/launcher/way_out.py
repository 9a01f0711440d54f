"""A way out of the private network namespace that opens no port: a proxy in the host's network.

A job whose data or model_dir is remote (`s3://`, `gs://`, `https://`) must
reach the network, but the launcher's private namespace (`netns`) has only
loopback, and leaving it (`--nonetwork_isolation`) would open TensorFlow's
unauthenticated ports to the host's network. This machine has neither
iptables nor nft to NAT a veth pair, and an unprivileged user namespace
could not set them up anyway; so the way out is a relay process:

1. Before the launcher leaves the host's namespace it forks the relay, which
   stays there; the two keep a socket pair.
2. In the private namespace, the launcher opens a listening socket on its
   loopback and hands the socket itself to the relay over the pair
   (`SCM_RIGHTS`); a socket belongs to the namespace it was made in.
3. The relay accepts on that socket, so only processes inside the namespace
   can connect to it, and opens each onward connection in the host's
   namespace: an HTTP proxy (`CONNECT host:port` for HTTPS, absolute URLs for
   plain HTTP).
4. The launcher and its tasks get `HTTPS_PROXY`/`HTTP_PROXY` naming it, and
   `NO_PROXY` keeping loopback (the tasks' gRPC) direct. botocore, s3fs,
   TensorFlow's GCS client (curl), gRPC and `requests` all honour them.

Nothing listens in the host's namespace; the relay ends with the launcher
(the parent death signal, and the pair closing).
"""

from __future__ import annotations

import array
import ctypes
import os
import signal
import socket
import threading
from typing import Optional, Tuple
from urllib.parse import urlsplit

#: The variables that send a task's HTTP(S) connections through the relay.
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
#: Hosts the tasks reach directly (their cluster, on the namespace's loopback).
DIRECT = ("localhost", "127.0.0.1", "::1")
#: Added to the launcher's network line when the relay is on.
OPEN_LINE = "; remote storage and data reached through a relay in the host's network ({proxy})"
_PR_SET_PDEATHSIG = 1
#: The relays of this process: the relay lives as long as its end of the pair stays open.
_OPEN = []
_HEAD_LIMIT = 65536


class Relay:
    """The relay process, forked in the host's namespace before the launcher leaves it."""

    def __init__(self) -> None:
        self._ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:  # The relay: never returns.
            self._ours.close()
            _relay_main(theirs)
        theirs.close()

    def open(self) -> str:
        """Listens on this namespace's loopback, hands the socket to the relay; the proxy URL."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        fds = array.array("i", [listener.fileno()])
        self._ours.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        listener.close()
        _OPEN.append(self)
        return f"http://127.0.0.1:{port}"

    def close(self) -> None:
        """Ends the relay (it was not needed: the namespace could not be entered)."""
        self._ours.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def route_through(proxy: str, environ: Optional[dict] = None) -> None:
    """Sends this process's and its children's HTTP(S) connections through `proxy`.

    >>> env = {}
    >>> route_through("http://127.0.0.1:9", env)
    >>> env["HTTPS_PROXY"], env["NO_PROXY"]
    ('http://127.0.0.1:9', 'localhost,127.0.0.1,::1')
    """
    environ = os.environ if environ is None else environ
    for name in PROXY_VARIABLES:
        environ[name] = proxy
    given = [h for n in ("NO_PROXY", "no_proxy") for h in environ.get(n, "").split(",") if h]
    kept = [h for h in dict.fromkeys(given) if h not in DIRECT]
    for name in ("NO_PROXY", "no_proxy"):
        environ[name] = ",".join([*DIRECT, *kept])


def _relay_main(pair: socket.socket) -> None:
    """The relay process: receive the listening socket, serve until the launcher is gone."""
    code = 0
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _, fds, _, _ = pair.recvmsg(1, socket.CMSG_SPACE(array.array("i", [0]).itemsize))
        if not fds:
            os._exit(0)
        received = array.array("i")
        received.frombytes(fds[0][2])
        listener = socket.socket(fileno=received[0])
        threading.Thread(target=_serve, args=(listener,), daemon=True).start()
        pair.recv(1)  # Returns when the launcher closes its end or exits.
    except BaseException:  # The relay must never run the launcher's code after the fork.
        code = 1
    os._exit(code)


def _serve(listener: socket.socket) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # Closed: the relay is ending.
            return
        threading.Thread(target=_proxy, args=(client,), daemon=True).start()


def _proxy(client: socket.socket) -> None:
    """One proxied connection: CONNECT tunnels, or one plain HTTP request."""
    upstream = None
    try:
        head, rest = _read_head(client)
        method, target, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
        if method == b"CONNECT":
            host, port = _host_port(target.decode(), 443)
            upstream = socket.create_connection((host, port), timeout=30)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = urlsplit(target.decode())
            host, port = url.hostname or "", url.port or 80
            upstream = socket.create_connection((host, port), timeout=30)
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            rest = _origin_form(head, method, path.encode()) + rest
        upstream.settimeout(None)
        if rest:
            upstream.sendall(rest)
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
    except (OSError, ValueError) as error:
        try:
            client.sendall(
                b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n" + str(error).encode()
            )
        except OSError:
            pass
    finally:
        client.close()
        if upstream is not None:
            upstream.close()


def _read_head(client: socket.socket) -> Tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(4096)
        if not chunk or len(data) > _HEAD_LIMIT:
            raise ValueError("no request head")
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def _host_port(target: str, default: int) -> Tuple[str, int]:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return target.strip("[]"), default
    return host.strip("[]"), int(port)


def _origin_form(head: bytes, method: bytes, path: bytes) -> bytes:
    """The request head for the origin server: its path, one request per connection."""
    lines = head[:-4].split(b"\r\n")
    version = lines[0].rsplit(b" ", 1)[-1]
    kept = [
        line
        for line in lines[1:]
        if line.split(b":", 1)[0].strip().lower()
        not in (b"connection", b"proxy-connection", b"proxy-authorization", b"keep-alive")
    ]
    return (
        b"\r\n".join([method + b" " + path + b" " + version, *kept, b"Connection: close"])
        + b"\r\n\r\n"
    )


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass
