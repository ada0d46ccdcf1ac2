"""Rebooting a host and waiting, bounded, until it is back with a new boot and systemd running.

The state is ``reboot_needed``: with ``test_command`` it is whether that (read-only) command
succeeds, e.g. ``test -e /run/reboot-required``; without it, a reboot task that runs is always
needed. The write notes the host's ``boot_id``, issues the reboot without waiting on the channel,
reconnects (``session.reconnect``) until the host answers with a different ``boot_id`` and
``systemctl is-system-running`` says ``running`` (or ``degraded`` when ``allow_degraded``), all
within ``reboot_timeout``. The engine's re-read after the write, given the boot the write started
from, reports the reboot done when the host runs another boot -- unless ``test_command`` still
succeeds, which fails the task, since rebooting again would not help. Every other read says a
reboot is needed, so the task reboots again the next time it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from deployer.connection import CommandFailed, CommandResult
from deployer.errors import HostUnreachable
from deployer.modules.base import (
    ArgError,
    HostSession,
    Module,
    Observation,
    Param,
    parse_kv,
    q,
    register,
)

BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Detached so the command returns before the host goes down; the short sleep lets it return.
REBOOT_COMMAND = "nohup sh -c 'sleep 2; systemctl reboot' >/dev/null 2>&1 </dev/null &"
_PROBE = f"cat {BOOT_ID}; systemctl is-system-running 2>/dev/null || true"


@register
class Reboot(Module):
    """Reboot the host (optionally only when ``test_command`` succeeds) and wait for it."""

    name = "reboot"
    params = {
        "reboot_timeout": Param(int, default=600),
        "test_command": Param(str),
        "allow_degraded": Param(bool, default=False),
    }
    # Injectable for tests.
    clock: ClassVar[Callable[[], float]] = staticmethod(time.monotonic)
    sleep: ClassVar[Callable[[float], None]] = staticmethod(time.sleep)
    poll_s: ClassVar[float] = 2.0

    def check(self, args: dict[str, Any]) -> None:
        if not 10 <= args["reboot_timeout"] <= 3600:
            raise ArgError("reboot_timeout", "must be between 10 and 3600 seconds")

    def read_script(self, args: dict[str, Any]) -> str:
        lines = [f"printf 'boot_id=%s\\n' \"$(cat {BOOT_ID})\""]
        if args.get("test_command") is not None:
            lines.append(
                f"if ( sh -c {q(args['test_command'])} ) >/dev/null 2>&1 </dev/null; "
                "then echo test=1; else echo test=0; fi"
            )
        return "\n".join(lines)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        kv = parse_kv(result.stdout)
        boot_id = kv.get("boot_id", "")
        if not boot_id:
            raise ValueError(f"cannot read {BOOT_ID}")
        needed = kv.get("test") == "1" if args.get("test_command") is not None else True
        return {"reboot_needed": needed, "boot_id": boot_id}

    def observe(
        self,
        args: dict[str, Any],
        result: CommandResult,
        *,
        before: Observation | None = None,
        baseline: str | None = None,
    ) -> Observation:
        actual = self.parse(args, result)
        if before is not None and args.get("test_command") is None:
            # The read after this task's own reboot: a new boot is the proof.
            actual["reboot_needed"] = actual["boot_id"] == before.actual.get("boot_id")
        return Observation(actual=actual, differences=self.compare(args, actual))

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"reboot_needed": False}

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        old = obs.actual["boot_id"]
        timeout = args["reboot_timeout"]
        deadline = self.clock() + timeout
        try:
            result = session.run(REBOOT_COMMAND, timeout=30)
        except HostUnreachable:
            result = None  # the host went down before the command returned: fine
        if result is not None and result.rc != 0:
            raise CommandFailed(result)
        last = "no answer"
        need_connect = True
        while self.clock() < deadline:
            self.sleep(self.poll_s)
            try:
                if need_connect:
                    session.reconnect(max(1.0, deadline - self.clock()))
                    need_connect = False
                answer = session.run(_PROBE, timeout=30)
            except HostUnreachable as exc:
                last, need_connect = str(exc), True
                continue
            lines = answer.stdout.split()
            boot_id = lines[0] if lines else ""
            state = lines[1] if len(lines) > 1 else "unknown"
            if not boot_id or boot_id == old:
                # Still the old boot (going down): reconnect once it is gone.
                last, need_connect = "still running the old boot", True
                continue
            if state == "running" or (state == "degraded" and args["allow_degraded"]):
                return
            last = f"new boot, systemd is {state}"
            if state == "degraded":
                failed = session.run("systemctl --failed --no-legend --plain 2>/dev/null")
                units = [x.split()[0] for x in failed.stdout.splitlines() if x.split()]
                last += f" (failed units: {' '.join(units[:8]) or 'unknown'})"
        raise CommandFailed(
            CommandResult(REBOOT_COMMAND, 1, "", f"host not back within {timeout}s: {last}")
        )
