"""Every order ansible-core may list a group's hosts in, from its own groups (the driver's dump).

ansible-core's ``Group.get_hosts`` walks a group's descendants breadth first, but below the
children it takes each level from a Python ``set`` of group objects, hashed by identity
(ansible-core 2.19.14, lib/ansible/inventory/group.py, ``_walk_relationship``): where two groups
of a level both bring new children, which comes first changes from run to run. This module
replays that walk for every order the set could take, so a test can tell an order ansible-core
settles from one it leaves to chance, and check that gpumon-deploy's order is one ansible-core
could give.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

# Beyond this many walks an order counts as unknown (and only the selection is compared).
MAX_WALKS = 5000


def possible_orders(
    groups: Mapping[str, Mapping[str, list[str]]], name: str
) -> set[tuple[str, ...]] | None:
    """Each host order ansible-core's walk of group ``name`` can yield; None past MAX_WALKS.

    ``groups``: group name -> {"hosts": direct hosts, "children": child groups}, as ansible
    holds them (all's direct hosts included).
    """
    found: set[tuple[str, ...]] = set()
    walks = 0

    def children(group: str) -> list[str]:
        return list(groups[group]["children"])

    def walk(ordered: list[str], unprocessed: set[str], seen: set[str]) -> bool:
        nonlocal walks
        walks += 1
        if walks > MAX_WALKS:
            return False
        if not unprocessed:
            hosts = (h for g in ordered for h in groups[g]["hosts"])
            found.add(tuple(dict.fromkeys(hosts)))
            return True
        seen = seen | unprocessed
        bringing = sorted(g for g in unprocessed if any(c not in seen for c in children(g)))
        below = {c for g in unprocessed for c in children(g)} - seen
        for order in itertools.permutations(bringing):
            added = [c for g in order for c in children(g) if c not in seen]
            if not walk(ordered + added, below, seen):
                return False
        return True

    top = [name, *children(name)]
    if not walk(top, set(top), set()):
        return None
    return found


def settled(groups: Mapping[str, Any], name: str) -> bool:
    orders = possible_orders(groups, name)
    return orders is not None and len(orders) == 1
