"""Ansible-compatible inventories: YAML and INI files, group_vars/ and host_vars/, extra vars, and
each host's resolved variables and SSH connection settings. Pure data: nothing here connects.

Sources. ``-i`` names a file or a directory. A directory is read like Ansible reads one: every file
in it, recursively and sorted by name, except hidden files, ``group_vars/``, ``host_vars/`` and
files ending ``.orig .cfg .retry .pyc .pyo .swp .bak ~ .rpm .md .txt .rst``. A file ending
``.yml``/``.yaml``/``.json`` is a YAML inventory, ``.ini`` (or any other extension) an INI one; a
file without an extension is INI when it has a ``[section]`` line, else YAML. ``group_vars/`` and
``host_vars/`` are read beside the inventory (the directory given, or the file's directory); each
entry is ``<name>``, ``<name>.yml``, ``<name>.yaml`` or ``<name>.json``, a file or a directory of
such files (read recursively in name order, later files overriding earlier ones).

Groups. ``all`` contains every group and host; ``ungrouped`` holds the hosts in no other group.
``children`` nest groups (a cycle is an error). Host names may carry ranges: ``gpu[01:04]``
(zero-padded like the bounds), ``node[a:c]``, ``gpu[01:08:2]`` (step); ``name:port`` sets
``ansible_port``. INI values are typed as Ansible types them: Python literals (``8``, ``True``,
``[1, 2]``) become ints, bools, lists; anything else (``yes``, ``true``, ``H100``) stays a string.

Variable precedence, lowest first (Ansible's default order, which is why every inventory-file group
variable sits below every group_vars/ file)::

    1. role defaults                      (only in resolve_vars)
    2. inventory file: vars of group all
    3. inventory file: vars of the host's other groups, parents before children
    4. group_vars/all
    5. group_vars/<group> for the host's other groups, parents before children
    6. inventory file: the host's own variables
    7. host_vars/<host>
    8. extra vars (-e), in the order given

"Parents before children" is Ansible's sort: by depth below ``all`` (longest path), then
``ansible_group_priority`` (an int, default 1, set in an inventory file), then group name; so of two
sibling groups the one later in the alphabet wins. A later layer replaces a variable whole; mappings
are not merged. Magic variables (``inventory_hostname``, ``inventory_hostname_short``,
``group_names``, ``groups``, ``hostvars``) are provided on top and cannot be set in an inventory.

Where this is stricter than Ansible (which warns and carries on), it refuses with an InputError:
an unknown key in a YAML group, a group that is not a mapping, a variable name that is not an
identifier, both ``group_vars/x`` and ``group_vars/x.yml`` present (Ansible silently reads only
one), an empty or reversed host range, and a vault-encrypted file. A host and a group sharing a
name, and group_vars/host_vars entries naming no group or host, are reported in
``Inventory.warnings``.
"""

from __future__ import annotations

import ast
import functools
import getpass
import ipaddress
import json
import keyword
import os
import re
import shlex
import string
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jinja2

from deployer.errors import InputError
from deployer.memory import collector_paused
from deployer.secrets import (
    MASK,
    REGISTERED,
    SecretValues,
    is_secret_key,
    mask,
    secret_values_in,
)
from deployer.yamlsrc import SourceDict, load_yaml_text

__all__ = [
    "ConnectionSpec",
    "Group",
    "Host",
    "Inventory",
    "expand_host_range",
    "load_inventory",
    "parse_extra_vars",
]

YAML_EXTENSIONS = (".yml", ".yaml", ".json")
IGNORED_EXTENSIONS = (".orig", ".cfg", ".retry", ".pyc", ".pyo", ".swp", ".bak", "~", ".rpm")
IGNORED_EXTENSIONS += (".md", ".txt", ".rst")
IGNORED_NAMES = frozenset({"group_vars", "host_vars", "vars_plugins"})
MAGIC_VARS = frozenset(
    {"inventory_hostname", "inventory_hostname_short", "group_names", "groups", "hostvars"}
)
HOST_KEY_POLICIES = ("verify", "accept-new")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

_GROUP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]*[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")
_INI_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_INI_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:[#;].*)?$")
_ANSIBLE_TRUE = frozenset({"y", "yes", "on", "1", "true", "t"})
_ANSIBLE_FALSE = frozenset({"n", "no", "off", "0", "false", "f"})

# Where a value came from: (file or "-e", line or None).
Origin = tuple[str, int | None]


def _fmt_origin(origin: Origin) -> str:
    source, line = origin
    return f"{source}:{line}" if line is not None else source


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class ConnectionSpec:
    """How to reach one host over SSH, from its Ansible connection variables."""

    name: str
    address: str
    port: int
    user: str
    private_key_file: str | None
    become: bool
    become_user: str
    known_hosts_file: str
    host_key_policy: str


@dataclass
class Group:
    """One inventory group. ``hosts`` and ``children`` are direct members, in declaration order."""

    name: str
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    inventory_vars: dict[str, Any] = field(default_factory=dict)
    file_vars: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    priority: int = 1
    defined_at: Origin | None = None
    inventory_var_origins: dict[str, Origin] = field(default_factory=dict)
    file_var_origins: dict[str, Origin] = field(default_factory=dict)

    @property
    def vars(self) -> dict[str, Any]:
        """The group's own variables: inventory file, overridden by group_vars/."""
        return {**self.inventory_vars, **self.file_vars}


@dataclass(frozen=True)
class Host:
    """One host with its resolved variables (without role defaults) and connection settings.

    ``groups`` lists every group the host is in (ancestors included) in merge order, ``all``
    first. ``origins`` says where each variable's winning value came from (``file:line``).
    """

    name: str
    groups: tuple[str, ...]
    vars: Mapping[str, Any]
    connection: ConnectionSpec
    origins: Mapping[str, str]

    @property
    def group_names(self) -> list[str]:
        """Ansible's ``group_names``: the host's groups except ``all``, sorted."""
        return sorted(g for g in self.groups if g != "all")


class Inventory:
    """A loaded, validated inventory. Build it with :func:`load_inventory`."""

    def __init__(
        self,
        sources: list[str],
        groups: dict[str, Group],
        hosts: list[Host],
        extra_vars: dict[str, Any],
        secrets: SecretValues,
        warnings_: list[str],
    ) -> None:
        self.sources = sources
        self.groups = groups
        self.hosts: dict[str, Host] = {h.name: h for h in hosts}
        self.extra_vars = extra_vars
        self.secrets = secrets
        self.warnings = warnings_
        self._index = {h.name: i for i, h in enumerate(hosts)}
        self._members: dict[str, list[str]] = {}
        for name in groups:
            self._members[name] = self._collect_members(name)
        self._hostvars = MappingProxyType({h.name: h.vars for h in hosts})
        self._groups_view = GroupMembers(self._members)
        self._scanned: dict[int, Mapping[str, Any]] = {}

    def _collect_members(self, name: str) -> list[str]:
        seen: set[str] = set()
        stack = [name]
        visited: set[str] = set()
        while stack:
            g = stack.pop()
            if g in visited:
                continue
            visited.add(g)
            seen.update(self.groups[g].hosts)
            stack.extend(self.groups[g].children)
        return sorted(seen, key=self._index.__getitem__)

    # -- lookups

    def host(self, name: str) -> Host:
        """The host called ``name``; an InputError naming it when there is none."""
        try:
            return self.hosts[name]
        except KeyError:
            raise InputError("no such host in the inventory", key=name) from None

    def has_host(self, name: str) -> bool:
        return name in self.hosts

    def group_hosts(self, name: str) -> list[str]:
        """Names of every host in group ``name`` or its descendants, in inventory order."""
        if name not in self.groups:
            raise InputError("no such group in the inventory", key=name)
        return list(self._members[name])

    def connection(self, host: Host | str) -> ConnectionSpec:
        """How to reach ``host`` (validated when the inventory was loaded)."""
        return (host if isinstance(host, Host) else self.host(host)).connection

    def host_index(self, name: str) -> int:
        return self._index[name]

    # -- variables

    def magic_vars(self, host: Host | str) -> dict[str, Any]:
        """Ansible's magic variables: inventory_hostname(_short), group_names, groups, hostvars."""
        h = host if isinstance(host, Host) else self.host(host)
        return {
            "inventory_hostname": h.name,
            "inventory_hostname_short": h.name.split(".")[0],
            "group_names": h.group_names,
            "groups": self._groups_view,
            "hostvars": self._hostvars,
        }

    def resolve_vars(
        self, host: Host | str, role_defaults: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The variables a task on ``host`` sees: role defaults < inventory layers < extra vars,
        with the magic variables on top, as a new dict the caller may change. Secret role
        defaults are registered for masking."""
        h = host if isinstance(host, Host) else self.host(host)
        defaults = dict(role_defaults or {})
        # One defaults mapping serves every host of a play: scan it for secrets once (scanning
        # it per host was most of the time of resolving 100,000 hosts' variables).
        if role_defaults is not None and self._scanned.get(id(role_defaults)) is not role_defaults:
            for value in secret_values_in(defaults):
                self.secrets.add(value)
            self._scanned[id(role_defaults)] = role_defaults
        return {**defaults, **h.vars, **self.magic_vars(h)}

    # -- display

    def to_dict(self, host: str | None = None, mask_secrets: bool = True) -> dict[str, Any]:
        """JSON-ready view for ``gpumon-deploy inventory``.

        Without ``host``: ``{"hosts": {name: {...}}, "groups": {name: {"children", "hosts",
        "vars"}}}`` with hosts in inventory order. With ``host``: that host's entry alone,
        ``{"name", "groups", "connection", "vars"}``. Secrets are masked unless told otherwise.
        """

        def shown(value: Any) -> Any:
            value = _jsonable(value)
            return mask(value) if mask_secrets else value

        def host_entry(h: Host) -> dict[str, Any]:
            return {
                "name": h.name,
                "groups": h.group_names,
                "connection": asdict(h.connection),
                "vars": shown(dict(h.vars)),
            }

        if host is not None:
            return host_entry(self.host(host))
        return {
            "hosts": {h.name: host_entry(h) for h in self.hosts.values()},
            "groups": {
                g.name: {
                    "children": list(g.children),
                    "hosts": list(g.hosts),
                    "vars": shown(g.vars),
                }
                for g in self.groups.values()
            },
        }


class GroupMembers(Mapping[str, list[str]]):
    """The ``groups`` magic variable: group name -> member host names, in inventory order.

    Built once per inventory and shared by every host's variables (a copy per host made
    resolving N hosts' variables cost N^2); each lookup returns a fresh list, so a caller that
    changes what it got changes nothing else.
    """

    def __init__(self, members: Mapping[str, list[str]]) -> None:
        self._members = members

    def __getitem__(self, name: str) -> list[str]:
        return list(self._members[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __repr__(self) -> str:
        return f"GroupMembers({dict(self)!r})"


def _secrets_in(values: Mapping[str, Any]) -> list[Any]:
    """``secret_values_in(values)``, without scanning when no key names a secret and no value
    nests more keys (a host's ``ansible_host`` line); ``is_secret_key`` remembers each name's
    verdict, so the names recurring on every host are judged once."""
    for key, value in values.items():
        if (
            isinstance(value, Mapping | list | tuple)
            or not isinstance(key, str)
            or is_secret_key(key)
        ):
            return secret_values_in(values)
    return []


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# --------------------------------------------------------------------------- names and ranges


def _is_identifier(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and name.isascii()
        and not keyword.iskeyword(name)
        and name not in ("True", "False", "None")
    )


def _check_var_name(name: Any, origin: Origin) -> str:
    if not _is_identifier(name):
        raise InputError(
            f"invalid variable name {name!r}: use letters, digits and underscores, "
            "not starting with a digit",
            source=origin[0],
            line=origin[1],
            key=str(name),
        )
    if name in MAGIC_VARS:
        raise InputError(
            f"{name!r} is a magic variable set by the tool and cannot be defined",
            source=origin[0],
            line=origin[1],
            key=name,
        )
    return name


def _check_group_name(name: Any, origin: Origin) -> str:
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        raise InputError(
            f"invalid group name {name!r}: use letters, digits, '_', '-' and '.'",
            source=origin[0],
            line=origin[1],
            key=str(name),
        )
    return name


def expand_host_range(pattern: str) -> list[str]:
    """Expand Ansible host ranges: ``gpu[01:04]``, ``n[a:c]``, ``gpu[1:9:2]-ib[0:1]``.

    Raises ValueError with the reason for a malformed range.
    """
    if "[" not in pattern and "]" not in pattern:
        return [pattern]
    start = pattern.find("[")
    end = pattern.find("]", start + 1)
    if start < 0 or end < 0:
        raise ValueError(f"unbalanced brackets in host range {pattern!r}")
    head, body, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError(f"host range [{body}] must be [begin:end] or [begin:end:step]")
    beg, stop = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not stop:
        raise ValueError(f"host range [{body}] has no end")
    try:
        step = int(step_text)
    except ValueError:
        raise ValueError(f"host range [{body}] has a step that is not an integer") from None
    if step < 1:
        raise ValueError(f"host range [{body}] must have a step of 1 or more")
    items: list[str]
    if beg in string.ascii_letters and stop in string.ascii_letters:
        i_beg, i_end = string.ascii_letters.index(beg), string.ascii_letters.index(stop)
        if i_beg > i_end:
            raise ValueError(f"host range [{body}] has begin after end")
        items = list(string.ascii_letters[i_beg : i_end + 1 : step])
    elif beg.isdigit() and stop.isdigit():
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if width and len(stop) != width:
            raise ValueError(f"host range [{body}] must give begin and end with the same width")
        if int(beg) > int(stop):
            raise ValueError(f"host range [{body}] has begin after end")
        items = [str(i).zfill(width) for i in range(int(beg), int(stop) + 1, step)]
    else:
        raise ValueError(f"host range [{body}] must be numbers or single letters")
    result: list[str] = []
    for item in items:
        result.extend(expand_host_range(f"{head}{item}{tail}"))
    return result


def _split_port(pattern: str) -> tuple[str, int | None]:
    """``name:port`` -> (name, port); ranges' colons and IPv6 addresses are left alone."""
    if pattern.startswith("[") and "]" in pattern:
        inner, _, rest = pattern[1:].partition("]")
        if ":" in inner and _is_ipv6(inner):
            if not rest:
                return inner, None
            if rest.startswith(":") and rest[1:].isdigit():
                return inner, int(rest[1:])
            raise ValueError(f"invalid port in {pattern!r}")
    if _is_ipv6(pattern):
        return pattern, None
    depth = 0
    colon = -1
    for i, ch in enumerate(pattern):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == ":" and depth == 0:
            if colon >= 0:
                raise ValueError(f"invalid host {pattern!r}: more than one ':'")
            colon = i
    if colon < 0:
        return pattern, None
    name, port = pattern[:colon], pattern[colon + 1 :]
    if not port:
        raise ValueError(f"invalid host {pattern!r}: ':' must be followed by a port")
    if not port.isdigit():
        raise ValueError(f"invalid port {port!r} in {pattern!r}")
    return name, int(port)


def _is_ipv6(text: str) -> bool:
    if ":" not in text:  # every IPv6 address has one; skips a parse per plain host name
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _expand_host_pattern(pattern: Any, origin: Origin) -> tuple[list[str], int | None]:
    if not isinstance(pattern, str):
        raise InputError(
            f"host name {pattern!r} must be a string (quote numbers)",
            source=origin[0],
            line=origin[1],
            key=str(pattern),
        )
    try:
        name, port = _split_port(pattern.strip())
        names = expand_host_range(name)
    except ValueError as exc:
        raise InputError(str(exc), source=origin[0], line=origin[1], key=pattern) from None
    if port is not None and not 1 <= port <= 65535:
        raise InputError(
            f"port {port} out of range 1-65535", source=origin[0], line=origin[1], key=pattern
        )
    for host in names:
        if not (_HOST_NAME.match(host) or _is_ipv6(host)):
            raise InputError(
                f"invalid host name {host!r}", source=origin[0], line=origin[1], key=pattern
            )
    return names, port


# --------------------------------------------------------------------------- building


@dataclass
class _DraftHost:
    name: str
    defined_at: Origin
    groups: list[str] = field(default_factory=list)
    inline_vars: dict[str, Any] = field(default_factory=dict)
    inline_origins: dict[str, Origin] = field(default_factory=dict)
    file_vars: dict[str, Any] = field(default_factory=dict)
    file_origins: dict[str, Origin] = field(default_factory=dict)


class _Draft:
    """Groups and hosts while sources are being read, before reconciliation."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {
            "all": Group("all", children=["ungrouped"]),
            "ungrouped": Group("ungrouped", parents=["all"]),
        }
        self.hosts: dict[str, _DraftHost] = {}
        self.priority_origin: dict[str, Origin] = {}
        self.checked_names: set[str] = set()

    def add_group(self, name: str, origin: Origin) -> Group:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name, defined_at=origin)
        return group

    def add_child(self, parent: str, child: str, origin: Origin) -> None:
        if child == "all":
            raise InputError(
                "group 'all' cannot be a child of another group",
                source=origin[0],
                line=origin[1],
                key=f"{parent}.children.all",
            )
        path = self._path_down(child, parent)
        if path is not None:
            cycle = " -> ".join([parent, *path])
            raise InputError(
                f"children form a cycle: {cycle}",
                source=origin[0],
                line=origin[1],
                key=f"{parent}.children.{child}",
            )
        p, c = self.groups[parent], self.groups[child]
        if child not in p.children:
            p.children.append(child)
        if parent not in c.parents:
            c.parents.append(parent)

    def _path_down(self, start: str, target: str) -> list[str] | None:
        """Group names from ``start`` down to ``target`` through children, if reachable."""
        if start == target:
            return [start]
        for kid in self.groups[start].children:
            rest = self._path_down(kid, target)
            if rest is not None:
                return [start, *rest]
        return None

    def set_group_var(self, group: str, key: Any, value: Any, origin: Origin) -> None:
        _check_var_name(key, origin)
        g = self.groups[group]
        if key == "ansible_group_priority":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(
                    "ansible_group_priority must be an integer",
                    source=origin[0],
                    line=origin[1],
                    key=key,
                )
            g.priority = value
        g.inventory_vars[key] = value
        g.inventory_var_origins[key] = origin

    def add_host(
        self,
        name: str,
        group: str,
        variables: Mapping[Any, Any],
        var_origin: Any,
        port: int | None,
        origin: Origin,
    ) -> None:
        host = self.hosts.get(name)
        if host is None:
            host = self.hosts[name] = _DraftHost(name, origin)
        if group not in host.groups:
            host.groups.append(group)
        g = self.groups[group]
        if name not in g.hosts:
            g.hosts.append(name)
        if port is not None:
            host.inline_vars["ansible_port"] = port
            host.inline_origins["ansible_port"] = origin
        for key, value in variables.items():
            where = var_origin(key)
            if key not in self.checked_names:  # the same few names recur on every host
                self.checked_names.add(_check_var_name(key, where))
            host.inline_vars[key] = value
            host.inline_origins[key] = where


# --------------------------------------------------------------------------- YAML


def _first_content_line(text: str) -> int | None:
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped != "---":
            return number
    return None


def _parse_yaml(draft: _Draft, data: Any, path: str, text: str) -> None:
    if data is None:
        raise InputError("empty YAML inventory", source=path)
    if not isinstance(data, SourceDict):
        raise InputError(
            f"a YAML inventory is a mapping of group names, got a {type(data).__name__}",
            source=path,
            line=_first_content_line(text),
        )
    if "plugin" in data:
        raise InputError(
            "inventory plugin configuration is not supported; give a static YAML or INI inventory",
            source=path,
            line=data.line_of("plugin"),
            key="plugin",
        )
    for name, body in data.items():
        _parse_yaml_group(draft, name, body, data, name)


_YAML_GROUP_KEYS = ("hosts", "children", "vars")


def _parse_yaml_group(
    draft: _Draft, name: Any, body: Any, container: SourceDict, path_key: str
) -> str:
    origin: Origin = (container.source, container.line_of(name))
    _check_group_name(name, origin)
    if body is not None and not isinstance(body, SourceDict):
        raise InputError(
            f"group {name!r} must be a mapping with hosts, children or vars, "
            f"got a {type(body).__name__}",
            source=origin[0],
            line=origin[1],
            key=str(path_key),
        )
    draft.add_group(name, origin)
    if body is None:
        return name
    for key in body:
        if key not in _YAML_GROUP_KEYS:
            raise InputError(
                f"unknown key {key!r} in group {name!r} (expected hosts, children, vars)",
                source=body.source,
                line=body.line_of(key),
                key=f"{path_key}.{key}",
            )
    for section in _YAML_GROUP_KEYS:
        if section not in body:
            continue
        value = body[section]
        line = body.line_of(section)
        if value is None:
            continue
        if isinstance(value, str):
            # Ansible accepts "hosts: gpu01" for a single member.
            single = SourceDict({value: None})
            single.source, single.line = body.source, line
            value = single
        if not isinstance(value, SourceDict):
            raise InputError(
                f"'{section}' of group {name!r} must be a mapping, got a {type(value).__name__}",
                source=body.source,
                line=line,
                key=f"{path_key}.{section}",
            )
        if section == "vars":
            for var, var_value in value.items():
                draft.set_group_var(name, var, var_value, (value.source, value.line_of(var)))
        elif section == "children":
            for child, child_body in value.items():
                child_name = _parse_yaml_group(
                    draft, child, child_body, value, f"{path_key}.children.{child}"
                )
                draft.add_child(name, child_name, (value.source, value.line_of(child)))
        else:
            for pattern, host_vars in value.items():
                at: Origin = (value.source, value.line_of(pattern))
                names, port = _expand_host_pattern(pattern, at)
                if host_vars is None:
                    host_vars = SourceDict()
                if not isinstance(host_vars, SourceDict):
                    raise InputError(
                        f"variables of host {pattern!r} must be a mapping, "
                        f"got a {type(host_vars).__name__}",
                        source=at[0],
                        line=at[1],
                        key=f"{path_key}.hosts.{pattern}",
                    )

                def var_at(key: Any, hv: SourceDict = host_vars, at: Origin = at) -> Origin:
                    return (hv.source if hv.key_lines else at[0], hv.key_lines.get(key, at[1]))

                for host in names:
                    draft.add_host(host, name, host_vars, var_at, port, at)
    return name


# --------------------------------------------------------------------------- INI


def _ini_value(text: str) -> Any:
    """Type an INI value as Ansible does: a Python literal if it is one, else the string."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _ini_coerce(value)


def _ini_coerce(value: Any) -> Any:
    if isinstance(value, list | tuple | set | frozenset):
        return [_ini_coerce(v) for v in value]
    if isinstance(value, dict):
        return {_ini_coerce(k): _ini_coerce(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _parse_ini(draft: _Draft, text: str, path: str) -> None:
    group, state = "ungrouped", "hosts"
    # Groups referenced before being declared: name -> (state, origin, [(parent, origin)]).
    pending: dict[str, tuple[str, Origin, list[tuple[str, Origin]]]] = {}

    def declare(name: str) -> None:
        entry = pending.pop(name, None)
        if entry and entry[0] == "children":
            for parent, at in entry[2]:
                draft.add_child(parent, name, at)

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        at: Origin = (path, number)
        if not line or line[0] in "#;":
            continue
        section = _INI_SECTION.match(line)
        if section:
            group, kind = section.group(1), section.group(2) or "hosts"
            _check_group_name(group, at)
            if kind not in ("hosts", "children", "vars"):
                raise InputError(
                    f"section [{group}:{kind}] has unknown type {kind!r} "
                    "(expected [group], [group:vars] or [group:children])",
                    source=path,
                    line=number,
                )
            state = kind
            if group not in draft.groups:
                if kind == "vars" and group not in pending:
                    pending[group] = ("vars", at, [])
                draft.add_group(group, at)
            if group in pending and kind != "vars":
                declare(group)
            continue
        if line.startswith("[") and line.endswith("]"):
            raise InputError(
                f"invalid section header {line!r}: no spaces, one ':' and a type at most",
                source=path,
                line=number,
            )
        if state == "hosts":
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as exc:
                raise InputError(
                    f"cannot parse host line: {exc}", source=path, line=number
                ) from None
            if tokens and tokens[0] == "---":
                raise InputError(
                    "'---' in an INI inventory: is this a YAML file without .yml?",
                    source=path,
                    line=number,
                )
            names, port = _expand_host_pattern(tokens[0], at)
            variables: dict[str, Any] = {}
            key = ""
            for token in tokens[1:]:
                after = key
                key, sep, value = token.partition("=")
                if not sep:
                    # After a secret, a stray word is the rest of it (an unquoted space).
                    secret = is_secret_key(after)
                    shown = MASK if secret else token
                    raise InputError(
                        f"expected key=value host variable, got {shown!r}"
                        + (
                            f" after the value of {after} (quote a value with spaces)"
                            if after
                            else ""
                        ),
                        source=path,
                        line=number,
                        key=after if secret else token,
                    )
                variables[key] = _ini_value(value)
            for host in names:
                draft.add_host(host, group, variables, lambda _k, at=at: at, port, at)
        elif state == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise InputError(
                    f"expected key=value in [{group}:vars], got {line!r}", source=path, line=number
                )
            draft.set_group_var(group, key.strip(), _ini_value(value.strip()), at)
        else:
            match = _INI_GROUP_NAME.match(line)
            if not match:
                raise InputError(
                    f"expected a group name in [{group}:children], got {line!r}",
                    source=path,
                    line=number,
                )
            child = _check_group_name(match.group(1), at)
            if child in draft.groups:
                draft.add_child(group, child, at)
            elif child in pending:
                pending[child][2].append((group, at))
            else:
                pending[child] = ("children", at, [(group, at)])

    for name, (kind, at, parents) in pending.items():
        if kind == "vars":
            raise InputError(
                f"section [{name}:vars] is for a group that is never declared "
                f"(add a [{name}] or [{name}:children] section)",
                source=at[0],
                line=at[1],
                key=name,
            )
        parent, parent_at = parents[-1]
        raise InputError(
            f"[{parent}:children] names group {name!r}, which is never declared",
            source=parent_at[0],
            line=parent_at[1],
            key=name,
        )


# --------------------------------------------------------------------------- sources


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from None


def _refuse_vault(text: str, path: Path) -> None:
    if text.lstrip().startswith("$ANSIBLE_VAULT;"):
        raise InputError(
            "vault-encrypted files are not supported; pass secrets with -e @file from a "
            "secret store, readable only by you (mode 0600)",
            source=str(path),
            line=1,
        )


def _looks_like_yaml(text: str) -> bool:
    return any(
        re.match(r"^\s*[^#;\s][^=]*:(\s|$)", line) for line in text.splitlines()
    ) and not any(_INI_SECTION.match(line.strip()) for line in text.splitlines())


def _parse_file(draft: _Draft, path: Path) -> None:
    text = _read_text(path)
    _refuse_vault(text, path)
    source = str(path)
    ext = path.suffix.lower()
    if ext in YAML_EXTENSIONS:
        _parse_yaml(draft, load_yaml_text(text, source), source, text)
        return
    if ext == "" and _looks_like_yaml(text):
        _parse_yaml(draft, load_yaml_text(text, source), source, text)
        return
    _parse_ini(draft, text, source)


def _inventory_files(root: Path) -> list[Path]:
    found: list[Path] = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise InputError(f"cannot read directory: {exc}", source=str(root)) from None
    for entry in entries:
        if entry.name.startswith(".") or entry.name in IGNORED_NAMES:
            continue
        if entry.is_dir():
            found.extend(_inventory_files(entry))
        elif not entry.name.endswith(IGNORED_EXTENSIONS):
            found.append(entry)
    return found


# --------------------------------------------------------------------------- group_vars, host_vars


def _vars_file_paths(base: Path, name: str) -> list[Path]:
    """The files holding ``name``'s variables in ``base`` (group_vars/ or host_vars/)."""
    candidates = [base / name] + [base / f"{name}{ext}" for ext in YAML_EXTENSIONS]
    existing = [p for p in candidates if p.exists()]
    if len(existing) > 1:
        listed = ", ".join(str(p) for p in existing)
        raise InputError(
            f"variables for {name!r} are defined more than once ({listed}); keep one",
            source=str(existing[0]),
            key=name,
        )
    if not existing:
        return []
    if existing[0].is_dir():
        return _vars_dir_files(existing[0])
    return [existing[0]]


def _vars_dir_files(directory: Path) -> list[Path]:
    files: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            files.extend(_vars_dir_files(entry))
        elif entry.is_file() and (not entry.suffix or entry.suffix in YAML_EXTENSIONS):
            files.append(entry)
    return files


def _load_vars_file(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    text = _read_text(path)
    _refuse_vault(text, path)
    data = load_yaml_text(text, str(path))
    if data is None:
        return {}, {}
    if not isinstance(data, SourceDict):
        raise InputError(
            f"a variables file is a mapping of variable names, got a {type(data).__name__}",
            source=str(path),
            line=_first_content_line(text),
        )
    origins: dict[str, Origin] = {}
    for key in data:
        origins[key] = (str(path), data.line_of(key))
        _check_var_name(key, origins[key])
    return dict(data), origins


def _load_entity_vars(base: Path, name: str) -> tuple[dict[str, Any], dict[str, Origin]]:
    merged: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    for path in _vars_file_paths(base, name):
        values, where = _load_vars_file(path)
        merged.update(values)
        origins.update(where)
    return merged, origins


def _entity_names(base: Path) -> list[str]:
    """Names that entries of group_vars/ or host_vars/ are for."""
    names = []
    for entry in sorted(base.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        name = entry.name
        if entry.is_file() and entry.suffix in YAML_EXTENSIONS:
            name = entry.name[: -len(entry.suffix)]
        names.append(name)
    return names


# --------------------------------------------------------------------------- connection


def _as_bool(value: Any, key: str, origin: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _ANSIBLE_TRUE | _ANSIBLE_FALSE:
        return value.strip().lower() in _ANSIBLE_TRUE
    raise _var_error(f"must be a boolean (true/false, yes/no), got {value!r}", key, origin)


def _var_error(message: str, key: str, origin: str | None) -> InputError:
    source, line = None, None
    if origin:
        source, _, tail = origin.rpartition(":")
        if source and tail.isdigit():
            line = int(tail)
        else:
            source = origin
    return InputError(message, source=source, line=line, key=key)


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


def _connection_spec(
    name: str,
    variables: Mapping[str, Any],
    origins: Mapping[str, str],
    expand_user: Callable[[str], str] = os.path.expanduser,
) -> ConnectionSpec:
    def pick(*keys: str) -> tuple[str | None, Any]:
        # Ansible reads the aliases in order; the last one present wins.
        chosen: tuple[str | None, Any] = (None, None)
        for key in keys:
            if key in variables and variables[key] is not None:
                chosen = (key, variables[key])
        return chosen

    def text(key: str | None, value: Any) -> str | None:
        if key is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _var_error(f"must be a string, got {value!r}", key, origins.get(key))
        value = str(value).strip()
        if not value:
            raise _var_error("must not be empty", key, origins.get(key))
        return value

    address = text(*pick("ansible_ssh_host", "ansible_host")) or name

    port_key, port_value = pick("ansible_ssh_port", "ansible_port")
    port = 22
    if port_key is not None:
        if isinstance(port_value, str) and port_value.strip().isdigit():
            port_value = int(port_value)
        if isinstance(port_value, bool) or not isinstance(port_value, int):
            raise _var_error(
                f"must be an integer port, got {port_value!r}", port_key, origins.get(port_key)
            )
        if not 1 <= port_value <= 65535:
            raise _var_error(
                f"port {port_value} out of range 1-65535", port_key, origins.get(port_key)
            )
        port = port_value

    user = text(*pick("ansible_ssh_user", "ansible_user")) or _local_user()
    key_file = text(*pick("ansible_private_key_file", "ansible_ssh_private_key_file"))
    become_key, become_value = pick("ansible_become")
    become = (
        _as_bool(become_value, become_key, origins.get(become_key, "")) if become_key else False
    )
    become_user = text(*pick("ansible_become_user")) or "root"
    known_hosts = text(*pick("gpumon_known_hosts_file")) or DEFAULT_KNOWN_HOSTS
    policy_key, policy = pick("gpumon_host_key_policy")
    if policy_key is None:
        policy = "verify"
    elif policy not in HOST_KEY_POLICIES:
        raise _var_error(
            f"must be one of {', '.join(HOST_KEY_POLICIES)}, got {policy!r}",
            policy_key,
            origins.get(policy_key),
        )
    return ConnectionSpec(
        name=name,
        address=address,
        port=port,
        user=user,
        private_key_file=expand_user(key_file) if key_file else None,
        become=become,
        become_user=become_user,
        known_hosts_file=expand_user(known_hosts),
        host_key_policy=policy,
    )


_CONNECTION_VARS = (
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_become",
    "ansible_become_user",
    "gpumon_known_hosts_file",
    "gpumon_host_key_policy",
)


# Built once (an Environment per host was 5% of loading 100,000 hosts); it holds no per-host state.
_CONNECTION_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def _render_connection_vars(
    variables: dict[str, Any],
    context: Callable[[], dict[str, Any]],
    origins: Mapping[str, str],
) -> dict[str, Any]:
    """Connection variables may be templates (``"{{ inventory_hostname }}.mgmt"``) as in Ansible;
    ``context()`` gives the magic variables, built only for a host that has such a template."""
    rendered = variables
    for key in _CONNECTION_VARS:
        value = variables.get(key)
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            if rendered is variables:
                rendered = dict(variables)
                scope = {**variables, **context()}
            try:
                rendered[key] = _CONNECTION_ENV.from_string(value).render(scope)
            except jinja2.TemplateError as exc:
                raise _var_error(f"cannot render {value!r}: {exc}", key, origins.get(key)) from None
    return rendered


# --------------------------------------------------------------------------- extra vars


def parse_extra_vars(items: Iterable[str]) -> dict[str, Any]:
    """Merge ``-e`` items as Ansible does: ``k=v k2=v2`` (values are strings), ``@file.yml``,
    or inline YAML/JSON ``{"k": 1}``. Later items override earlier ones."""
    result: dict[str, Any] = {}
    for item in items:
        if not item:
            continue
        data: Any
        if item.startswith("@"):
            path = Path(item[1:]).expanduser()
            text = _read_text(path)
            _refuse_vault(text, path)
            data = load_yaml_text(text, str(path))
            if not isinstance(data, dict):
                raise InputError(
                    f"extra vars file must hold a mapping, got a {type(data).__name__}",
                    source=str(path),
                    line=_first_content_line(text),
                    key=item,
                )
            for key in data:
                _check_var_name(key, (str(path), data.line_of(key)))
        elif item[0] in "/.":
            raise InputError("an extra vars file must be prefixed with '@'", source="-e", key=item)
        elif item[0] in "[{":
            data = load_yaml_text(item, f"-e {item}")
            if not isinstance(data, dict):
                raise InputError("extra vars must be a mapping, not a list", source="-e", key=item)
            for key in data:
                _check_var_name(key, ("-e", None))
        else:
            data = {}
            try:
                tokens = shlex.split(item)
            except ValueError as exc:
                raise InputError(f"cannot parse: {exc}", source="-e", key=item) from None
            for token in tokens:
                key, sep, value = token.partition("=")
                if not sep or not key:
                    raise InputError(f"expected key=value, got {token!r}", source="-e", key=item)
                if not _is_identifier(key) or key in MAGIC_VARS:
                    raise InputError(f"invalid variable name {key!r}", source="-e", key=item)
                data[key] = value
        result.update(data)
    return result


# --------------------------------------------------------------------------- loading


def load_inventory(
    path: str | Path,
    extra_vars: Mapping[str, Any] | None = None,
    secrets: SecretValues | None = None,
) -> Inventory:
    """Load and validate an inventory file or directory; every problem is an InputError.

    The values of secret variables are registered in ``secrets`` (by default the process-wide
    registry that :func:`deployer.secrets.mask_text` uses), so they are masked wherever they show.
    """
    # Loading builds millions of containers that all stay alive: the cyclic collector, left on,
    # rescans them again and again (a fifth of loading 30,000 hosts) and frees none. Paused for
    # the load only, and left as the caller had it.
    with collector_paused():
        return _load_inventory(path, extra_vars, secrets)


def _load_inventory(
    path: str | Path,
    extra_vars: Mapping[str, Any] | None,
    secrets: SecretValues | None,
) -> Inventory:
    root = Path(path)
    if not root.exists():
        raise InputError("inventory not found", source=str(root))
    draft = _Draft()
    files = _inventory_files(root) if root.is_dir() else [root]
    if not files:
        raise InputError("no inventory files in this directory", source=str(root))
    for file in files:
        _parse_file(draft, file)

    groups = draft.groups
    base = root if root.is_dir() else root.parent
    warnings_: list[str] = []

    # Reconcile as Ansible does: every top-level group under all, hosts in no group ungrouped.
    for name, group in groups.items():
        if name != "all" and not group.parents:
            draft.add_child("all", name, group.defined_at or (str(root), None))
    for host in draft.hosts.values():
        others = [g for g in host.groups if g not in ("all", "ungrouped")]
        if not others and "ungrouped" not in host.groups:
            host.groups.append("ungrouped")
            groups["ungrouped"].hosts.append(host.name)
        if "all" in host.groups:
            host.groups.remove("all")
            groups["all"].hosts.remove(host.name)
        if others and "ungrouped" in host.groups:
            host.groups.remove("ungrouped")
            groups["ungrouped"].hosts.remove(host.name)
    # Ungrouped hosts come first in ``all`` only if defined first; hosts stay in definition order.

    for name in draft.hosts:
        if name in groups:
            warnings_.append(f"{name!r} is both a host and a group; a --limit of it means the host")

    _compute_depths(groups)

    group_vars_dir, host_vars_dir = base / "group_vars", base / "host_vars"
    if group_vars_dir.is_dir():
        for name, group in groups.items():
            group.file_vars, group.file_var_origins = _load_entity_vars(group_vars_dir, name)
        for name in _entity_names(group_vars_dir):
            if name not in groups:
                warnings_.append(f"{group_vars_dir / name}: no group {name!r} in the inventory")
    if host_vars_dir.is_dir():
        for name, host in draft.hosts.items():
            host.file_vars, host.file_origins = _load_entity_vars(host_vars_dir, name)
        for name in _entity_names(host_vars_dir):
            if name not in draft.hosts:
                warnings_.append(f"{host_vars_dir / name}: no host {name!r} in the inventory")

    extra = dict(extra_vars or {})
    for key in extra:
        if not _is_identifier(key) or key in MAGIC_VARS:
            raise InputError(f"invalid variable name {key!r}", source="-e", key=str(key))

    secrets = REGISTERED if secrets is None else secrets
    for group in groups.values():
        secrets.add(_secrets_in(group.inventory_vars))
        secrets.add(_secrets_in(group.file_vars))
    secrets.add(_secrets_in(extra))

    # Hosts with the same direct groups (a rack's) share their group list and the merge of
    # their groups' variables: computed once per distinct membership, not per host.
    memberships: dict[tuple[str, ...], _Membership] = {}
    member_groups: dict[str, _Membership] = {}
    for name, draft_host in draft.hosts.items():
        direct = tuple(draft_host.groups)
        membership = memberships.get(direct)
        if membership is None:
            membership = memberships[direct] = _Membership(groups, direct)
        member_groups[name] = membership
    group_members: dict[str, list[str]] = {g: [] for g in groups}
    for host_name, membership in member_groups.items():
        for g in membership.ordered:
            group_members[g].append(host_name)

    # Every host names the same key and known_hosts files: expand each path once per load.
    expand_user = functools.lru_cache(maxsize=None)(os.path.expanduser)
    hosts: list[Host] = []
    for name, draft_host in draft.hosts.items():
        for found in (_secrets_in(draft_host.inline_vars), _secrets_in(draft_host.file_vars)):
            if found:
                secrets.add(found)
        membership = member_groups[name]
        variables, origins = _resolve(membership, draft_host, extra)
        rendered = _render_connection_vars(
            variables,
            lambda name=name, membership=membership: {
                "inventory_hostname": name,
                "inventory_hostname_short": name.split(".")[0],
                "group_names": list(membership.group_names),
                "groups": group_members,
            },
            origins,
        )
        connection = _connection_spec(name, rendered, origins, expand_user)
        hosts.append(Host(name, membership.ordered, variables, connection, origins))

    return Inventory(
        sources=[str(f) for f in files],
        groups=groups,
        hosts=hosts,
        extra_vars=extra,
        secrets=secrets,
        warnings_=warnings_,
    )


def _compute_depths(groups: dict[str, Group]) -> None:
    def depth(name: str) -> int:
        parents = groups[name].parents
        return 1 + max(depth(p) for p in parents) if parents else 0

    for name, group in groups.items():
        group.depth = depth(name)


def _member_groups(groups: dict[str, Group], direct: Iterable[str]) -> list[str]:
    """Every group a host is in (ancestors included), in Ansible's merge order."""
    found: set[str] = {"all"}
    stack = list(direct)
    while stack:
        g = stack.pop()
        if g in found:
            continue
        found.add(g)
        stack.extend(groups[g].parents)
    return sorted(found, key=lambda g: (g != "all", groups[g].depth, groups[g].priority, g))


class _Membership:
    """What the hosts of one set of direct groups share: every group they are in (merge order),
    ``group_names``, and those groups' variables merged (inventory files, then group_vars/)."""

    def __init__(self, groups: dict[str, Group], direct: tuple[str, ...]) -> None:
        self.ordered = tuple(_member_groups(groups, direct))
        self.group_names = tuple(sorted(g for g in self.ordered if g != "all"))
        self.variables: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        layers = [(groups[g].inventory_vars, groups[g].inventory_var_origins) for g in self.ordered]
        layers += [(groups[g].file_vars, groups[g].file_var_origins) for g in self.ordered]
        for values, where in layers:
            for key, value in values.items():
                self.variables[key] = value
                self.origins[key] = _fmt_origin(where[key])


def _resolve(
    membership: _Membership, host: _DraftHost, extra: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A host's variables and their origins: its groups' (shared), its own, then extra vars."""
    variables = dict(membership.variables)
    origins = dict(membership.origins)
    for values, where in (
        (host.inline_vars, host.inline_origins),
        (host.file_vars, host.file_origins),
    ):
        for key, value in values.items():
            variables[key] = value
            origins[key] = _fmt_origin(where[key])
    for key, value in extra.items():
        variables[key] = value
        origins[key] = "-e"
    return variables, origins


def dumps(inventory: Inventory, host: str | None = None) -> str:
    """The masked ``inventory`` view as indented JSON (what ``--output json`` prints)."""
    return json.dumps(inventory.to_dict(host), indent=2)
