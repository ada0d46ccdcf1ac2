"""Rebooting a host and waiting, bounded, until it is back with a new boot and systemd running:
one implementation, for the ``reboot`` module and for the rollout's reboot step.

The boot is told by ``/proc/sys/kernel/random/boot_id`` (a new random id every boot). The reboot
is issued detached, so the command returns before the host goes down; then the host is polled:
a lost connection or the old boot id means "not yet" (reconnect and poll again), a new boot id
with ``systemctl is-system-running`` saying ``running`` (or ``degraded`` when allowed) means back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from deployer.connection import CommandFailed, CommandResult
from deployer.errors import HostUnreachable

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
READ_BOOT_ID = f"cat {BOOT_ID_PATH}"
# Detached so the command returns before the host goes down; the short sleep lets it return.
REBOOT_COMMAND = "nohup sh -c 'sleep 2; systemctl reboot' >/dev/null 2>&1 </dev/null &"
PROBE = f"{READ_BOOT_ID}; systemctl is-system-running 2>/dev/null || true"
POLL_S = 2.0

Run = Callable[..., CommandResult]  # run(command, timeout=...) on the current connection


class NotBack(Exception):
    """The host did not come back within the timeout; the message says what was seen last."""


@dataclass(frozen=True)
class BootWait:
    """How to wait: ``reconnect(deadline_s)`` drops the connection and connects again (raising
    HostUnreachable when it cannot), ``clock`` and ``sleep`` (an interruptible one is fine)."""

    reconnect: Callable[[float], None]
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    poll_s: float = POLL_S
    allow_degraded: bool = False


def reboot_and_wait(run: Run, old_boot: str, timeout_s: float, how: BootWait) -> None:
    """Reboot, then wait until the host runs a boot other than ``old_boot`` with systemd
    running; ``NotBack`` after ``timeout_s``. A failing reboot command raises CommandFailed."""
    deadline = how.clock() + timeout_s
    result = None
    with contextlib.suppress(HostUnreachable):  # the host went down before it returned: fine
        result = run(REBOOT_COMMAND, timeout=30)
    if result is not None and result.rc != 0:
        raise CommandFailed(result)
    last = "no answer"
    need_connect = True
    while how.clock() < deadline:
        how.sleep(how.poll_s)
        try:
            if need_connect:
                how.reconnect(max(1.0, deadline - how.clock()))
                need_connect = False
            answer = run(PROBE, timeout=30)
        except HostUnreachable as exc:
            last, need_connect = str(exc), True
            continue
        words = answer.stdout.split()
        boot_id = words[0] if words else ""
        state = words[1] if len(words) > 1 else "unknown"
        if not boot_id or boot_id == old_boot:
            # Still the old boot (going down): reconnect once it is gone.
            last, need_connect = "still running the old boot", True
            continue
        if state == "running" or (state == "degraded" and how.allow_degraded):
            return
        last = f"new boot, systemd is {state}"
        if state == "degraded":
            failed = run("systemctl --failed --no-legend --plain 2>/dev/null", timeout=30)
            units = [x.split()[0] for x in failed.stdout.splitlines() if x.split()]
            last += f" (failed units: {' '.join(units[:8]) or 'unknown'})"
    raise NotBack(f"host not back within {timeout_s:.0f}s: {last}")
