"""``assert``: a read-only check that must pass; it reads and never reports a change.

``that`` is a shell command that changes nothing and exits 0 when the host is as it should be
(a role's verification: the driver loaded == installed == nvidia-smi, DCGM sees every GPU).
When it does not pass, the task fails with what ``explain`` prints (another read-only command,
e.g. the reasons and the way out), or else with the check's own output. There is no write side:
the engine judges the task by its read (``judged_by_read``), in check mode too -- unless an
earlier task of the run would have changed the host, where check mode can only predict.
"""

from __future__ import annotations

from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import (
    HostSession,
    Observation,
    Param,
    ReadOnlyCheck,
    parse_kv,
    register,
)
from deployer.modules.command import Command

FAILURE_LINES = 20


@register
class Assert(ReadOnlyCheck):
    """A read-only check; the task fails, saying why, when it does not pass."""

    name = "assert"
    params = {
        "that": Param(str, required=True),
        "explain": Param(str),
        "environment": Param(dict),
    }

    def check(self, args: dict[str, Any]) -> None:
        # the same environment rules as a command's
        Command().check({"cmd": "true", "changed_when": False, "timeout": 1, **_env(args)})

    def _shell(self, args: dict[str, Any], command: str) -> str:
        return Command().shell(_env(args), command)

    def read_script(self, args: dict[str, Any]) -> str:
        return (
            f"if ( {self._shell(args, args['that'])} ) >/dev/null 2>&1 </dev/null; "
            "then echo passes=1; else echo passes=0; fi"
        )

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return {"passes": parse_kv(result.stdout).get("passes") == "1"}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"passes": True}

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        command = args.get("explain") or args["that"]
        result = session.run(f"{self._shell(args, command)} </dev/null", timeout=300)
        text = (result.stderr.strip() + "\n" + result.stdout.strip()).strip().splitlines()
        return "\n".join(text[-FAILURE_LINES:]) or f"the check failed: {args['that']}"


def _env(args: dict[str, Any]) -> dict[str, Any]:
    return {"environment": args["environment"]} if args.get("environment") else {}
