"""A shell command, run only when its guard says so: ``creates``, ``unless`` or ``changed_when``.

A command cannot say what state it owns, so it must carry one of:

- ``creates: PATH`` -- run when PATH does not exist; after the run it must exist;
- ``unless: CHECK`` -- a read-only check command; run when CHECK fails; after the run it must pass;
- ``changed_when: true|false`` -- no guard: run every time the task runs (use it on handlers), and
  report changed (true) or ok (false).

With no guard, the desired state is ``ran: true``: false on every read but the one that verifies
this task's own run (the engine gives that read the observation the run started from), so the
task passes after its own run and acts again the next time it runs.
"""

from __future__ import annotations

import re
from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import (
    ArgError,
    HostSession,
    Module,
    Observation,
    Param,
    parse_kv,
    q,
    register,
    run_checked,
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _abs(key: str, value: str | None) -> None:
    if value is not None and (not value.startswith("/") or "\n" in value):
        raise ArgError(key, f"must be an absolute path, got {value!r}")


@register
class Command(Module):
    """A guarded shell command (creates / unless / changed_when)."""

    name = "command"
    params = {
        "cmd": Param(str, required=True),
        "creates": Param(str),
        "unless": Param(str),
        "changed_when": Param(bool),
        "chdir": Param(str),
        "environment": Param(dict),
        "timeout": Param(int, default=3600),
    }

    def check(self, args: dict[str, Any]) -> None:
        if all(args.get(k) is None for k in ("creates", "unless", "changed_when")):
            raise ArgError(
                "cmd",
                "a command must carry creates, unless or changed_when "
                "(so that a second run knows whether to run it again)",
            )
        _abs("creates", args.get("creates"))
        _abs("chdir", args.get("chdir"))
        for k, v in (args.get("environment") or {}).items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise ArgError("environment", f"not an environment variable name: {k!r}")
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise ArgError("environment", f"value of {k} must be a string or number")
        if args["timeout"] <= 0:
            raise ArgError("timeout", "must be a positive number of seconds")
        # The engine reads reports_change from the module instance.
        self.reports_change = args.get("changed_when") is not False

    def shell(self, args: dict[str, Any], command: str) -> str:
        """``command`` as run on the host: in ``chdir``, with ``environment``."""
        env = " ".join(q(f"{k}={v}") for k, v in sorted((args.get("environment") or {}).items()))
        run = f"env {env} sh -c {q(command)}" if env else f"sh -c {q(command)}"
        if args.get("chdir"):
            run = f"cd -- {q(args['chdir'])} && {run}"
        return run

    def _guarded(self, args: dict[str, Any]) -> bool:
        return args.get("creates") is not None or args.get("unless") is not None

    def state_tells_writes(self, args: dict[str, Any]) -> bool:
        return self._guarded(args)

    def read_script(self, args: dict[str, Any]) -> str:
        lines = []
        if args.get("creates") is not None:
            lines.append(
                f"if [ -e {q(args['creates'])} ]; then echo creates=1; else echo creates=0; fi"
            )
        if args.get("unless") is not None:
            check = self.shell(args, args["unless"])
            lines.append(
                f"if ( {check} ) >/dev/null 2>&1 </dev/null; then echo unless=1; "
                "else echo unless=0; fi"
            )
        if not lines:
            lines.append("echo guard=none")
        return "\n".join(lines)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        kv = parse_kv(result.stdout)
        actual: dict[str, Any] = {}
        if args.get("creates") is not None:
            actual["creates_exists"] = kv.get("creates") == "1"
        if args.get("unless") is not None:
            actual["unless_passes"] = kv.get("unless") == "1"
        if not self._guarded(args):
            actual["ran"] = False
        return actual

    def observe(
        self,
        args: dict[str, Any],
        result: CommandResult,
        *,
        before: Observation | None = None,
        baseline: str | None = None,
    ) -> Observation:
        actual = self.parse(args, result)
        if not self._guarded(args):
            actual["ran"] = before is not None  # read right after this task's own run
        return Observation(actual=actual, differences=self.compare(args, actual))

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if args.get("creates") is not None:
            out["creates_exists"] = True
        if args.get("unless") is not None:
            out["unless_passes"] = True
        if not self._guarded(args):
            out["ran"] = True
        return out

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        run_checked(session, self.shell(args, args["cmd"]), timeout=args["timeout"])
