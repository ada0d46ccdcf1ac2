"""A systemd unit: its unit file and drop-ins, enabled, masked, and running state.

State is read with one ``systemctl show`` call (plus a stat and hash of each managed file). A
changed unit file or drop-in (or ``NeedDaemonReload=yes``) triggers ``daemon-reload`` before any
start or restart.

``restarted`` and ``reloaded`` are actions, not states: a task asking for them (normally a handler,
which runs only when notified) always acts. The desired state carries ``restarted: true`` (or
``reloaded: true``), which no read before this task's own write can show. The write restarts the
unit and keeps the unit's new ``InvocationID`` (a random ID systemd gives every start) as proof on
this task's module instance (one per host and task); the engine's re-read reports ``restarted``
true only when the running invocation is that one, so a restart that did not produce a new running
invocation fails the task. A reload keeps the current invocation as proof (the process must survive
its reload); a reload of a stopped unit starts it. The proof is used up by the re-read.
"""

from __future__ import annotations

import re
from typing import Any

from deployer.connection import CommandFailed, CommandResult
from deployer.modules.base import (
    ArgError,
    ContentDiff,
    HostSession,
    Module,
    Observation,
    Param,
    PrepareContext,
    parse_kv,
    q,
    register,
    run_checked,
)
from deployer.modules.files import atomic_write_script, parse_stat, stat_script
from deployer.modules.readout import as_result, sections, sha256_text

UNIT_DIR = "/etc/systemd/system"
_UNIT_SUFFIXES = (
    ".service",
    ".socket",
    ".timer",
    ".target",
    ".mount",
    ".path",
    ".slice",
    ".automount",
    ".swap",
)
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@-]+$")
_DROPIN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SHOW = "LoadState,ActiveState,SubState,UnitFileState,InvocationID,NeedDaemonReload"
# UnitFileState values for which `systemctl is-enabled` succeeds.
_ENABLED = {"enabled", "enabled-runtime", "static", "indirect", "generated", "alias"}
_ROOT_644 = {"owner": "root", "group": "root", "mode": "644"}


@register
class SystemdUnit(Module):
    """A systemd unit with optional unit file and drop-ins, enabled/masked/running state."""

    name = "systemd_unit"
    params = {
        "name": Param(str, required=True),
        "content": Param(str),
        "src": Param(str),
        "dropins": Param(dict),
        "enabled": Param(bool),
        "state": Param(str, choices=("started", "stopped", "restarted", "reloaded")),
        "masked": Param(bool),
    }

    def __init__(self) -> None:
        # InvocationID after this task's own restart/reload: the proof the re-read looks for.
        self._proof: str | None = None

    def check(self, args: dict[str, Any]) -> None:
        unit = args["name"]
        if not _UNIT_NAME.match(unit) or unit.startswith("."):
            raise ArgError("name", f"not a unit name: {unit!r}")
        if not unit.endswith(_UNIT_SUFFIXES):
            args["name"] = f"{unit}.service"
        if args.get("content") is not None and args.get("src") is not None:
            raise ArgError("content", "give at most one of content or src")
        dropins = args.get("dropins") or {}
        for key, text in dropins.items():
            if not isinstance(key, str) or not _DROPIN_NAME.match(key):
                raise ArgError("dropins", f"not a drop-in name: {key!r}")
            if not isinstance(text, str):
                raise ArgError("dropins", f"content of {key!r} must be a string")
        args["dropins"] = {
            (k if k.endswith(".conf") else f"{k}.conf"): v for k, v in dropins.items()
        }
        if args.get("masked"):
            if args.get("state") not in (None, "stopped"):
                raise ArgError("masked", f"a masked unit cannot be {args['state']}")
            if args.get("enabled"):
                raise ArgError("masked", "a masked unit cannot be enabled")
            if args.get("content") is not None or args.get("src") is not None:
                raise ArgError("masked", "masking replaces the unit file; drop content/src")
        managed = ("content", "src", "enabled", "state", "masked")
        if not args["dropins"] and all(args.get(k) is None for k in managed):
            raise ArgError(
                "state", "give at least one of content, src, dropins, enabled, state, masked"
            )

    def prepare(self, args: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
        if args.get("src") is not None:
            path = ctx.find_file("templates", args["src"])
            args = {**args, "content": ctx.render_template(path)}
        return args

    # ---- paths ---------------------------------------------------------------------------
    def files(self, args: dict[str, Any]) -> dict[str, tuple[str, str]]:
        """Managed files: {state key prefix: (path, content)}."""
        unit = args["name"]
        out: dict[str, tuple[str, str]] = {}
        if args.get("content") is not None:
            out["unit"] = (f"{UNIT_DIR}/{unit}", args["content"])
        for n, text in sorted(args["dropins"].items()):
            out[f"dropin.{n}"] = (f"{UNIT_DIR}/{unit}.d/{n}", text)
        return out

    # ---- read ----------------------------------------------------------------------------
    def read_script(self, args: dict[str, Any]) -> str:
        parts = []
        for prefix, (path, _) in self.files(args).items():
            parts += [f"echo @{prefix}", stat_script(path, with_hash=True)]
        parts += ["echo @show", f"systemctl show -p {_SHOW} -- {q(args['name'])}"]
        return "\n".join(parts)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        parts = sections(result.stdout)
        show = parse_kv(parts.get("show", ""))
        if "LoadState" not in show:
            raise ValueError(
                f"systemctl show gave no state for {args['name']} (is systemd running?)"
            )
        actual: dict[str, Any] = {}
        for prefix in self.files(args):
            stat = parse_stat(as_result(parts.get(prefix, "")))
            actual.update({f"{prefix}.{k}": v for k, v in stat.items()})
        file_state = show.get("UnitFileState", "")
        invocation = show.get("InvocationID", "")
        actual.update(
            {
                "loaded": show.get("LoadState"),
                "active": show.get("ActiveState"),
                "sub": show.get("SubState"),
                "unit_file_state": file_state,
                "enabled": file_state in _ENABLED,
                "masked": file_state.startswith("masked"),
                "invocation": invocation,
                "need_daemon_reload": show.get("NeedDaemonReload") == "yes",
            }
        )
        proof, self._proof = self._proof, None
        if args.get("state") in ("restarted", "reloaded"):
            actual[args["state"]] = (
                proof is not None and invocation == proof and show.get("ActiveState") == "active"
            )
        return actual

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for prefix, (_, text) in self.files(args).items():
            out.update(
                {
                    f"{prefix}.state": "file",
                    f"{prefix}.sha256": sha256_text(text),
                    **{f"{prefix}.{k}": v for k, v in _ROOT_644.items()},
                }
            )
        if self.files(args):
            out["need_daemon_reload"] = False
        if args.get("masked") is not None:
            out["masked"] = args["masked"]
        if args.get("enabled") is not None:
            out["enabled"] = args["enabled"]
        state = args.get("state")
        if state is not None:
            out["active"] = "inactive" if state == "stopped" else "active"
        if state in ("restarted", "reloaded"):
            out[state] = True
        return out

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        diffs = super().compare(args, actual)
        # A failed unit is stopped too; stopping it again would not change that.
        if diffs.get("active") == ("failed", "inactive"):
            del diffs["active"]
        return diffs

    def content_diff(
        self, args: dict[str, Any], session: HostSession, obs: Observation
    ) -> ContentDiff | None:
        for prefix, (path, text) in self.files(args).items():
            if (
                f"{prefix}.sha256" in obs.differences
                or obs.actual.get(f"{prefix}.state") == "absent"
            ):
                before = None
                if obs.actual.get(f"{prefix}.state") == "file":
                    res = session.run(f"cat -- {q(path)}")
                    before = res.stdout if res.rc == 0 else None
                return ContentDiff(path, before, text)
        return None

    # ---- write ---------------------------------------------------------------------------
    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        d = obs.differences
        unit = q(args["name"])
        wrote = False
        for prefix, (path, text) in self.files(args).items():
            if not any(k.startswith(f"{prefix}.") for k in d):
                continue
            if prefix.startswith("dropin."):
                run_checked(session, f"mkdir -p -m 0755 -- {q(path.rsplit('/', 1)[0])}")
            run_checked(session, atomic_write_script(path, _ROOT_644), stdin=text.encode("utf-8"))
            wrote = True
        if wrote or "need_daemon_reload" in d:
            run_checked(session, "systemctl daemon-reload")
        if d.get("masked", (None, None))[1] is False:
            run_checked(session, f"systemctl unmask -- {unit}")
        if "enabled" in d:
            verb = "enable" if args["enabled"] else "disable"
            run_checked(session, f"systemctl {verb} -- {unit}")
        state = args.get("state")
        if state == "started" and "active" in d:
            run_checked(session, f"systemctl start -- {unit}")
        elif state == "stopped" and "active" in d:
            run_checked(session, f"systemctl stop -- {unit}")
        elif state == "restarted":
            run_checked(session, f"systemctl restart -- {unit}")
            self._proof = self._invocation(session, args, must_differ=obs.actual.get("invocation"))
        elif state == "reloaded":
            if obs.actual.get("active") == "active":
                run_checked(session, f"systemctl reload -- {unit}")
                self._proof = self._invocation(session, args, must_differ=None)
            else:
                run_checked(session, f"systemctl start -- {unit}")
                self._proof = self._invocation(session, args, must_differ=None)
        if d.get("masked", (None, None))[1] is True:
            run_checked(session, f"systemctl mask -- {unit}")

    @staticmethod
    def _invocation(session: HostSession, args: dict[str, Any], must_differ: str | None) -> str:
        res = run_checked(session, f"systemctl show -p InvocationID --value -- {q(args['name'])}")
        invocation = res.stdout.strip()
        if not invocation or invocation == must_differ:
            raise CommandFailed(
                CommandResult(res.command, 1, "", f"{args['name']} did not start a new invocation")
            )
        return invocation
