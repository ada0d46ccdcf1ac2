"""The order Ansible lists a group's hosts in, which is what a subscript (``gpu[0]``) picks from.

Ansible's ``Group.get_hosts`` (ansible-core 2.19.14, lib/ansible/inventory/group.py,
``_get_hosts`` over ``get_descendants(include_self=True, preserve_ordering=True)``) walks the group
and its descendants breadth first: the group's own hosts, then each child's (in the order the
children were added), then the grandchildren's, each host once, where it is first met. Not the
order the file first named the hosts in: ``n1 n2 n3`` then ``[g] n2 n1 n3`` lists ``g`` as n2, n1,
n3. ``all`` lists the hosts declared directly under it first (a YAML ``all: hosts:``), then
``ungrouped``'s, then each top-level group's.

Below the children, Ansible takes each level's groups in the order of a Python set of group
objects (not reproducible); here they come in the order of the level above, each one's children
in order: the same wherever only one group of a level has children.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Protocol


class Group(Protocol):
    """What the order reads of a group: its direct members, in declaration order (the model's
    ``Group`` has them; the order needs nothing else of it, so it imports nothing of the model)."""

    @property
    def hosts(self) -> Sequence[str]: ...

    @property
    def children(self) -> Sequence[str]: ...


def descendants_breadth_first(groups: Mapping[str, Group], name: str) -> list[str]:
    """``name``, its children, their children, …: each group once, where first met."""
    ordered = [name]
    seen = {name}
    level = [name]
    while level:
        below: list[str] = []
        for group in level:
            for child in groups[group].children:
                if child not in seen:
                    seen.add(child)
                    ordered.append(child)
                    below.append(child)
        level = below
    return ordered


def member_order(
    groups: Mapping[str, Group], name: str, declared_in_all: Sequence[str] = ()
) -> list[str]:
    """Every host of group ``name`` and its descendants, in Ansible's order: each where first
    met (a dict keeps a key where it was first put)."""
    met = chain.from_iterable(
        groups[group].hosts for group in descendants_breadth_first(groups, name)
    )
    if name == "all":
        met = chain(declared_in_all, met)
    return list(dict.fromkeys(met))
