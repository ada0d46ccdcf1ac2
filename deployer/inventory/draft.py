"""Groups and hosts while the inventory's sources are read, before reconciliation: every parser
(YAML, INI) adds to one Draft; ``children`` cycles are refused as they are added."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import InputError
from deployer.inventory.model import Group, Origin
from deployer.inventory.names import check_var_name


@dataclass
class DraftHost:
    name: str
    defined_at: Origin
    groups: list[str] = field(default_factory=list)
    inline_vars: dict[str, Any] = field(default_factory=dict)
    inline_origins: dict[str, Origin] = field(default_factory=dict)
    file_vars: dict[str, Any] = field(default_factory=dict)
    file_origins: dict[str, Origin] = field(default_factory=dict)


class Draft:
    """Groups and hosts while sources are being read, before reconciliation."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {
            "all": Group("all", children=["ungrouped"]),
            "ungrouped": Group("ungrouped", parents=["all"]),
        }
        self.hosts: dict[str, DraftHost] = {}
        self.priority_origin: dict[str, Origin] = {}
        self.checked_names: set[str] = set()
        # Every (parent, child) link made, for ``add_child`` to tell a repeat by a lookup: a
        # search of the parent's list made a group of N child groups (racks under ``gpu``) cost
        # N^2/2 comparisons (3,125 racks: a tenth of a second of loading).
        self._links: set[tuple[str, str]] = {("all", "ungrouped")}

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
        if (parent, child) not in self._links:
            self._links.add((parent, child))
            self.groups[parent].children.append(child)
            self.groups[child].parents.append(parent)

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
        check_var_name(key, origin)
        g = self.groups[group]
        if key == "ansible_group_priority":
            # A property of the group, not a variable (Ansible's Group.set_variable): it orders
            # the group among its siblings when variables merge, and no host sees it.
            g.priority = _priority(value, origin)
            return
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
            host = self.hosts[name] = DraftHost(name, origin)
        # A host is in a group's list exactly when the group is in the host's (only this adds
        # to either): the host's few groups are searched, never the group's hosts, which made
        # a flat group of N hosts cost N^2/2 comparisons (40,000 hosts: 18 s of loading).
        if group not in host.groups:
            host.groups.append(group)
            self.groups[group].hosts.append(name)
        if port is not None:
            host.inline_vars["ansible_port"] = port
            host.inline_origins["ansible_port"] = origin
        for key, value in variables.items():
            where = var_origin(key)
            if key not in self.checked_names:  # the same few names recur on every host
                self.checked_names.add(check_var_name(key, where))
            host.inline_vars[key] = value
            host.inline_origins[key] = where


def _priority(value: Any, origin: Origin) -> int:
    """``ansible_group_priority`` as Ansible reads it (``int(value)``): an integer, or a string
    of one."""
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(
            f"ansible_group_priority must be an integer, got {value!r}",
            source=origin[0],
            line=origin[1],
            key="ansible_group_priority",
        )
    return value
