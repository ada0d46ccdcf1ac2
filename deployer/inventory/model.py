"""The loaded inventory as data: groups, hosts with their resolved variables and connection
settings, and the JSON-ready view ``gpumon-deploy inventory`` shows (secrets masked)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from deployer.errors import InputError
from deployer.inventory.order import member_order
from deployer.secrets import SecretValues, mask, secret_values_in

# Where a value came from: (file or "-e", line or None).
Origin = tuple[str, int | None]
EMPTY_VARS: Mapping[str, Any] = MappingProxyType({})


def fmt_origin(origin: Origin) -> str:
    source, line = origin
    return f"{source}:{line}" if line is not None else source


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


_MISSING = object()


class LayeredVars(Mapping[str, Any]):
    """Variables merged from layers (highest first) without copying them: what
    ``{**lowest, ..., **highest}`` holds, looked up layer by layer. Iteration gives the merged
    dict's order. Read-only; the layers are not copied, so they must not change while in use.

    ``magic`` (a host's :class:`MagicVars`) answers its five names alone and every other name
    skips it, so a lookup calls no Python code per layer (the preflight reads about ten
    variables of each of 100,000 hosts). It sits below the first ``above_magic`` layers, which
    must not hold those names (for the merged dict's order)."""

    __slots__ = ("_above", "_layers", "_magic")

    def __init__(
        self, *layers: Mapping[str, Any], magic: MagicVars | None = None, above_magic: int = 0
    ) -> None:
        self._layers = layers
        self._magic = magic
        self._above = above_magic

    def __getitem__(self, key: str) -> Any:
        if key in _MAGIC_KEYS and self._magic is not None:
            return self._magic[key]
        for layer in self._layers:
            value = layer.get(key, _MISSING)
            if value is not _MISSING:
                return value
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in _MAGIC_KEYS and self._magic is not None:
            return self._magic.get(key, default)
        for layer in self._layers:
            value = layer.get(key, _MISSING)
            if value is not _MISSING:
                return value
        return default

    def get_many(self, keys: Sequence[str], default: Any = None) -> tuple[Any, ...]:
        """``tuple(self.get(key, default) for key in keys)``, in one call: what a planner that
        reads a score of variables of each of 100,000 hosts asks (a call per variable was most of
        the exporters' planning for ``gpumon-deploy capacity``)."""
        magic, layers = self._magic, self._layers
        out = []
        for key in keys:
            if magic is not None and key in _MAGIC_KEYS:
                out.append(magic.get(key, default))
                continue
            for layer in layers:
                value = layer.get(key, _MISSING)
                if value is not _MISSING:
                    break
            else:
                value = default
            out.append(value)
        return tuple(out)

    def __contains__(self, key: object) -> bool:
        if key in _MAGIC_KEYS and self._magic is not None:
            return True
        for layer in self._layers:  # noqa: SIM110 - a loop, not any() over a generator: faster
            if key in layer:
                return True
        return False

    def _keys(self) -> dict[str, None]:
        keys: dict[str, None] = {}
        for layer in reversed(self._layers[self._above :]):
            keys.update(dict.fromkeys(layer))
        if self._magic is not None:
            keys.update(dict.fromkeys(self._magic))
        for layer in reversed(self._layers[: self._above]):
            keys.update(dict.fromkeys(layer))
        return keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())


_MAGIC_KEYS = frozenset(
    ("inventory_hostname", "inventory_hostname_short", "group_names", "groups", "hostvars")
)


class MagicVars(Mapping[str, Any]):
    """:meth:`Inventory.magic_vars` of one host as a view (nothing copied until asked)."""

    __slots__ = ("_groups", "_host", "_hostvars")
    KEYS = ("inventory_hostname", "inventory_hostname_short", "group_names", "groups", "hostvars")

    def __init__(self, host: Host, groups: Mapping[str, Any], hostvars: Mapping[str, Any]) -> None:
        self._host = host
        self._groups = groups
        self._hostvars = hostvars

    def get(self, key: str, default: Any = None) -> Any:
        if key not in _MAGIC_KEYS:
            return default
        if key == "inventory_hostname":
            return self._host.name
        if key == "hostvars":
            return self._hostvars
        if key == "groups":
            return self._groups
        if key == "group_names":
            return self._host.group_names
        if key == "inventory_hostname_short":
            return self._host.name.split(".")[0]
        return default

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self.KEYS

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)


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
        declared_in_all: Sequence[str] = (),
    ) -> None:
        """``declared_in_all``: the hosts declared directly in group ``all``, in order (they
        come first in ``all``'s order, as in Ansible)."""
        self.sources = sources
        self.groups = groups
        self.hosts: dict[str, Host] = {h.name: h for h in hosts}
        self.extra_vars = extra_vars
        self.secrets = secrets
        self.warnings = warnings_
        self._index = {h.name: i for i, h in enumerate(hosts)}
        # Each group's hosts in Ansible's order (deployer/inventory/order.py).
        self._members: dict[str, list[str]] = {
            name: member_order(groups, name, declared_in_all) for name in groups
        }
        self._hostvars = MappingProxyType({h.name: h.vars for h in hosts})
        self._groups_view = GroupMembers(self._members)
        self._scanned: dict[int, Mapping[str, Any]] = {}

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
        """Names of every host in group ``name`` or its descendants, in Ansible's order (the
        group's own hosts, then its children's, breadth first: deployer/inventory/order.py)."""
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
        self._scan_defaults(role_defaults)
        return {**defaults, **h.vars, **self.magic_vars(h)}

    def layered_vars(
        self,
        host: Host | str,
        role_defaults: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] = EMPTY_VARS,
        hostvars: Mapping[str, Any] | None = None,
    ) -> LayeredVars:
        """What :meth:`resolve_vars` returns, updated with ``overrides`` and with ``hostvars``
        (when given) as the magic ``hostvars``, as a read-only view over the layers instead of a
        new dict: for the many hosts a run only reads (``hostvars`` of every host, for a
        targets file), so that no host's defaults and variables are copied."""
        h = host if isinstance(host, Host) else self.host(host)
        self._scan_defaults(role_defaults)
        magic = MagicVars(h, self._groups_view, self._hostvars if hostvars is None else hostvars)
        defaults = role_defaults or EMPTY_VARS
        if not overrides:
            return LayeredVars(h.vars, defaults, magic=magic)
        if _MAGIC_KEYS.isdisjoint(overrides):  # then the magic names are answered as above
            return LayeredVars(overrides, h.vars, defaults, magic=magic, above_magic=1)
        return LayeredVars(overrides, magic, h.vars, defaults)  # overrides above magic too

    def _scan_defaults(self, role_defaults: Mapping[str, Any] | None) -> None:
        # One defaults mapping serves every host of a play: scan it for secrets once (scanning
        # it per host was most of the time of resolving 100,000 hosts' variables).
        if role_defaults is not None and self._scanned.get(id(role_defaults)) is not role_defaults:
            for value in secret_values_in(dict(role_defaults)):
                self.secrets.add(value)
            self._scanned[id(role_defaults)] = role_defaults

    # -- display

    def to_dict(
        self,
        host: str | None = None,
        mask_secrets: bool = True,
        selected: Collection[str] | None = None,
    ) -> dict[str, Any]:
        """JSON-ready view for ``gpumon-deploy inventory``.

        Without ``host``: ``{"hosts": {name: {...}}, "groups": {name: {"children", "hosts",
        "vars"}}}`` with hosts in the order of group ``all``. With ``host``: that host's entry
        alone, ``{"name", "groups", "connection", "vars"}``. Secrets are masked unless told
        otherwise. ``selected`` (the hosts a ``--limit`` leaves) shows those hosts only, as
        ``ansible-inventory --list --limit`` does: each group's hosts are the selected ones,
        and a group none of whose hosts is selected is left out (``all`` stays).
        """

        def shown(value: Any) -> Any:
            value = jsonable(value)
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
        chosen = None if selected is None else set(selected)

        def shows(name: str) -> bool:
            return chosen is None or name in chosen

        return {
            "hosts": {n: host_entry(self.hosts[n]) for n in self._members["all"] if shows(n)},
            "groups": {
                g.name: {
                    "children": list(g.children),
                    "hosts": [n for n in g.hosts if shows(n)],
                    "vars": shown(g.vars),
                }
                for g in self.groups.values()
                if g.name == "all" or chosen is None or not chosen.isdisjoint(self._members[g.name])
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


def jsonable(value: Any) -> Any:
    """A value as ansible-inventory shows it in JSON: YAML timestamps and dates in ISO 8601
    (``2017-03-07T10:20:49+00:00``, as Ansible's JSON encoder writes them), other values that
    JSON has no type for as text."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.date | datetime.time):  # a datetime is a date too
        return value.isoformat()
    return str(value)


def dumps(inventory: Inventory, host: str | None = None) -> str:
    """The masked ``inventory`` view as indented JSON (what ``--output json`` prints)."""
    return json.dumps(inventory.to_dict(host), indent=2)
