"""A release archive (tar) downloaded on the host, verified by sha256, unpacked into a directory.

The state is the archive's sha256, kept in a marker file ``.gpumon-archive`` inside ``dest``, so a
second run compares hashes and downloads nothing. The sha256 is given (``sha256``) or taken from the
line for the file in a published checksum list (``checksum_url``, e.g. ``sha256sums.txt``), which
the read side fetches. The write downloads with curl to a temp directory beside ``dest``, checks
the hash before unpacking, unpacks into that temp directory and renames the tree into place; a
mismatch fails and leaves nothing behind.
"""

from __future__ import annotations

import posixpath
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
from deployer.modules.readout import sections

MARKER = ".gpumon-archive"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def checksum_for(sums: str, file_name: str) -> str | None:
    """The sha256 of ``file_name`` in a ``sha256sum``-style list ("HASH  NAME" or "HASH *NAME")."""
    for line in sums.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) != 2:
            continue
        digest, name = parts[0].lower(), parts[1].lstrip("*").strip()
        if name.startswith("./"):
            name = name[2:]
        if name == file_name and _SHA256.match(digest):
            return digest
    return None


@register
class Archive(Module):
    """A tar release archive unpacked into ``dest``, identified by its sha256."""

    name = "archive"
    params = {
        "url": Param(str, required=True),
        "dest": Param(str, required=True),
        "sha256": Param(str),
        "checksum_url": Param(str),
        "checksum_name": Param(str),
        "strip_components": Param(int, default=0),
        "creates": Param(str),
        "owner": Param(str),
        "group": Param(str),
    }

    def check(self, args: dict[str, Any]) -> None:
        for key in ("url", "checksum_url"):
            v = args.get(key)
            if v is not None and not re.match(r"^(https?|file)://\S+$", v):
                raise ArgError(key, f"not a URL: {v!r}")
        dest = args["dest"]
        if not dest.startswith("/") or dest.rstrip("/") in ("", "/") or "\n" in dest:
            raise ArgError("dest", f"must be an absolute directory path other than /: {dest!r}")
        args["dest"] = posixpath.normpath(dest)
        if (args.get("sha256") is None) == (args.get("checksum_url") is None):
            raise ArgError("sha256", "give exactly one of sha256 or checksum_url")
        if args.get("sha256") is not None:
            args["sha256"] = args["sha256"].lower()
            if not _SHA256.match(args["sha256"]):
                raise ArgError("sha256", "must be 64 hex digits")
        if args.get("checksum_name") is None:
            args["checksum_name"] = posixpath.basename(args["url"].split("?", 1)[0])
        if args["strip_components"] < 0:
            raise ArgError("strip_components", "must not be negative")
        creates = args.get("creates")
        if creates is not None and (
            creates.startswith("/") or ".." in creates.split("/") or "\n" in creates
        ):
            raise ArgError("creates", "must be a path relative to dest, without '..'")
        for key in ("owner", "group"):
            v = args.get(key)
            if v is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", v):
                raise ArgError(key, f"not a user/group name: {v!r}")

    def read_script(self, args: dict[str, Any]) -> str:
        dest = args["dest"]
        lines = [
            "echo @marker",
            f"cat -- {q(dest + '/' + MARKER)} 2>/dev/null",
            "echo @dest",
            f"if [ -d {q(dest)} ]; then stat --printf 'owner=%U\\ngroup=%G\\n' -- {q(dest)}; fi",
        ]
        if args.get("creates") is not None:
            path = q(f"{dest}/{args['creates']}")
            lines.append(f"if [ -e {path} ]; then echo creates=1; else echo creates=0; fi")
        if args.get("checksum_url") is not None:
            lines += [
                "echo @sums",
                f"curl -fsSL --max-time 60 -- {q(args['checksum_url'])} || echo sums_error=1",
            ]
        return "\n".join(lines)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        parts = sections(result.stdout)
        marker = parse_kv(parts.get("marker", ""))
        dest = parse_kv(parts.get("dest", ""))
        actual: dict[str, Any] = {
            "installed_sha256": marker.get("sha256"),
            "owner": dest.get("owner"),
            "group": dest.get("group"),
        }
        if args.get("creates") is not None:
            actual["creates_exists"] = dest.get("creates") == "1"
        if args.get("checksum_url") is not None:
            digest = checksum_for(parts.get("sums", ""), args["checksum_name"])
            if digest is None:
                raise ValueError(f"no sha256 for {args['checksum_name']} in {args['checksum_url']}")
            actual["published_sha256"] = digest
        return actual

    def expected_sha256(self, args: dict[str, Any], actual: dict[str, Any]) -> str:
        return args.get("sha256") or actual["published_sha256"]

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        out = {"owner": args.get("owner"), "group": args.get("group")}
        if args.get("creates") is not None:
            out["creates_exists"] = True
        return out

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        diffs = super().compare(args, actual)
        want = self.expected_sha256(args, actual)
        if actual.get("installed_sha256") != want:
            diffs["installed_sha256"] = (actual.get("installed_sha256"), want)
        return diffs

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        d = obs.differences
        if not d:
            return
        if "installed_sha256" not in d and "creates_exists" not in d:
            run_checked(session, f"chown -R -- {q(_owner_spec(args))} {q(args['dest'])}")
            return
        run_checked(
            session, self.install_script(args, self.expected_sha256(args, obs.actual)), timeout=3600
        )

    def install_script(self, args: dict[str, Any], sha256: str) -> str:
        dest = q(args["dest"])
        parent = q(posixpath.dirname(args["dest"]))
        url = q(args["url"])
        lines = [
            "set -e",
            f"mkdir -p -- {parent}",
            f"t=$(mktemp -d {parent}/.gpumon-archive.XXXXXXXX)",
            "trap 'rm -rf -- \"$t\"' EXIT",
            f'curl -fsSL --retry 3 --max-time 1800 -o "$t/download" -- {url}',
            "got=$(sha256sum < \"$t/download\" | cut -d' ' -f1)",
            f'if [ "$got" != {sha256} ]; then '
            f'echo "sha256 mismatch for "{url}": got $got, want {sha256}" >&2; exit 4; fi',
            'mkdir -- "$t/tree"',
            f'tar -xf "$t/download" -C "$t/tree" --no-same-owner '
            f"--strip-components={int(args['strip_components'])}",
        ]
        if args.get("creates") is not None:
            c = q(args["creates"])
            lines.append(
                f'if [ ! -e "$t/tree/"{c} ]; then echo "archive has no "{c} >&2; exit 5; fi'
            )
        lines += [
            f"printf 'sha256=%s\\nurl=%s\\n' {sha256} {url} > \"$t/tree/{MARKER}\"",
            'chmod 755 "$t/tree"',
        ]
        if args.get("owner") or args.get("group"):
            lines.append(f'chown -R -- {q(_owner_spec(args))} "$t/tree"')
        lines += [
            f'if [ -e {dest} ] || [ -L {dest} ]; then mv -T -- {dest} "$t/old"; fi',
            f'mv -T -- "$t/tree" {dest}',
        ]
        return "\n".join(lines)


def _owner_spec(args: dict[str, Any]) -> str:
    owner, group = args.get("owner") or "", args.get("group")
    return f"{owner}:{group}" if group else owner
