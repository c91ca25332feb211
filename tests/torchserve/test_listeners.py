"""Shutting another process's listeners from outside it, with a real child process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from handler.torchserve.listeners import ListenerCloseError, close_listeners

# Two listeners; echoes on the connections it accepted, so an established one can be checked.
SERVER = textwrap.dedent("""
    import selectors, socket
    sel = selectors.DefaultSelector()
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    for listener in listeners:
        sel.register(listener, selectors.EVENT_READ)
    print(*(l.getsockname()[1] for l in listeners), flush=True)
    while True:
        for key, _ in sel.select(timeout=0.1):
            if key.fileobj in listeners:
                try:
                    conn, _ = key.fileobj.accept()
                except OSError:  # a listener shut from outside reports readable, then fails
                    sel.unregister(key.fileobj)
                    continue
                sel.register(conn, selectors.EVENT_READ)
            elif data := key.fileobj.recv(100):
                key.fileobj.sendall(b"echo:" + data)
            else:
                sel.unregister(key.fileobj)
""")


@pytest.fixture
def server():
    child = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        ports = [int(p) for p in child.stdout.readline().split()]
        yield child, ports
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_shut_listener_refuses_while_the_process_and_its_connections_live(server) -> None:
    child, (closed_port, kept_port) = server
    established = socket.create_connection(("127.0.0.1", closed_port), timeout=5)
    assert close_listeners(child.pid, keep_ports=[kept_port]) == [closed_port]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", closed_port), timeout=5)
    socket.create_connection(("127.0.0.1", kept_port), timeout=5).close()
    established.sendall(b"hi")
    assert established.recv(100) == b"echo:hi"
    assert child.poll() is None


def test_listeners_are_found_below_the_root_it_is_given() -> None:
    # As `torchserve --foreground` (a Python wrapper) is the parent of the JVM that listens.
    wrapper = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; "
                                f"subprocess.run([sys.executable, '-c', {SERVER!r}])"],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ports = [int(p) for p in wrapper.stdout.readline().split()]
        assert close_listeners(wrapper.pid) == sorted(ports)
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait(timeout=10)


def test_a_missing_process_is_a_clear_error() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with pytest.raises(ListenerCloseError, match="no process"):
        close_listeners(int(done.stdout))
