"""``--limit`` host patterns, evaluated as Ansible evaluates them (inventory/manager.py).

A limit is a list of patterns separated by ``,`` (or, with no comma, by ``:``, which Ansible keeps
for compatibility; brackets such as ``gpu[0:1]`` are not split). Each pattern is one of:

- ``all`` or ``*``: every host;
- a host name or group name (a group means all hosts in it and its descendants);
- a shell glob (``gpu*``, ``prom0?``, ``rack[ab]-*``) matched against group names and host names;
- a regex after ``~`` (``~gpu0[1-3]``), matched from the start of the name;
- any of those with a subscript selecting from its hosts: ``gpu[0]``, ``gpu[-1]``, ``gpu[0:1]``
  (inclusive), ``gpu[2:]``;
- ``@file``: the patterns listed in a file, one per line.

A leading ``&`` intersects and ``!`` excludes. Regular patterns are applied first (a union, in the
order given), then every ``&``, then every ``!``, whatever order they were written in; with only
``&``/``!`` patterns the base is ``all``. Each pattern's hosts come in inventory order. A name that
is both a host and a group means the host.

Stricter than Ansible (which warns and goes on): a pattern that matches no group and no host, a
bad regex, a subscript out of range, or a limit selecting no host at all is an InputError naming
the pattern.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.errors import InputError

if TYPE_CHECKING:
    from deployer.inventory import Host, Inventory

_COLON_SPLIT = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
_SUBSCRIPT = re.compile(
    r"""^
        (.+)                    # the pattern, followed by
        \[(?:
            (-?[0-9]+)          # a single index
            |([0-9]*)(:)([0-9]*)   # or an inclusive start:end range
        )\]
    $""",
    re.X,
)
_GLOB_CHARS = ("*", "?", "[", ".")


class NoHostsMatched(InputError):
    """A pattern names nothing in the inventory, or the whole limit selects no host.

    A caller applying a fixed pattern (a site play's ``hosts: thanos_query``) to an inventory
    that may lack the group can catch this one; a malformed pattern is a plain InputError.
    """


def _brackets_pair_up(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            return False
    return depth == 0


def split_patterns(limit: str) -> list[str]:
    """Split a limit into single patterns as Ansible does (commas first, else colons).

    A colon-separated limit whose brackets do not pair up is an InputError.
    """
    if "," in limit:
        parts = limit.split(",")
    else:
        parts = _COLON_SPLIT.findall(limit)
        # Ansible's split silently drops what it cannot read (an unbalanced "["); refuse instead.
        if not _brackets_pair_up(limit):
            raise InputError(
                "malformed pattern: unbalanced '[' or ']'", source="--limit", key=limit
            )
    return [p.strip() for p in parts if p.strip()]


def _ordered(patterns: list[str]) -> list[str]:
    regular = [p for p in patterns if p[0] not in "!&"]
    intersect = [p for p in patterns if p[0] == "&"]
    exclude = [p for p in patterns if p[0] == "!"]
    return (regular or ["all"]) + intersect + exclude


def _expand_files(patterns: list[str]) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        if not pattern.startswith("@"):
            out.append(pattern)
            continue
        path = Path(pattern[1:]).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"cannot read limit file: {exc}", source=str(path), key=pattern
            ) from None
        for line in lines:
            line = line.strip()
            if line and not line.startswith("#"):
                out.extend(split_patterns(line))
    return out


def _matcher(pattern: str) -> re.Pattern[str]:
    try:
        if pattern.startswith("~"):
            return re.compile(pattern[1:])
        return re.compile(fnmatch.translate(pattern))
    except re.error as exc:
        raise InputError(f"invalid host pattern: {exc}", source="--limit", key=pattern) from None


def _subscript(pattern: str) -> tuple[str, tuple[int, int | None] | None]:
    if pattern.startswith("~"):
        return pattern, None
    m = _SUBSCRIPT.match(pattern)
    if not m:
        return pattern, None
    expr, index, start, _colon, end = m.groups()
    if index is not None:
        return expr, (int(index), None)
    return expr, (int(start or 0), int(end) if end else -1)


def _match_one(inventory: Inventory, pattern: str, full: str) -> list[Host]:
    """Hosts matched by one pattern without its ``!``/``&`` prefix; errors name ``full``."""
    if not pattern:
        raise InputError("empty pattern after '!' or '&'", source="--limit", key=full)
    expr, sub = _subscript(pattern)
    if inventory.has_host(expr) and sub is None:
        return [inventory.host(expr)]
    if expr in ("all", "*"):
        hosts = list(inventory.hosts.values())
        matched_name = True
    else:
        regex = _matcher(expr)
        groups = [g for g in inventory.groups if regex.match(g)]
        names: set[str] = set()
        for g in groups:
            names.update(inventory.group_hosts(g))
        matched_name = bool(groups)
        if not groups or expr.startswith("~") or any(c in expr for c in _GLOB_CHARS):
            host_names = [n for n in inventory.hosts if regex.match(n)]
            names.update(host_names)
            matched_name = matched_name or bool(host_names)
        hosts = [inventory.host(n) for n in sorted(names, key=inventory.host_index)]
    if not matched_name:
        raise NoHostsMatched(
            "matches no host or group in the inventory", source="--limit", key=full
        )
    if sub is None:
        return hosts
    start, end = sub
    if end is None:
        if not -len(hosts) <= start < len(hosts):
            raise InputError(
                f"subscript [{start}] is out of range: {len(hosts)} host(s) matched",
                source="--limit",
                key=full,
            )
        return [hosts[start]]
    if end == -1:
        end = len(hosts) - 1
    if start >= len(hosts) or end < start:
        raise InputError(
            f"subscript [{start}:{end}] selects nothing from {len(hosts)} host(s)",
            source="--limit",
            key=full,
        )
    return hosts[start : end + 1]


def select(inventory: Inventory, limit: str | None) -> list[Host]:
    """The hosts a ``--limit`` selects, in order; None or empty-but-absent means all hosts."""
    if limit is None:
        return list(inventory.hosts.values())
    patterns = split_patterns(limit)
    if not patterns:
        raise InputError("empty limit", source="--limit", key=limit)
    patterns = _expand_files(patterns)
    if not patterns:
        raise InputError("limit file lists no patterns", source="--limit", key=limit)
    for pattern in patterns:
        if pattern in ("!", "&"):
            raise InputError("'!' or '&' without a pattern", source="--limit", key=pattern)
    selected: list[Host] = []
    for pattern in _ordered(patterns):
        if pattern[0] == "!":
            gone = {h.name for h in _match_one(inventory, pattern[1:], pattern)}
            selected = [h for h in selected if h.name not in gone]
        elif pattern[0] == "&":
            keep = {h.name for h in _match_one(inventory, pattern[1:], pattern)}
            selected = [h for h in selected if h.name in keep]
        else:
            have = {h.name for h in selected}
            matched = _match_one(inventory, pattern, pattern)
            selected.extend(h for h in matched if h.name not in have)
    if not selected:
        raise NoHostsMatched(
            "no hosts matched: the limit selects no hosts", source="--limit", key=limit
        )
    return selected
