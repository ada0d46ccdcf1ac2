"""Owed handlers: a handler notified by a change that was made and not yet run successfully.

The record lives on the host the change was made on, one small file per handler under
``OWED_DIR`` (root only, 0600), written before the change, in the same shell command as the
write's first command, and removed only after the handler succeeded. On the host, because that
is the one place every later run reads whatever controller it starts from: a run that stops after
a change (a later task failed, the controller was killed or lost the network) leaves the reload
or restart it owes there, and the next run on that host runs it even when it changes nothing.
(Ansible's ``--force-handlers`` runs them in the failing run only, and keeps nothing when the
controller itself goes.) No fsync: a host that loses power restarts its daemons from the files
on disk anyway, which is what the owed handlers were for.

Each entry names the role and handler (the pair is the handler's identity in a play), when and
by which task it became owed, and the handler module's baseline (see
``Module.baseline_script``) read just before that change: with it an owed restart knows whether
the unit has been restarted since.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from deployer.modules.base import q

OWED_DIR = "/var/lib/gpumon-deploy/owed-handlers"
_SUFFIX = ".owed"
_ENTRY = "@@owed"
_BASELINE = "baseline:"
# The write's first command exits with this when the record cannot be written (nothing changed).
RECORD_FAILED_RC = 97


@dataclass(frozen=True)
class OwedHandler:
    role: str
    handler: str
    since: str  # the host's UTC time when it became owed (last refreshed)
    by: str  # the task whose change made it owed
    baseline: str | None


def key(role: str, handler: str) -> str:
    """The file name stem of a handler's entry (names may hold any character)."""
    return hashlib.sha256(f"{role}\0{handler}".encode()).hexdigest()[:24]


def read_script(directory: str = OWED_DIR) -> str:
    """Read-only, batch-safe shell printing every entry (nothing when there is none)."""
    d = q(directory)
    return (
        f'for owed_f in {d}/*{_SUFFIX}; do if [ -f "$owed_f" ]; then '
        f"printf '%s\\n' {_ENTRY}; cat -- \"$owed_f\"; fi; done"
    )


def parse(stdout: str) -> dict[str, OwedHandler]:
    """The entries printed by :func:`read_script`, by :func:`key`; unreadable ones are skipped."""
    out: dict[str, OwedHandler] = {}
    for chunk in stdout.split(f"{_ENTRY}\n")[1:]:
        fields: dict[str, str] = {}
        baseline: str | None = None
        lines = chunk.split("\n")
        for i, line in enumerate(lines):
            if line == _BASELINE:
                baseline = "\n".join(lines[i + 1 :]).rstrip("\n")
                break
            name, sep, value = line.partition("=")
            if sep:
                fields[name] = value
        try:
            role, handler = json.loads(fields["role"]), json.loads(fields["handler"])
            by = json.loads(fields.get("by", '""'))
        except (KeyError, ValueError):
            continue
        if isinstance(role, str) and isinstance(handler, str):
            entry = OwedHandler(role, handler, fields.get("since", ""), str(by), baseline)
            out[key(role, handler)] = entry
    return out


def record_script(
    entries: list[tuple[str, str, str, str | None]], directory: str = OWED_DIR
) -> str:
    """Shell writing (atomically, each by a rename) the entries ``(role, handler, by task,
    baseline script or None)``; it ends non-zero when one could not be written."""
    d = q(directory)
    parts = [f"mkdir -p -m 0700 -- {d}"]
    for role, handler, by, baseline in entries:
        head = " ".join(
            q(f"{k}={json.dumps(v)}") for k, v in (("role", role), ("handler", handler))
        )
        body = (
            f"printf '%s\\n' {head}; "
            "printf 'since=%s\\n' \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"; "
            f"printf '%s\\n' {q('by=' + json.dumps(by))}"
        )
        if baseline is not None:
            body += f"; printf '%s\\n' {q(_BASELINE)}; {{ {baseline}\n}} 2>/dev/null"
        parts.append(
            f'owed_t=$(mktemp {d}/.owed.XXXXXX) && {{ {body}; }} > "$owed_t" '
            f'&& mv -f -- "$owed_t" {d}/{key(role, handler)}{_SUFFIX}'
        )
    return " &&\n".join(parts)


def before_write(record: str, directory: str = OWED_DIR) -> str:
    """``record`` as the prefix of a write's first command: it reads no stdin, prints nothing,
    and stops the command (exit RECORD_FAILED_RC, nothing changed) when it fails."""
    return (
        f"{{ {record}\n}} </dev/null >/dev/null || {{ echo {q('cannot record the owed handlers in ' + directory)} >&2; "
        f"exit {RECORD_FAILED_RC}; }}\n"
    )


def clear_script(keys: list[str], directory: str = OWED_DIR) -> str:
    files = " ".join(q(f"{directory}/{k}{_SUFFIX}") for k in keys)
    return f"rm -f -- {files}"
