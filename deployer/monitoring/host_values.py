"""A few variables of each of many hosts, as a replica's planning reads them (the targets' labels
and addresses, shard keys, scrape intervals, GPU counts): through ``hostvars.values_of`` where
the mapping has it (the planner's ``LazyHostVars``: for plain values no host's entry is built),
else through each host's entry (a mapping of plain dicts, as tests give)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Reader = Callable[[str, Sequence[str]], tuple[Any, ...]]


def reader(hostvars: Mapping[str, Any]) -> Reader:
    """``read(host, keys)``: ``hostvars[host].get(key)`` for each of ``keys``, as a tuple."""
    fast = getattr(hostvars, "values_of", None)
    if fast is not None:
        return fast  # type: ignore[no-any-return]

    def read(host: str, keys: Sequence[str]) -> tuple[Any, ...]:
        hv = hostvars[host]
        return tuple([hv.get(key) for key in keys])

    return read


def per_host(hostvars: Mapping[str, Any], keys: Sequence[str]) -> Callable[[str], tuple[Any, ...]]:
    """``of(host)``: ``reader(hostvars)(host, keys)``, read once per host however often asked (a
    GPU host is a target of two jobs, dcgm and node)."""
    read = reader(hostvars)
    known: dict[str, tuple[Any, ...]] = {}

    def of(host: str) -> tuple[Any, ...]:
        values = known.get(host)
        if values is None:
            values = known[host] = read(host, keys)
        return values

    return of
