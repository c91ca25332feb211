"""Container entrypoint: TorchServe as a child, the sidecar in front, signals into the drain.

    python -m handler.sidecar.app.entrypoint [sidecar flags] -- torchserve --start --foreground ...

The stock TorchServe entrypoint is a bash script without a trap: SIGTERM never reaches the
JVM and the pod is SIGKILLed at the end of its grace period. Here PID 1 is this process; the
child runs in its own session (so a terminal's Ctrl-C or a stray group signal cannot reach it
first), and SIGTERM/SIGINT become a termination notice that runs the normal drain, whose last
step stops the child's process tree. Exit code: the drain's (0 after a clean stop), or the
child's own when TorchServe exits without a notice.

With --restore-at-start the compile cache is restored here while TorchServe starts, not in a
step before it: the download overlaps the JVM's and the worker's start (seconds), and the
worker's artifact lookup waits for it under the cache dir's install lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from handler.engine import platform
from handler.sidecar.app import cache_sync
from handler.sidecar.app.cli import setup_logging
from handler.sidecar.app.sidecar import Hooks, Sidecar
from handler.sidecar.app.signing_keys import load_signing
from handler.sidecar.config import SidecarConfig, add_config_arguments, config_from_args
from handler.sidecar.errors import ConfigError
from handler.torchserve.stop import terminate_tree
from handler.worker_log import MODEL_LOG

log = logging.getLogger("handler.sidecar.app.entrypoint")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging()
    try:
        config, command = parse(argv)
    except ConfigError as err:
        log.error("configuration error: %s", err)
        return 2
    child = Child(command)
    # The sidecar (and its signal handlers) come up before the child, so there is no moment
    # where a SIGTERM would kill this process and orphan TorchServe.
    with Sidecar(config, Hooks(stop_torchserve=child.stop, torchserve_pid=child.pid)) as sidecar:
        try:
            if config.restore_at_start:
                start_restore(config, on_done=sidecar.export_restore)
        except ConfigError as err:  # an unusable store URI or key file, as `restore` reports it
            log.error("configuration error: %s", err)
            return 2
        try:
            child.start()
        except OSError as err:
            log.error("cannot start %s: %s", command[0], err)
            return 127
        report = sidecar.run(until=child.exited)
    if report is not None:
        return report.exit_code
    log.error("TorchServe exited on its own with %s; no drain ran", child.returncode)
    return _exit_code(child.returncode)


def start_restore(config: SidecarConfig, on_done: Callable[[], None]) -> Future[str]:
    """Returns holding the cache dir's install lock, so the worker TorchServe starts next waits
    for the download at its artifact lookup: the JVM and worker start overlap the restore.
    on_done() runs when the restore has ended and written its record."""
    assert config.cache_store and config.cache_dir and config.cache_key_path, "checked by the config"
    restoring = cache_sync.start_restore(config.cache_store, config.cache_key_path, Path(config.cache_dir),
                                          config.aws_endpoint_url, config.aws_region, load_signing(config))

    def done(outcome: Future[str]) -> None:
        if outcome.exception() is not None:
            log.error("cache restore failed: %s; TorchServe will compile cold", outcome.exception())
        else:
            log.info("cache restore: %s", outcome.result())
            on_done()

    restoring.add_done_callback(done)
    return restoring


class Child:
    """The serving process: started in its own session, reaped by exactly one thread."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.exited = threading.Event()
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def returncode(self) -> int | None:
        return None if self._popen is None else self._popen.returncode

    def start(self) -> None:
        self._popen = subprocess.Popen(self.command, start_new_session=True, env=platform.child_environment())
        threading.Thread(target=self._wait, name="child-wait", daemon=True).start()
        if os.getpid() == 1:
            threading.Thread(target=_reap_orphans, args=(self._popen.pid,), name="reaper",
                             daemon=True).start()

    def pid(self) -> int:
        if self._popen is None:
            raise ProcessLookupError("TorchServe was not started")
        return self._popen.pid

    def stop(self, timeout_s: float) -> None:
        """The drain's last step: SIGTERM the tree, SIGKILL whatever outlives timeout_s."""
        if self._popen is not None:
            terminate_tree(self._popen.pid, timeout_s, wait_root=self.exited.wait)

    def _wait(self) -> None:
        assert self._popen is not None, "wait before start"
        self._popen.wait()  # the only reaper of the child: its exit status must not be stolen
        self.exited.set()


def parse(argv: list[str]) -> tuple[SidecarConfig, list[str]]:
    if "--" not in argv:
        raise ConfigError("usage: entrypoint [sidecar flags] -- torchserve --start ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m handler.sidecar.app.entrypoint")
    add_config_arguments(parser)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise ConfigError("no command after '--'")
    config = config_from_args(args)
    if not _is_torchserve_start(command):
        return config, command
    if config.key_file is None and "--disable-token-auth" not in command:
        # TorchServe writes key_file.json into its working directory, which is ours. If auth
        # is off some other way, the file never appears and requests go without a token.
        config = dataclasses.replace(config, key_file="key_file.json")
    if config.model_log is None:
        # TorchServe logs under LOG_LOCATION, else logs/ in its working directory (ours).
        config = dataclasses.replace(config, model_log=str(Path(os.environ.get("LOG_LOCATION", "logs")) / MODEL_LOG.name))
    if "--foreground" not in command:
        # Without it `torchserve --start` returns at once and leaves the JVM orphaned,
        # which would look like TorchServe exiting.
        command = [*command, "--foreground"]
    return config, command


def _is_torchserve_start(command: list[str]) -> bool:
    return os.path.basename(command[0]) == "torchserve" and "--start" in command


def _reap_orphans(child_pid: int) -> None:
    """As PID 1 we inherit every orphan (TorchServe's workers, once the JVM is gone) and
    must reap them, or they stay zombies. WNOWAIT peeks first so the direct child's
    status is left to Popen.wait."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None or info.si_pid == child_pid:
            time.sleep(1.0)
            continue
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            continue  # reaped elsewhere in the meantime


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N -> 128+N


if __name__ == "__main__":
    sys.exit(main())
