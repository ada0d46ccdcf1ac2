"""One host as a sequence of steps uses it (the rollout's steps and its validation): commands
over the host's kept connection, reconnecting once when it was lost; an interruptible wait; the
clock; and a reboot that waits for the new boot (deployer/boot.py).

Steps never hold a connection themselves: they ask for it each time (``connection``), so a
reboot or a converge that replaced it is seen by the next command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from deployer import boot
from deployer.connection import CommandResult, Connection, ConnectionPool
from deployer.errors import HostUnreachable
from deployer.spans import span

RECONNECT_EVERY_S = 2.0


class Interrupted(Exception):
    """The controller was asked to stop (Ctrl-C) while waiting: leave the host as it is."""


def pause(stop: threading.Event, seconds: float, sleep: Callable[[float], None] | None) -> None:
    """Wait ``seconds`` (with ``sleep`` when given, else on ``stop``); Interrupted when ``stop``
    is set meanwhile."""
    with span("wait"):
        if sleep is not None:
            sleep(seconds)
            stopped = stop.is_set()
        else:
            stopped = stop.wait(seconds)
    if stopped:
        raise Interrupted()


@dataclass
class HostAccess:
    host: str
    pool: ConnectionPool
    stop: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.monotonic
    # How to wait (tests advance a fake clock); by default on ``stop``, so Ctrl-C ends a wait.
    sleep: Callable[[float], None] | None = None

    def connection(self) -> Connection:
        return self.pool.get(self.host)

    def drop(self) -> None:
        self.pool.drop(self.host)

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """``command`` on the host; a connection found lost is opened again once."""
        try:
            return self.connection().run(command, stdin=stdin, timeout=timeout)
        except HostUnreachable:
            self.drop()
            return self.connection().run(command, stdin=stdin, timeout=timeout)

    def wait(self, seconds: float) -> None:
        """Wait ``seconds``; Interrupted when the run is asked to stop meanwhile."""
        pause(self.stop, seconds, self.sleep)

    def reconnect(self, deadline_s: float) -> None:
        """Drop the connection and connect again, trying until ``deadline_s`` seconds pass."""
        self.drop()
        end = self.clock() + deadline_s
        while True:
            try:
                self.connection()
                return
            except HostUnreachable:
                if self.clock() + RECONNECT_EVERY_S >= end:
                    raise
                self.wait(RECONNECT_EVERY_S)

    def boot_id(self) -> str:
        return self.run(boot.READ_BOOT_ID, timeout=30).stdout.strip()

    def reboot(self, old_boot: str, timeout_s: float) -> None:
        """Reboot and wait for a new boot with systemd running or degraded (a GPU host with a
        failed unit is judged by the steps after); ``boot.NotBack`` after ``timeout_s``."""

        def run(command: str, *, timeout: float | None = None) -> CommandResult:
            return self.connection().run(command, timeout=timeout)

        how = boot.BootWait(
            reconnect=self.reconnect, clock=self.clock, sleep=self.wait, allow_degraded=True
        )
        with span("reboot", self.host):
            boot.reboot_and_wait(run, old_boot, timeout_s, how)
