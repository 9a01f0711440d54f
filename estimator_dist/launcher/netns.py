"""Move this process into a private network namespace, where nobody else can connect.

TensorFlow's gRPC server listens on every interface, with no
authentication, whatever host TF_CONFIG names. A local cluster needs only
loopback, so the launcher can give itself and its tasks a network namespace
of their own: the tasks talk over its loopback, and no port is reachable
from the host or beyond. It needs root, or unprivileged user namespaces.

Call `enter_private_network()` before the process starts any thread: the
kernel refuses user namespaces to multi-threaded processes.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
from typing import Optional

from estimator_dist.launcher import way_out

#: First line of a launcher whose cluster runs in a private network namespace.
ISOLATED_MESSAGE = (
    "network: private network namespace; the job's ports cannot be reached from "
    "outside this launcher"
)
#: First line of a launcher whose cluster runs in the host's network.
EXPOSED_MESSAGE = (
    "WARNING: network: the host's network ({reason}); TensorFlow's gRPC servers "
    "listen on all interfaces without authentication while the job runs"
)

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def _write(path: str, text: str) -> None:
    with open(path, "w") as stream:
        stream.write(text)


def _bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def enter_private_network() -> Optional[str]:
    """Moves this process into a new network namespace with loopback up.

    Returns:
      None on success; otherwise why it was not possible (the process then
      stays in the host's namespace).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    if libc.unshare(flags) != 0:
        return f"unshare failed: {os.strerror(ctypes.get_errno())}"
    try:
        if uid != 0:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _bring_loopback_up()
    except OSError as error:
        return f"could not set up the namespace: {error}"
    return None


def isolate(host: str, wanted: bool, reach_out: bool = False) -> str:
    """Enters a private network namespace when wanted and the cluster is local.

    Args:
      host: The address the tasks use to reach each other (`--host`).
      wanted: Whether isolation is asked for (`--network_isolation`).
      reach_out: Whether the job reaches remote storage or data: the
        namespace then gets a way out that opens no port (`way_out.Relay`).

    Returns:
      The launcher's first line: where the cluster's ports can be reached from.
    """
    loopback = host in ("localhost", "127.0.0.1", "::1")
    if not (wanted and loopback):
        reason = "--nonetwork_isolation" if loopback else f"--host={host} is not loopback"
        return EXPOSED_MESSAGE.format(reason=reason)
    relay = way_out.Relay() if reach_out else None  # Forked while still in the host's network.
    reason = enter_private_network()
    if reason is not None:
        if relay is not None:
            relay.close()
        return EXPOSED_MESSAGE.format(reason=reason)
    if relay is None:
        return ISOLATED_MESSAGE
    proxy = relay.open()
    way_out.route_through(proxy)
    return ISOLATED_MESSAGE + way_out.OPEN_LINE.format(proxy=proxy)
