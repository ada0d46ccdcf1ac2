"""A systemd unit: its unit file and drop-ins, enabled, masked, and running state.

State is read with one ``systemctl show`` call (plus a stat and hash of each managed file). A
changed unit file or drop-in (or ``NeedDaemonReload=yes``) triggers ``daemon-reload`` before any
start or restart. With ``exec_check`` (e.g. ``--version`` for the Prometheus daemons, whose flag
parser runs before that flag's action), a changed unit's ExecStart is first run by its own program
with those arguments: a flag the program does not know refuses the unit file before it replaces
the live one.

``restarted`` and ``reloaded`` are actions. Each is proven by the read that follows this task's own
write, against the observation the write started from (``before``): a restart by a running
invocation other than the one before (systemd gives every start a random ``InvocationID``), a
reload by the same invocation still running. As a handler, a restart is also a state: the engine
keeps the unit's invocation of the moment a change made the restart owed (the ``baseline``); a unit
already running a newer invocation (started after that change, with it) needs no restart.

``started`` with a replaced unit file (or drop-in): a unit that is not serving then, one systemd is
restarting after a crash (``SubState=auto-restart``), still starting, or stopped, starts from the
file on disk at once (``start_from_disk_script``); a running unit is left to the restart the
change notifies (a takedown, which the HA guard judges). Without this a crash-looping daemon kept
crashing under the old file until its next automatic restart, and the task's readiness wait
failed on that crash of the old file (CI, 2026-12-02: a fixed flag after a crash loop).
"""

from __future__ import annotations

import re
import shlex
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
from deployer.modules.probe import SectionedRead
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
        # Arguments that make the ExecStart program parse its flags and exit (see the docstring).
        "exec_check": Param(str),
    }

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
        if args.get("exec_check") is not None:
            if args.get("content") is None:
                raise ArgError("exec_check", "needs the unit's content (content or src)")
            exec_start(args["content"])  # an ArgError now, not on the host
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
        parts = [
            (prefix, stat_script(path, with_hash=True))
            for prefix, (path, _) in self.files(args).items()
        ]
        parts.append(("show", f"systemctl show -p {_SHOW} -- {q(args['name'])}"))
        return SectionedRead(parts)

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
        state = args.get("state")
        running = actual["active"] == "active" and actual["invocation"] != ""
        if state == "restarted":
            if before is not None:  # the read that verifies this task's own restart
                actual["restarted"] = running and actual["invocation"] != before.actual.get(
                    "invocation"
                )
            elif baseline is not None:  # an owed restart: done if a newer invocation runs
                actual["restarted"] = running and actual["invocation"] != baseline.strip()
            else:
                actual["restarted"] = False
        elif state == "reloaded":
            if before is not None:
                was_running = before.actual.get("active") == "active"
                actual["reloaded"] = running and (
                    actual["invocation"] == before.actual.get("invocation") or not was_running
                )
            else:
                actual["reloaded"] = False
        return Observation(actual=actual, differences=self.compare(args, actual))

    def baseline_script(self, args: dict[str, Any]) -> str | None:
        if args.get("state") != "restarted":
            return None
        return f"systemctl show -p InvocationID --value -- {q(args['name'])}"

    def takes_down(self, args: dict[str, Any], obs: Observation) -> str | None:
        if obs.actual.get("active") != "active":
            return None
        d, unit = obs.differences, args["name"]
        if args.get("state") == "restarted" and "restarted" in d:
            return f"restart of {unit}"
        if args.get("state") == "stopped" and "active" in d:
            return f"stop of {unit}"
        if d.get("masked", (None, None))[1] is True:
            return f"stop of {unit} (masked)"
        return None

    def diagnose(self, args: dict[str, Any], session: HostSession) -> str | None:
        result = session.run(unit_report_script(args["name"]))
        return result.stdout.strip() or None

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
        if args.get("exec_check") is not None and any(k.startswith("unit.") for k in d):
            self._exec_check(session, args)
        for prefix, (path, text) in self.files(args).items():
            if not any(k.startswith(f"{prefix}.") for k in d):
                continue
            if prefix.startswith("dropin."):
                run_checked(session, f"mkdir -p -m 0755 -- {q(path.rsplit('/', 1)[0])}")
            run_checked(session, atomic_write_script(path, _ROOT_644), stdin=text.encode("utf-8"))
            wrote = True
        reloaded = wrote or "need_daemon_reload" in d  # systemd now holds the file on disk
        if reloaded:
            run_checked(session, "systemctl daemon-reload")
        if d.get("masked", (None, None))[1] is False:
            run_checked(session, f"systemctl unmask -- {unit}")
        if "enabled" in d:
            verb = "enable" if args["enabled"] else "disable"
            run_checked(session, f"systemctl {verb} -- {unit}")
        state = args.get("state")
        if state == "started" and reloaded:
            run_checked(session, start_from_disk_script(args["name"]))
        elif state == "started" and "active" in d:
            run_checked(session, f"systemctl start -- {unit}")
        elif state == "stopped" and "active" in d:
            run_checked(session, f"systemctl stop -- {unit}")
        elif state == "restarted":
            run_checked(session, f"systemctl restart -- {unit}")
        elif state == "reloaded":
            verb = "reload" if obs.actual.get("active") == "active" else "start"
            run_checked(session, f"systemctl {verb} -- {unit}")
        if d.get("masked", (None, None))[1] is True:
            run_checked(session, f"systemctl mask -- {unit}")

    def _exec_check(self, session: HostSession, args: dict[str, Any]) -> None:
        """Run the new ExecStart with ``exec_check`` appended; refuse the unit when it fails."""
        argv = [*exec_start(args["content"]), *shlex.split(args["exec_check"])]
        command = " ".join(q(a) for a in argv)
        result = session.run(f"timeout 30 {command} </dev/null 2>&1")
        if result.rc != 0:
            said = "\n".join(result.stdout.strip().splitlines()[-5:])
            raise CommandFailed(
                CommandResult(
                    "",
                    result.rc,
                    "",
                    f"{args['name']}: the new ExecStart is refused by {argv[0]} itself "
                    f"(run with {args['exec_check']}, exit {result.rc}); the unit file was not "
                    f"changed:\n{said}",
                )
            )


# Properties that say why a unit is not running, for errors (systemd.exec(5), systemd.service(5)).
UNIT_FAILURE_PROPS = "ActiveState,SubState,Result,ExecMainCode,ExecMainStatus,NRestarts"
JOURNAL_LINES = 20
ERROR_LINES = 5
ERROR_SCAN_LINES = 200
_ERROR_WORDS = "error[: =]|fatal|panic|level=err"


# A running process younger than this that systemd restarted (NRestarts > 0) may be one run of a
# crash loop between two crashes: it is watched that long before it counts as serving.
CRASH_SETTLE_S = 10


def start_from_disk_script(unit: str) -> str:
    """Shell run after a replaced unit file's ``daemon-reload`` (state ``started``): a unit not
    serving starts from the file on disk now; a running one is left alone (exit 0).

    - ``auto-restart`` (between two runs of a crash loop) or ``activating`` (still starting, from
      the old file): ``systemctl restart``, which starts it now. ``systemctl start`` would wait
      for the restart timer, or do nothing while it starts (systemd ``src/core/service.c``,
      ``service_start``: ``-EAGAIN`` in ``SERVICE_AUTO_RESTART``, 0 while starting).
    - stopped or failed: ``systemctl start``.
    - running, systemd-restarted and younger than ``CRASH_SETTLE_S``: watched until it is that old
      (serving; exit 0) or down (then as above). ``NRestarts`` is not reset by a restart by hand
      (systemd 252, seen on the lab), so an old count alone says nothing; the age does (``ps``,
      procps; without it, or without a main PID, the unit counts as serving).
    """
    u = q(unit)
    tries = CRASH_SETTLE_S * 4
    return (
        f"i=0\n"
        f"while :; do\n"
        f"  st=$(systemctl show -p ActiveState,SubState,NRestarts,MainPID -- {u})\n"
        '  v() { printf \'%s\\n\' "$st" | sed -n "s/^$1=//p"; }\n'
        "  a=$(v ActiveState); s=$(v SubState); n=$(v NRestarts); pid=$(v MainPID)\n"
        '  case "$a/$s" in\n'
        f"    */auto-restart|activating/*) exec systemctl restart -- {u} ;;\n"
        f"    inactive/*|failed/*) exec systemctl start -- {u} ;;\n"
        "  esac\n"
        '  [ "${n:-0}" -gt 0 ] && [ "${pid:-0}" -gt 0 ] || exit 0\n'
        "  age=$(ps -o etimes= -p \"$pid\" 2>/dev/null | tr -d ' ')\n"
        f'  [ -n "$age" ] && [ "$age" -lt {CRASH_SETTLE_S} ] || exit 0\n'
        f'  i=$((i + 1)); [ "$i" -lt {tries} ] || exit 0\n'
        "  sleep 0.25\n"
        "done"
    )


def unit_report_script(unit: str) -> str:
    """Read-only shell printing a unit's state, the last error lines of its journal (a daemon's
    error often comes before many lines of usage text) and its last journal lines, for an error.
    The error lines are picked for the reader only; nothing is decided on them."""
    u = q(unit)
    journal = f"journalctl -u {u} --no-pager"
    return (
        f"printf 'state of %s: ' {u}; "
        f"systemctl show -p {UNIT_FAILURE_PROPS} -- {u} 2>/dev/null | paste -sd ' ' -; "
        f"printf 'last error lines in the journal of %s:\\n' {u}; "
        f"{journal} -n {ERROR_SCAN_LINES} 2>&1 | grep -iE {q(_ERROR_WORDS)} "
        f"| tail -n {ERROR_LINES} | sed 's/^/  /'; "
        f"printf 'last journal lines of %s:\\n' {u}; "
        f"{journal} -n {JOURNAL_LINES} 2>&1 | sed 's/^/  /'"
    )


def exec_start(content: str) -> list[str]:
    """The program and arguments of a unit's single ExecStart= line (continuations joined).

    Raises ArgError when there is none, several, or when it uses what only systemd expands
    (``%`` specifiers, ``$`` variables): the check would not run what systemd runs.
    """
    lines: list[str] = []
    pending = ""
    for raw in content.splitlines():
        line = raw.strip()
        if pending and line[:1] in ("#", ";"):
            continue  # a comment between continuation lines (systemd.syntax(7))
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    starts = [ln.split("=", 1)[1] for ln in lines if ln.startswith("ExecStart=")]
    if len(starts) != 1:
        raise ArgError("exec_check", f"needs exactly one ExecStart= line, found {len(starts)}")
    command = starts[0].strip().lstrip("-@:+!")
    if "%" in command or "$" in command:
        raise ArgError("exec_check", "ExecStart uses % specifiers or $ variables")
    argv = shlex.split(command)
    if not argv:
        raise ArgError("exec_check", "ExecStart is empty")
    return argv
