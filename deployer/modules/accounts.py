"""Local groups and users, typically system accounts that services run as (no login shell, no home).

Read from ``getent`` (so NSS sees what the daemons see); written with groupadd/groupmod/groupdel and
useradd/usermod/userdel. ``groups`` is the exact set of supplementary groups unless ``append``.
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

_ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]*[$]?$")


def _account_name(key: str, value: str) -> None:
    if not _ACCOUNT.match(value) or len(value) > 32:
        raise ArgError(key, f"not a valid user/group name: {value!r}")


def _id(key: str, value: int | None) -> None:
    if value is not None and not 0 <= value < 2**31:
        raise ArgError(key, f"out of range: {value}")


@register
class Group(Module):
    """A local group with an optional fixed gid."""

    name = "group"
    params = {
        "name": Param(str, required=True),
        "gid": Param(int),
        "system": Param(bool, default=False),
        "state": Param(str, default="present", choices=("present", "absent")),
    }

    def check(self, args: dict[str, Any]) -> None:
        _account_name("name", args["name"])
        _id("gid", args.get("gid"))

    def read_script(self, args: dict[str, Any]) -> str:
        return f"printf 'group=%s\\n' \"$(getent group -- {q(args['name'])})\""

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        entry = parse_kv(result.stdout).get("group", "")
        if not entry:
            return {"state": "absent"}
        fields = entry.split(":")
        return {"state": "present", "gid": int(fields[2])}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["state"] == "absent":
            return {"state": "absent"}
        return {"state": "present", "gid": args.get("gid")}

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        name = q(args["name"])
        if args["state"] == "absent":
            run_checked(session, f"groupdel -- {name}")
        elif obs.actual["state"] == "absent":
            opts = " --system" if args["system"] else ""
            if args.get("gid") is not None:
                opts += f" --gid {int(args['gid'])}"
            run_checked(session, f"groupadd{opts} -- {name}")
        elif "gid" in obs.differences:
            run_checked(session, f"groupmod --gid {int(args['gid'])} -- {name}")


@register
class User(Module):
    """A local user: uid, primary group, supplementary groups, home, shell, comment."""

    name = "user"
    params = {
        "name": Param(str, required=True),
        "uid": Param(int),
        "group": Param(str),
        "groups": Param(list),
        "append": Param(bool, default=False),
        "system": Param(bool, default=False),
        "home": Param(str),
        "create_home": Param(bool, default=False),
        "shell": Param(str, default="/usr/sbin/nologin"),
        "comment": Param(str),
        "state": Param(str, default="present", choices=("present", "absent")),
    }

    def check(self, args: dict[str, Any]) -> None:
        _account_name("name", args["name"])
        _id("uid", args.get("uid"))
        if args.get("group") is not None:
            _account_name("group", args["group"])
        for g in args.get("groups") or []:
            if not isinstance(g, str):
                raise ArgError("groups", f"not a group name: {g!r}")
            _account_name("groups", g)
        for key in ("home", "shell"):
            value = args.get(key)
            if value is not None and (not value.startswith("/") or ":" in value or "\n" in value):
                raise ArgError(key, f"must be an absolute path without ':', got {value!r}")
        comment = args.get("comment")
        if comment is not None and (":" in comment or "\n" in comment):
            raise ArgError("comment", "must be one line without ':'")
        if args["create_home"] and args.get("home") is None and args["system"]:
            raise ArgError("home", "give home when create_home is true for a system user")

    def read_script(self, args: dict[str, Any]) -> str:
        n = q(args["name"])
        return (
            f"e=$(getent passwd -- {n}); printf 'passwd=%s\\n' \"$e\"\n"
            'if [ -n "$e" ]; then '
            "printf 'primary=%s\\n' \"$(id -gn -- " + n + ')"; '
            "printf 'groups=%s\\n' \"$(id -Gn -- " + n + ')"; fi'
        )

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        kv = parse_kv(result.stdout)
        entry = kv.get("passwd", "")
        if not entry:
            return {"state": "absent"}
        _name, _pw, uid, _gid, gecos, home, shell = entry.split(":", 6)
        primary = kv.get("primary", "")
        groups = sorted(set(kv.get("groups", "").split()) - {primary})
        return {
            "state": "present",
            "uid": int(uid),
            "group": primary,
            "groups": groups,
            "home": home,
            "shell": shell,
            "comment": gecos,
        }

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["state"] == "absent":
            return {"state": "absent"}
        groups = args.get("groups")
        return {
            "state": "present",
            "uid": args.get("uid"),
            "group": args.get("group"),
            "groups": sorted(set(groups)) if groups is not None else None,
            "home": args.get("home"),
            "shell": args.get("shell"),
            "comment": args.get("comment"),
        }

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        diffs = super().compare(args, actual)
        want = self.desired(args).get("groups")
        if "groups" in diffs and args["append"] and set(want) <= set(actual.get("groups") or []):
            del diffs["groups"]
        return diffs

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        d = obs.differences
        if not d:
            return
        name = q(args["name"])
        if args["state"] == "absent":
            run_checked(session, f"userdel -- {name}")
            return
        opts: list[str] = []
        creating = obs.actual["state"] == "absent"
        if (creating or "uid" in d) and args.get("uid") is not None:
            opts.append(f"--uid {int(args['uid'])}")
        if (creating or "group" in d) and args.get("group") is not None:
            opts.append(f"--gid {q(args['group'])}")
        if args.get("groups") if creating else "groups" in d:
            groups = sorted(set(args["groups"]))
            if args["append"] and not creating:
                opts.append("--append")
            opts.append(f"--groups {q(','.join(groups))}")
        if (creating or "home" in d) and args.get("home") is not None:
            opts.append(f"{'--home-dir' if creating else '--home'} {q(args['home'])}")
        if creating or "shell" in d:
            opts.append(f"--shell {q(args['shell'])}")
        if (creating or "comment" in d) and args.get("comment") is not None:
            opts.append(f"--comment {q(args['comment'])}")
        if creating:
            if args["system"]:
                opts.insert(0, "--system")
            if args.get("group") is None:
                opts.append("--user-group")
            opts.append("--create-home" if args["create_home"] else "--no-create-home")
            run_checked(session, f"useradd {' '.join(opts)} -- {name}")
        elif opts:
            run_checked(session, f"usermod {' '.join(opts)} -- {name}")
