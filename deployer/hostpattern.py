"""``--limit`` host patterns, evaluated as Ansible evaluates them (ansible-core 2.19.14,
lib/ansible/inventory/manager.py: split_host_pattern, order_patterns, _evaluate_patterns,
_enumerate_matches, _apply_subscript; the parity test in tests/parity/ holds us to it).

A limit is a list of patterns separated by ``,``; with no comma, by ``:`` (which Ansible keeps for
compatibility), unless the whole limit is one address: an IPv6 address such as
``fe80::1610:9fff:fedd:654b`` is one pattern, and brackets such as ``gpu[0:1]`` are not split.
Each pattern is one of:

- ``all`` or ``*``: every host;
- a host name or group name (a group means all hosts in it and its descendants);
- a shell glob (``gpu*``, ``prom0?``, ``rack[ab]-*``) matched against group names and host names;
- a regex after ``~`` (``~gpu0[1-3]``), matched from the start of the name;
- any of those but a regex with a subscript picking from its hosts in the group's order
  (deployer/inventory/order.py, not the order the file first named them): ``gpu[0]``,
  ``gpu[-1]``, ``gpu[0:1]`` (inclusive), ``gpu[2:]``;
- ``@file``: the patterns listed in a file, one per line.

A leading ``&`` intersects and ``!`` excludes. Regular patterns are applied first (a union, in the
order given), then every ``&``, then every ``!``, whatever order they were written in; with only
``&``/``!`` patterns the base is ``all``. A name that is both a host and a group means the host.
:func:`select` gives a pattern's hosts in Ansible's evaluation order (a play's ``hosts:``);
:func:`select_limit` gives what ``--limit`` leaves of ``all``, in ``all``'s order.

Stricter than Ansible (which warns and goes on): a pattern that matches no group and no host, a
bad regex, a subscript out of range or selecting nothing, the removed ``[x-y]`` subscript, or a
limit selecting no host at all is an InputError naming the pattern.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.errors import InputError

if TYPE_CHECKING:
    from deployer.inventory import Host, Inventory

_COLON_SPLIT = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
# Ansible's PATTERN_WITH_SUBSCRIPT (lib/ansible/inventory/manager.py): an index, or a range
# whose start is given; "[x-y]" is the old range syntax that Ansible only warns about.
_SUBSCRIPT = re.compile(
    r"""^
        (.+)                        # the pattern, followed by
        \[(?:
            (-?[0-9]+)              # a single index
            |([0-9]+)([:-])([0-9]*) # or an inclusive start:end range
        )\]
    $""",
    re.X,
)
_GLOB_CHARS = (".", "?", "*", "[")

# A single address as Ansible's parse_address(allow_ranges=True) reads one (lib/ansible/parsing/
# utils/addresses.py): a limit without a comma that is one is not split on its colons.
_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.I)
_BRACKETED_PORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")


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


def _is_one_address(text: str) -> bool:
    """Ansible's test before splitting on ':': a host name, IPv4 or IPv6 address (ranges allowed
    in names), with or without a port."""
    for form in (_BRACKETED_PORT, _HOST_PORT):
        m = form.match(text)
        if m:
            text = m.group(1)
            break
    if _HOSTNAME.match(text):
        return True
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def split_patterns(limit: str) -> list[str]:
    """Split a limit into single patterns as Ansible does: on commas; else, unless the whole
    limit is one address (an IPv6 address is not split on its colons), on colons outside
    brackets. A colon-separated limit whose brackets do not pair up is an InputError.
    """
    if "," in limit:
        parts = limit.split(",")
    elif _is_one_address(limit.strip()):
        parts = [limit]
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


def _subscript(pattern: str, full: str) -> tuple[str, tuple[int, int | None] | None]:
    if pattern.startswith("~"):  # a regex keeps its brackets, as in Ansible
        return pattern, None
    m = _SUBSCRIPT.match(pattern)
    if not m:
        return pattern, None
    expr, index, start, separator, end = m.groups()
    if index is not None:
        return expr, (int(index), None)
    if separator == "-":
        raise InputError(
            f"subscript [{start}-{end}]: write [{start}:{end}] (inclusive; Ansible removed "
            "the [x-y] form)",
            source="--limit",
            key=full,
        )
    return expr, (int(start), int(end) if end else -1)


def _enumerate(inventory: Inventory, expr: str) -> tuple[list[str], bool]:
    """Ansible's _enumerate_matches: the hosts of every group the expression matches (each in
    its group's order, groups in the inventory's order), then, when no group matched or the
    expression is a glob or regex, every host it matches; repeats kept, as a subscript picks
    from this list. And whether it matched a name at all (an empty group is a match)."""
    regex = _matcher(expr)
    groups = [g for g in inventory.groups if regex.match(g)]
    names = [h for g in groups for h in inventory.group_hosts(g)]
    if not groups or expr.startswith("~") or any(c in expr for c in _GLOB_CHARS):
        names.extend(n for n in inventory.hosts if regex.match(n))
    return names, bool(groups or names)


def _match_one(inventory: Inventory, pattern: str, full: str) -> list[str]:
    """Host names matched by one pattern without its ``!``/``&`` prefix; errors name ``full``."""
    if not pattern:
        raise InputError("empty pattern after '!' or '&'", source="--limit", key=full)
    if inventory.has_host(pattern):
        return [pattern]
    expr, sub = _subscript(pattern, full)
    names, matched = _enumerate(inventory, expr)
    if not matched:
        raise NoHostsMatched(
            "matches no host or group in the inventory", source="--limit", key=full
        )
    if sub is None or not names:
        return names
    # Ansible's _apply_subscript: [i] one host; [a:b] a to b inclusive; [a:] from a on.
    start, end = sub
    if end is None or end == 0:
        if not -len(names) <= start < len(names):
            raise InputError(
                f"subscript [{start}] is out of range: {len(names)} host(s) matched",
                source="--limit",
                key=full,
            )
        return [names[start]]
    if end == -1:
        end = len(names) - 1
    picked = names[start : end + 1]
    if not picked:
        raise InputError(
            f"subscript [{start}:{end}] selects nothing from {len(names)} host(s)",
            source="--limit",
            key=full,
        )
    return picked


def select(inventory: Inventory, pattern: str | None, *, play: bool = False) -> list[Host]:
    """The hosts a pattern selects, in the order Ansible evaluates it (``ansible PATTERN
    --list-hosts``); None means every host, in the order of group ``all``.

    ``play``: the pattern is a play's ``hosts:``, where, as in ansible-playbook, a part that
    names no group and no host of this inventory matches nothing (Ansible warns "Could not match
    supplied host pattern, ignoring") and the others still apply: the product's site names
    groups an inventory may lack (``thanos_query``, ``metrics_store``, ``grafana``)."""
    if pattern is None:
        return [inventory.host(n) for n in inventory.group_hosts("all")]
    patterns = split_patterns(pattern)
    if not patterns:
        raise InputError("empty limit", source="--limit", key=pattern)
    patterns = _expand_files(patterns)
    if not patterns:
        raise InputError("limit file lists no patterns", source="--limit", key=pattern)
    for one in patterns:
        if one in ("!", "&"):
            raise InputError("'!' or '&' without a pattern", source="--limit", key=one)
    selected: dict[str, None] = {}

    def match(part: str, full: str) -> list[str]:
        try:
            return _match_one(inventory, part, full)
        except NoHostsMatched:
            if play:
                return []
            raise

    for one in _ordered(patterns):
        if one[0] == "!":
            gone = set(match(one[1:], one))
            selected = {n: None for n in selected if n not in gone}
        elif one[0] == "&":
            keep = set(match(one[1:], one))
            selected = {n: None for n in selected if n in keep}
        else:
            for name in match(one, one):
                selected.setdefault(name, None)
    if not selected and not play:
        raise NoHostsMatched(
            "no hosts matched: the limit selects no hosts", source="--limit", key=pattern
        )
    return [inventory.host(n) for n in selected]


def select_limit(inventory: Inventory, limit: str | None) -> list[Host]:
    """The hosts ``--limit`` leaves, in the order of group ``all`` (what ``ansible all --limit
    PAT --list-hosts`` and ``ansible-inventory --list --limit PAT`` show)."""
    if limit is None:
        return select(inventory, None)
    chosen = {h.name for h in select(inventory, limit)}
    return [inventory.host(n) for n in inventory.group_hosts("all") if n in chosen]
