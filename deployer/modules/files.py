"""Files on a host: directory, file (attributes, absence, links), copy and template.

Content is compared by sha256 and written atomically: a temp file in the destination's directory
(created 0600, so secrets are never readable in between), owner and mode set on it, the optional
``validate`` command run against it, then renamed over the live file.
"""

from __future__ import annotations

import hashlib
import posixpath
from pathlib import Path
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
from deployer.modules.probe import probe_or_script
from deployer.secrets import MASK


def normalise_mode(key: str, mode: Any) -> str | None:
    """'0644' -> '644' (stat %a form). Integers are refused: YAML reads 0644 and 644 apart."""
    if mode is None:
        return None
    if not isinstance(mode, str):
        raise ArgError(key, "file modes must be quoted strings such as '0644'")
    try:
        value = int(mode, 8)
    except ValueError:
        raise ArgError(key, f"not an octal mode: {mode!r}") from None
    if not 0 <= value <= 0o7777:
        raise ArgError(key, f"mode out of range: {mode!r}")
    return format(value, "o")


def _abs_path(key: str, path: str) -> None:
    if not path.startswith("/") or "\n" in path:
        raise ArgError(key, f"must be an absolute path, got {path!r}")


def stat_script(path: str, with_hash: bool) -> str:
    """The read of ``path``'s state that ``parse_stat`` parses: a file probe, which a batch of
    reads answers with its other probes from one ``stat`` and one ``sha256sum``
    (deployer/modules/probe.py)."""
    return probe_or_script(path, with_hash)


def parse_stat(result: CommandResult) -> dict[str, Any]:
    kv = parse_kv(result.stdout)
    if kv.get("exists") != "1":
        return {"state": "absent"}
    ftype = kv.get("type", "")
    state = {
        "directory": "directory",
        "symbolic link": "link",
    }.get(ftype, "file" if "regular" in ftype else ftype)
    actual: dict[str, Any] = {
        "state": state,
        "owner": kv.get("owner"),
        "group": kv.get("group"),
        "mode": kv.get("mode"),
    }
    if "sha256" in kv:
        actual["sha256"] = kv["sha256"].split(" ", 1)[0]
    if "target" in kv:
        actual["target"] = kv["target"]
    return actual


def attr_commands(path: str, args: dict[str, Any], differences: dict[str, Any]) -> list[str]:
    cmds = []
    p = q(path)
    if "owner" in differences or "group" in differences:
        owner = args.get("owner") or ""
        group = args.get("group") or ""
        spec = f"{owner}:{group}" if group else owner
        cmds.append(f"chown -h -- {q(spec)} {p}")
    if "mode" in differences:
        cmds.append(f"chmod -- {args['mode']} {p}")
    return cmds


ATTR_PARAMS = {
    "owner": Param(str),
    "group": Param(str),
    "mode": Param((str, int)),  # ints are refused with a clear message in normalise_mode
}


class FileAttrs(Module):
    write_then_read = True  # one command per write (an atomic replace, or chown/chmod)

    def check(self, args: dict[str, Any]) -> None:
        key = "path" if "path" in self.params else "dest"
        _abs_path(key, args[key])
        args["mode"] = normalise_mode("mode", args.get("mode"))


@register
class Directory(FileAttrs):
    """A directory with owner, group and mode (parents created as needed), or its absence."""

    name = "directory"
    params = {
        "path": Param(str, required=True),
        "state": Param(str, default="present", choices=("present", "absent")),
        **ATTR_PARAMS,
    }

    def read_script(self, args: dict[str, Any]) -> str:
        return stat_script(args["path"], with_hash=False)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return parse_stat(result)

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["state"] == "absent":
            return {"state": "absent"}
        return {
            "state": "directory",
            "owner": args["owner"],
            "group": args["group"],
            "mode": args["mode"],
        }

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        p = q(args["path"])
        if args["state"] == "absent":
            if obs.actual.get("state") == "directory":
                run_checked(session, f"rm -rf -- {p}")
            elif obs.actual.get("state") != "absent":
                raise CommandFailed(
                    CommandResult(
                        "", 1, "", f"{args['path']} is not a directory; refusing to remove it"
                    )
                )
            return
        cmds = []
        if obs.actual.get("state") not in ("directory",):
            if obs.actual.get("state") != "absent":
                raise CommandFailed(
                    CommandResult("", 1, "", f"{args['path']} exists and is not a directory")
                )
            cmds.append(f"mkdir -p -- {p}")
            diffs = {"owner": 1, "group": 1, "mode": 1}
        else:
            diffs = obs.differences
        cmds += attr_commands(args["path"], args, {k: v for k, v in diffs.items() if args.get(k)})
        run_checked(session, " && ".join(cmds))


@register
class File(FileAttrs):
    """An existing file's attributes, a file's absence, or a symbolic link."""

    name = "file"
    params = {
        "path": Param(str, required=True),
        "state": Param(str, default="file", choices=("file", "touch", "absent", "link")),
        "src": Param(str),
        **ATTR_PARAMS,
    }

    def check(self, args: dict[str, Any]) -> None:
        super().check(args)
        if args["state"] == "link" and not args.get("src"):
            raise ArgError("src", "required when state is link")

    def read_script(self, args: dict[str, Any]) -> str:
        return stat_script(args["path"], with_hash=False)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return parse_stat(result)

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        state = args["state"]
        if state == "absent":
            return {"state": "absent"}
        if state == "link":
            return {"state": "link", "target": args["src"]}
        return {
            "state": "file",
            "owner": args["owner"],
            "group": args["group"],
            "mode": args["mode"],
        }

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        p = q(args["path"])
        state = args["state"]
        current = obs.actual.get("state")
        if state == "absent":
            if current == "directory":
                raise CommandFailed(
                    CommandResult(
                        "", 1, "", f"{args['path']} is a directory; use the directory module"
                    )
                )
            run_checked(session, f"rm -f -- {p}")
            return
        if state == "link":
            run_checked(session, f"ln -sfn -- {q(args['src'])} {p}")
            return
        cmds = []
        diffs = dict(obs.differences)
        if current == "absent":
            if state == "file":
                raise CommandFailed(
                    CommandResult(
                        "", 1, "", f"{args['path']} does not exist (use state: touch or copy)"
                    )
                )
            cmds.append(f"umask 077 && : >> {p}")
            diffs = {"owner": 1, "group": 1, "mode": 1}
        cmds += attr_commands(args["path"], args, {k: v for k, v in diffs.items() if args.get(k)})
        if cmds:
            run_checked(session, " && ".join(cmds))


@register
class Copy(FileAttrs):
    """A file with exact content (inline ``content`` or a role file ``src``), written atomically."""

    name = "copy"
    params = {
        "dest": Param(str, required=True),
        "content": Param(str),
        "src": Param(str),
        "validate": Param(str),
        "secret": Param(bool, default=False),
        **ATTR_PARAMS,
    }
    source_kind = "files"

    def check(self, args: dict[str, Any]) -> None:
        super().check(args)
        if (args.get("content") is None) == (args.get("src") is None):
            raise ArgError("content", "give exactly one of content or src")
        if args.get("validate") and "%s" not in args["validate"]:
            raise ArgError("validate", "must contain %s (the candidate file's path)")

    def prepare(self, args: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
        if args.get("src") is not None:
            path = ctx.find_file(self.source_kind, args["src"])
            args = {**args, "content": self._load(path, ctx), "src": args["src"]}
        return args

    def _load(self, path: str, ctx: PrepareContext) -> str:
        return Path(path).read_text(encoding="utf-8")

    def secret_args(self, args: dict[str, Any]) -> set[str]:
        return {"content"} if args.get("secret") else set()

    def read_script(self, args: dict[str, Any]) -> str:
        return stat_script(args["dest"], with_hash=True)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return parse_stat(result)

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        digest = hashlib.sha256(args["content"].encode("utf-8")).hexdigest()
        return {
            "state": "file",
            "sha256": digest,
            "owner": args["owner"],
            "group": args["group"],
            "mode": args["mode"],
        }

    def content_diff(
        self, args: dict[str, Any], session: HostSession, obs: Observation
    ) -> ContentDiff | None:
        if "sha256" not in obs.differences and obs.actual.get("state") != "absent":
            return None
        if args.get("secret"):
            return ContentDiff(
                args["dest"], MASK if obs.actual.get("state") == "file" else None, MASK
            )
        before = None
        if obs.actual.get("state") == "file":
            res = session.run(f"cat -- {q(args['dest'])}")
            before = res.stdout if res.rc == 0 else None
        return ContentDiff(args["dest"], before, args["content"])

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        dest = args["dest"]
        if obs.actual.get("state") not in ("file", "absent"):
            raise CommandFailed(
                CommandResult("", 1, "", f"{dest} exists and is not a regular file")
            )
        if "sha256" not in obs.differences and obs.actual.get("state") == "file":
            # Only attributes differ: fix them in place.
            cmds = attr_commands(dest, args, {k: 1 for k in obs.differences if args.get(k)})
            if cmds:
                run_checked(session, " && ".join(cmds))
            return
        run_checked(session, atomic_write_script(dest, args), stdin=args["content"].encode("utf-8"))


def atomic_write_script(dest: str, args: dict[str, Any]) -> str:
    """Shell that writes stdin to ``dest`` through a 0600 temp file, validate, rename."""
    d = q(posixpath.dirname(dest) or "/")
    lines = [
        "set -e",
        f"t=$(mktemp {d}/.gpumon.XXXXXXXX)",
        "trap 'rm -f \"$t\"' EXIT",
        'cat > "$t"',
    ]
    owner, group = args.get("owner"), args.get("group")
    if owner or group:
        spec = f"{owner or ''}:{group}" if group else owner
        lines.append(f'chown -- {q(spec)} "$t"')
    # A new file without an explicit mode gets the usual 0644, unless it is secret.
    mode = args.get("mode") or ("600" if args.get("secret") else None)
    if mode is None:
        lines.append(
            f'if [ -e {q(dest)} ]; then chmod --reference={q(dest)} "$t"; else chmod 644 "$t"; fi'
        )
    else:
        lines.append(f'chmod {mode} "$t"')
    if args.get("validate"):
        cmd = args["validate"].replace("%s", '"$t"')
        lines.append(
            f'if ! {cmd} >&2; then echo "validate failed: {args["validate"]}" >&2; exit 3; fi'
        )
    lines.append(f'mv -f -- "$t" {q(dest)}')
    lines.append("trap - EXIT")
    return "\n".join(lines)


@register
class Template(Copy):
    """A file rendered from a Jinja template (role ``templates/`` or the shared ``templates/``)."""

    name = "template"
    params = {
        "src": Param(str, required=True),
        "dest": Param(str, required=True),
        "validate": Param(str),
        "secret": Param(bool, default=False),
        **ATTR_PARAMS,
    }
    source_kind = "templates"

    def check(self, args: dict[str, Any]) -> None:
        FileAttrs.check(self, args)
        if args.get("validate") and "%s" not in args["validate"]:
            raise ArgError("validate", "must contain %s (the candidate file's path)")

    def _load(self, path: str, ctx: PrepareContext) -> str:
        return ctx.render_template(path)
