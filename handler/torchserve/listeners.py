"""Close TorchServe's listening sockets from outside the JVM, before it is stopped.

Why: the JVM's shutdown hook closes its listeners ~30 ms after SIGTERM and then closes every
open connection within ~20 ms more. A request that connected in that window was accepted and
then reset before the worker's answer (the drain's 503) came back: the client cannot tell it
never ran (measured in bench/chaos/: 2-9 such requests a run with 32 clients sending).
Closing the listeners first, while the JVM still runs, turns every later connect into
"connection refused" (provably not executed, retryable), and lets the connections already
accepted be answered before SIGTERM.

How (Linux >= 5.6): find the LISTEN sockets of the process tree in /proc, copy each into this
process with pidfd_getfd(2) (needs ptrace rights over the JVM: same user, or an ancestor, or
CAP_SYS_PTRACE) and shutdown(2) it: a listening TCP socket that is shut down stops listening
for every process holding it. The JVM keeps running and keeps serving its open connections.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Iterable
from pathlib import Path

import psutil

_SYS_PIDFD_GETFD = 438  # the same number on x86-64 and aarch64 (asm-generic)
_TCP_LISTEN = "0A"


class ListenerCloseError(OSError):
    """The listeners could not be closed (no such process, no ptrace rights, old kernel)."""


def close_listeners(root_pid: int, keep_ports: Iterable[int] = ()) -> list[int]:
    """Shut down every listening TCP socket held by `root_pid` or its descendants, except those
    on `keep_ports` (the management and metrics ports the sidecar still reads). Returns the
    ports closed, sorted."""
    if not hasattr(os, "pidfd_open") or not Path("/proc/self/net/tcp").exists():
        raise ListenerCloseError("closing another process's listeners needs Linux >= 5.6 (pidfd_getfd, /proc)")
    keep = set(keep_ports)
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess as err:
        raise ListenerCloseError(f"no process {root_pid}") from err
    listening = {inode: port for inode, port in _listening_inodes(root_pid).items() if port not in keep}
    closed: set[int] = set()
    for process in tree:
        fds = _socket_fds(process.pid, listening)
        if fds:
            _shutdown_fds(process.pid, fds)
            closed.update(listening[inode] for inode in fds.values())
    return sorted(closed)


def _listening_inodes(pid: int) -> dict[int, int]:
    """{socket inode: local port} of the LISTEN TCP sockets in `pid`'s network namespace."""
    found: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = line.split()
            if fields[3] == _TCP_LISTEN:
                found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def _socket_fds(pid: int, inodes: dict[int, int]) -> dict[int, int]:
    """{fd number: inode} of `pid`'s descriptors that are among `inodes`."""
    fds: dict[int, int] = {}
    try:
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone, or not ours to read
        return fds
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            fds[int(entry.name)] = int(target[8:-1])
    return fds


def _shutdown_fds(pid: int, fds: dict[int, int]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as err:
        raise ListenerCloseError(err.errno, f"pidfd_open({pid}): {err.strerror}") from err
    try:
        for fd in fds:
            copy = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
            if copy < 0:
                errno = ctypes.get_errno()
                raise ListenerCloseError(errno, f"pidfd_getfd({pid}, fd {fd}): {os.strerror(errno)}")
            with socket.socket(fileno=copy) as sock:
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(pidfd)
