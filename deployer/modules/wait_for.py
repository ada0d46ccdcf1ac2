"""Waiting, on the host, until a port accepts connections, an HTTP endpoint answers, or a command passes.

The read side probes once; when the probe fails the write side polls on the host every
``interval`` seconds until it passes or ``timeout`` seconds have gone, which fails the task.
Waiting changes nothing, so a wait is reported ok, never changed (and check mode never predicts
a change for it).

With ``unit``, the wait also watches the systemd unit that should become ready: when it is
restarting after a crash (``SubState=auto-restart``), has failed or stopped, or has been restarted
by systemd since the wait began (``NRestarts`` grew), the wait fails at once, within one
``interval``, instead of at ``timeout``, and the error carries the unit's state and its last
journal lines. A timeout carries them too.
"""

from __future__ import annotations

import re
from typing import Any

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
from deployer.modules.readout import sections
from deployer.modules.systemd import UNIT_FAILURE_PROPS, SystemdUnit, unit_report_script

_HOST = re.compile(r"^[A-Za-z0-9_.:-]+$")
# curl's client config the roles write when the tier's TLS is on (deployer/tls/material.py,
# HOST_CURLRC): the CA that signed the tier's certificates and the basic-auth user. An https
# probe uses it when the host has it (the file is root's, 0600).
TLS_CURLRC = "/etc/gpumon/tls/curlrc"


def tls_client_opts(url: str) -> str:
    """Shell words (with a trailing space) that give an https probe the tier's client config."""
    if not url.startswith("https://"):
        return ""
    return f'$([ -r {TLS_CURLRC} ] && echo "-K {TLS_CURLRC}") '


@register
class WaitFor(Module):
    """Wait (bounded) for a port, an HTTP endpoint or a command on the host."""

    name = "wait_for"
    reports_change = False
    params = {
        "port": Param(int),
        "host": Param(str, default="127.0.0.1"),
        "url": Param(str),
        "status": Param(int, default=200),
        "contains": Param(str),
        "command": Param(str),
        "timeout": Param(int, default=60),
        "interval": Param(int, default=1),
        "unit": Param(str),
        # ``url`` in either scheme: a server the run is switching to or from TLS (gpumon_tls)
        # serves the other one until its restart, which the handlers do after this wait.
        "any_scheme": Param(bool, default=False),
    }

    def check(self, args: dict[str, Any]) -> None:
        given = [k for k in ("port", "url", "command") if args.get(k) is not None]
        if len(given) != 1:
            raise ArgError("port", "give exactly one of port, url or command")
        if args.get("port") is not None and not 0 < args["port"] < 65536:
            raise ArgError("port", f"out of range: {args['port']}")
        if not _HOST.match(args["host"]):
            raise ArgError("host", f"not a host name or address: {args['host']!r}")
        if args.get("url") is not None and not re.match(r"^https?://\S+$", args["url"]):
            raise ArgError("url", f"not an http(s) URL: {args['url']!r}")
        if args.get("url") is None:
            for key in ("contains",):
                if args.get(key) is not None:
                    raise ArgError(key, "only valid with url")
        if not 0 < args["timeout"] <= 3600:
            raise ArgError("timeout", "must be between 1 and 3600 seconds")
        if not 0 < args["interval"] <= args["timeout"]:
            raise ArgError("interval", "must be between 1 and timeout seconds")
        if args.get("unit") is not None:
            unit = SystemdUnit().validate({"name": args["unit"], "state": "started"})["name"]
            args["unit"] = unit

    def probe(self, args: dict[str, Any]) -> str:
        """Shell that exits 0 when the awaited thing is ready (and prints why not otherwise)."""
        if args.get("port") is not None:
            host, port = args["host"], args["port"]
            return f"timeout 5 bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' {q(host)} {port} 2>/dev/null"
        if args.get("url") is not None and args.get("any_scheme"):
            scheme, _, rest = args["url"].partition("://")
            other = f"{'http' if scheme == 'https' else 'https'}://{rest}"
            return f"{self._url_probe(args, args['url'])} || {self._url_probe(args, other)}"
        if args.get("url") is not None:
            return self._url_probe(args, args["url"])
        return f"( sh -c {q(args['command'])} ) >/dev/null 2>&1 </dev/null"

    def _url_probe(self, args: dict[str, Any], url: str) -> str:
        check = f'[ "$s" = {args["status"]} ]'
        if args.get("contains") is not None:
            check += f" && printf '%s\\n' \"$b\" | sed '$d' | grep -qF -- {q(args['contains'])}"
        return (
            f"{{ b=$(curl -sS --max-time 5 {tls_client_opts(url)}"
            f"-w '\\n%{{http_code}}' -- {q(url)} "
            "2>/dev/null); s=$(printf '%s\\n' \"$b\" | tail -n 1); " + check + "; }"
        )

    def read_script(self, args: dict[str, Any]) -> str:
        return f"if {self.probe(args)}; then echo ready=1; else echo ready=0; fi"

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return {"ready": parse_kv(result.stdout).get("ready") == "1"}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ready": True}

    def what(self, args: dict[str, Any]) -> str:
        if args.get("port") is not None:
            return f"port {args['host']}:{args['port']}"
        if args.get("url") is not None:
            return f"{args['url']} (status {args['status']})"
        return f"command {args['command']!r}"

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        t, i = int(args["timeout"]), int(args["interval"])
        unit = args.get("unit")
        watch = ""
        if unit is not None:
            u = q(unit)
            # Between probes: is the unit still on its way up? (systemd.service(5): a unit with
            # Restart= whose process exited waits in SubState=auto-restart for RestartSec.)
            watch = (
                f"  st=$(systemctl show -p {UNIT_FAILURE_PROPS} -- {u} 2>/dev/null)\n"
                "  nr=$(printf '%s\\n' \"$st\" | sed -n 's/^NRestarts=//p')\n"
                '  case "$st" in *SubState=auto-restart*|*ActiveState=failed*|*ActiveState=inactive*)'
                " down=1;; *) down=0;; esac\n"
                '  if [ "$down" = 1 ] || [ "${nr:-0}" -gt "${nr0:-0}" ]; then\n'
                "    echo @crashed; " + unit_report_script(unit) + "; exit 4\n"
                "  fi\n"
            )
        script = (
            (
                f"nr0=$(systemctl show -p NRestarts --value -- {q(unit)} 2>/dev/null)\n"
                if unit
                else ""
            )
            + f"end=$(( $(date +%s) + {t} ))\n"
            f"until {self.probe(args)}; do\n"
            + watch
            + '  if [ "$(date +%s)" -ge "$end" ]; then\n'
            + (f"    echo @timeout; {unit_report_script(unit)}\n" if unit else "")
            + "    exit 1\n  fi\n"
            f"  sleep {i}\n"
            "done"
        )
        result = session.run(script, timeout=t + 30)
        if result.rc == 0:
            return
        parts = sections(result.stdout)
        report = (parts.get("crashed") or parts.get("timeout") or "").strip()
        if "crashed" in parts:
            message = (
                f"{unit} is not coming up (crashed, failed or stopped) while waiting for "
                f"{self.what(args)}; stopped waiting at once\n{report}"
            )
        else:
            message = f"{self.what(args)} not ready after {t}s" + (f"\n{report}" if report else "")
        raise CommandFailed(CommandResult("", result.rc, "", message))
