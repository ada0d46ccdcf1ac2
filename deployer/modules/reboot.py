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

from deployer.boot import BOOT_ID_PATH, POLL_S, REBOOT_COMMAND, BootWait, NotBack, reboot_and_wait
from deployer.connection import CommandFailed, CommandResult
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

# The reboot and the wait: deployer/boot.py (the rollout's reboot step uses the same).
BOOT_ID = BOOT_ID_PATH


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
    poll_s: ClassVar[float] = POLL_S

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
        how = BootWait(
            reconnect=session.reconnect,
            clock=self.clock,
            sleep=self.sleep,
            poll_s=self.poll_s,
            allow_degraded=args["allow_degraded"],
        )
        try:
            reboot_and_wait(session.run, obs.actual["boot_id"], args["reboot_timeout"], how)
        except NotBack as exc:
            raise CommandFailed(CommandResult(REBOOT_COMMAND, 1, "", str(exc))) from None
