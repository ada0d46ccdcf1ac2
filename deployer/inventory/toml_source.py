"""TOML inventories (``.toml``; Ansible's ``toml`` inventory plugin, ansible-core 2.19.14
lib/ansible/plugins/inventory/toml.py), read with Python's tomllib as that plugin reads them.

Each top-level table is a group with ``hosts`` (a table of host patterns, each a table of its
variables), ``vars`` (a table) and ``children`` (a list of group names; a child named only there is
an empty group)::

    [all.vars]
    region = "eu"

    [gpu]
    children = ["a100"]
    vars = { driver = "580" }

    [gpu.hosts]
    gpu01 = { ansible_host = "10.0.0.1" }

    [a100.hosts.gpu02]
    ansible_port = 2222

Stricter than Ansible (which warns and skips): an unknown key in a group and a group that is not
a table are errors; inventory plugin configuration (``plugin =``) is refused by name. tomllib
keeps no line numbers: an error names the first line that holds the key at fault, where one does.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from deployer.errors import InputError
from deployer.inventory.draft import Draft
from deployer.inventory.model import Origin
from deployer.inventory.names import check_group_name, expand_host_pattern

_GROUP_KEYS = ("hosts", "children", "vars")
_DECODE_LINE = re.compile(r"\(at line (\d+), column \d+\)")


class _Lines:
    """Where a key first appears in the TOML text (tomllib does not say): each name searched for
    from the line of the one before (a group, then its key, then a host's variable)."""

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()

    def of(self, *names: Any) -> int | None:
        found: int | None = None
        start = 0
        for name in names:
            quoted = re.escape(str(name))
            key = rf"(?:{quoted}|\"{quoted}\"|'{quoted}')"
            pattern = re.compile(
                rf"^\s*(?:\[+(?:[^\]]*\.)?)?{key}\s*(?:[=.\]]|$)|[{{,]\s*{key}\s*="
            )
            for index in range(start, len(self._lines)):
                if pattern.search(self._lines[index]):
                    found, start = index + 1, index
                    break
            else:
                break
        return found


def parse_toml(draft: Draft, text: str, path: str) -> None:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where = _DECODE_LINE.search(str(exc))
        raise InputError(
            f"invalid TOML: {_DECODE_LINE.sub('', str(exc)).strip()}",
            source=path,
            line=int(where.group(1)) if where else None,
        ) from None
    lines = _Lines(text)
    if not data:
        raise InputError("empty TOML inventory", source=path)
    if "plugin" in data:
        raise InputError(
            "inventory plugin configuration is not supported; give a static YAML, INI or TOML "
            "inventory",
            source=path,
            line=lines.of("plugin"),
            key="plugin",
        )
    for name, body in data.items():
        _parse_group(draft, name, body, path, lines)


def _parse_group(draft: Draft, name: Any, body: Any, path: str, lines: _Lines) -> str:
    origin: Origin = (path, lines.of(name))
    check_group_name(name, origin)
    if body is not None and not isinstance(body, dict):
        raise InputError(
            f"group {name!r} must be a table with hosts, children or vars, "
            f"got a {type(body).__name__}",
            source=path,
            line=origin[1],
            key=name,
        )
    draft.add_group(name, origin)
    for key, value in (body or {}).items():
        at: Origin = (path, lines.of(name, key))
        if key == "vars":
            if not isinstance(value, dict):
                raise _not_a(f"{name}.vars", "table", value, at)
            for var, var_value in value.items():
                draft.set_group_var(name, var, var_value, (path, lines.of(name, var)))
        elif key == "children":
            if not isinstance(value, list):
                raise _not_a(f"{name}.children", "list of group names", value, at)
            for child in value:
                if not isinstance(child, str):
                    raise _not_a(f"{name}.children", "list of group names", child, at)
                _parse_group(draft, child, {}, path, lines)
                draft.add_child(name, child, at)
        elif key == "hosts":
            if not isinstance(value, dict):
                raise _not_a(f"{name}.hosts", "table", value, at)
            for pattern, host_vars in value.items():
                host_at: Origin = (path, lines.of(name, pattern))
                names, port = expand_host_pattern(pattern, host_at)
                if not isinstance(host_vars, dict):
                    raise _not_a(f"{name}.hosts.{pattern}", "table", host_vars, host_at)

                def var_at(var: Any, host_at: Origin = host_at, pattern: Any = pattern) -> Origin:
                    return (path, lines.of(name, pattern, var) or host_at[1])

                for host in names:
                    draft.add_host(host, name, host_vars, var_at, port, host_at)
        else:
            raise InputError(
                f"unknown key {key!r} in group {name!r} (expected hosts, children, vars)",
                source=path,
                line=at[1],
                key=f"{name}.{key}",
            )
    return name


def _not_a(key: str, kind: str, value: Any, at: Origin) -> InputError:
    return InputError(
        f"{key} must be a {kind}, got a {type(value).__name__}", source=at[0], line=at[1], key=key
    )
