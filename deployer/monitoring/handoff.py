"""Re-sharding without a blind spot: a target that moves to another shard is scraped by its new
owner before its old owner lets it go.

The controller records the shard layout (the shard names and the key kind, ``prometheus_shard_by``)
that the last whole, clean ``up`` converged, in ``prometheus_shard_record`` (default: a JSON file
per tier under ``$GPUMON_SHARD_RECORD_DIR``, else ``$XDG_STATE_HOME/gpumon-deploy/shards/``). When the inventory asks for another
layout, ``up`` converges in two passes (deployer/cli.py), the second begun only after the first
converged every host with no failure:

- *hand over*: each replica of a shard scrapes the hosts the new layout gives it **and** those the
  recorded layout gave it, so every replica only gains targets and none is dropped. From one
  pair to shards, the replicas of that pair (recorded with the layout) keep every host, and a
  replica that was not one of them takes only its own shard's: it scraped nothing before, and
  every host in every new replica would be the whole pair's load (series kept in each new
  replica's head block for hours, every exporter scraped by every replica) on each of them;
- *settle*: one longest scrape interval later (every new owner has scraped every host it takes),
  the new layout is recorded, and the second pass renders each replica's own hosts alone: the old
  owners let go of the moved hosts, which their new owners already scrape.

No record (the first ``up``) hands nothing over: nothing was scraped before. An ``up`` with
``--limit``, ``--tags`` or ``--check``, or one that failed somewhere, keeps the old record, so the
next whole ``up`` hands over again. A pair is still never restarted with its partner down
(``serial: 1`` and the HA peers of deployer/monitoring/shards.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.controller_secrets import state_home
from deployer.errors import InputError
from deployer.varformats import prometheus_seconds

RECORD_VAR = "prometheus_shard_record"
RECORD_DIR_ENV = "GPUMON_SHARD_RECORD_DIR"
FORMAT = 1
#: the layout of a tier that is not sharded: one pair, every replica scrapes every host
UNSHARDED = ("",)


@dataclass(frozen=True)
class Layout:
    """A tier's shard layout. ``replicas`` (the tier's replicas when it was recorded) is not
    part of the layout: a replica added to or removed from a shard changes no host's shard, so
    it hands nothing over; it is kept for the hand-over from one pair, which needs to know the
    pair (empty in a record written before the replicas were recorded)."""

    names: tuple[str, ...]
    by: str
    replicas: tuple[str, ...] = field(default=(), compare=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "shards": list(self.names),
            "by": self.by,
            "replicas": list(self.replicas),
        }

    def scraped_everything(self, replica: str) -> bool:
        """Whether ``replica`` scraped every host in this (recorded) layout: one pair's
        replicas did; a record without replicas counts every replica as one of the pair (no
        host unscraped while it moves, at the cost of that pass' load)."""
        return self.names == UNSHARDED and (not self.replicas or replica in self.replicas)


@dataclass
class _Seen:
    """What this planning pass saw of one record."""

    read: Layout | None  # the layout read from it (None: no record)
    wanted: Layout  # the layout the inventory asks for now
    interval_s: float  # the longest scrape interval of the replicas planned with it
    # The inventory's ``groups`` it was planned from: one planning of one inventory wants one
    # layout per record, two layouts there are two tiers on one record.
    groups: Any

    def handing_over(self) -> bool:
        return self.read not in (None, self.wanted)


_LOCK = threading.Lock()
#: record path -> what this planning pass saw of it
_SEEN: dict[Path, _Seen] = {}
# One list per :func:`diagnosing` scope open: the record problems it has been told.
_DIAGNOSED: list[list[str]] = []
#: after the longest interval, a little more: the replica's file watch and its scrape's jitter
MARGIN_S = 5.0


def record_dir() -> Path:
    """``$GPUMON_SHARD_RECORD_DIR``, else ``$XDG_STATE_HOME/gpumon-deploy/shards``."""
    given = os.environ.get(RECORD_DIR_ENV)
    if given:
        return Path(given)
    return state_home() / "shards"


def default_record(variables: Mapping[str, Any]) -> Path:
    """One record per tier: the replicas' group and their cluster."""
    tier = f"{variables.get('prometheus_group', 'prometheus')}-{variables.get('cluster') or 'tier'}"
    return record_dir() / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', tier)}.json"


def record_path(variables: Mapping[str, Any]) -> Path:
    given = variables.get(RECORD_VAR)
    return Path(str(given)).expanduser() if given else default_record(variables)


def _read(path: Path) -> Layout | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: the shard layout record cannot be read: {exc}", key=RECORD_VAR
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not a shard layout record of this release", key=RECORD_VAR)
    return Layout(
        tuple(str(n) for n in data.get("shards", ())),
        str(data.get("by", "host")),
        tuple(str(r) for r in data.get("replicas", ())),
    )


def previous(variables: Mapping[str, Any], wanted: Layout) -> Layout | None:
    """The recorded layout when it differs from ``wanted`` (the replicas then hand over), else
    None. Remembers ``wanted`` for :func:`settle`. A record that cannot be read, another tier's,
    or one two tiers of this inventory would share is refused (``InputError``), but within
    :func:`diagnosing`."""
    path = record_path(variables)
    interval = longest_interval_s(variables)
    groups = variables.get("groups")
    with _LOCK:
        seen = _SEEN.get(path)
        if seen is None or seen.groups is not groups:
            # the first replica, or another inventory's planning (a pass not settled or
            # forgotten): not this one's
            try:
                read = _read(path)
                _refuse_another_tiers(variables, path, read, wanted)
            except InputError as exc:
                _diagnosed(exc)
                read = None
            seen = _SEEN[path] = _Seen(read, wanted, interval, groups)
        elif seen.wanted != wanted or seen.wanted.replicas != wanted.replicas:
            _diagnosed(
                InputError(
                    f"host {variables.get('inventory_hostname', '?')}: two Prometheus tiers "
                    f"record their shard layout in {path} ({_said(seen.wanted)}; "
                    f"{_said(wanted)}): give each tier its own",
                    key=RECORD_VAR,
                )
            )
            return None
        else:
            seen.interval_s = max(seen.interval_s, interval)
        recorded = seen.read
    return recorded if recorded is not None and recorded != wanted else None


@contextlib.contextmanager
def diagnosing() -> Iterator[list[str]]:
    """For a command that only reads (``status``): within it, a record :func:`previous` would
    refuse is taken as no record (no hand-over expected) and its refusal, each once, is put in
    the list handed out instead of raised. ``up`` still refuses it before touching a host; the
    command that only reads shows it beside the rest of the stack, which it can still check."""
    found: list[str] = []
    with _LOCK:
        _DIAGNOSED.append(found)
        _SEEN.clear()  # a pass planned before saw the records without this scope
    try:
        yield found
    finally:
        with _LOCK:
            _DIAGNOSED.remove(found)
            _SEEN.clear()  # nor may a later pass take what this one made of them


def _diagnosed(exc: InputError) -> None:
    """Raise ``exc``, or (within :func:`diagnosing`, ``_LOCK`` held) say it there."""
    if not _DIAGNOSED:
        raise exc
    said = str(exc)
    if said not in _DIAGNOSED[-1]:
        _DIAGNOSED[-1].append(said)


def _refuse_another_tiers(
    variables: Mapping[str, Any], path: Path, read: Layout | None, wanted: Layout
) -> None:
    """A record of another layout, written by replicas none of which is one of this tier's, is
    another tier's: two inventories without ``cluster`` on one controller share the default
    record, and the layout one recorded would be handed over from by the other, whose replicas
    never had it (a host the recorded layout did not give its real old owner is let go before
    its new owner scrapes it). Refused before anything is written (templates are rendered when
    the run is planned). The same layout hands nothing over, so a pair replaced whole by another
    still takes the record over; a record of no replicas (an older release's) cannot tell and is
    read as before."""
    if read is None or read == wanted or not read.replicas or not wanted.replicas:
        return
    if set(read.replicas) & set(wanted.replicas):
        return
    raise InputError(
        f"host {variables.get('inventory_hostname', '?')}: the shard layout record {path} is "
        f"another tier's ({_said(read)}); this tier is {_said(wanted)}. Give each tier its own "
        f"record: set `cluster` (the default record is named by prometheus_group and cluster) or "
        f"{RECORD_VAR}. If every replica of this tier replaced those, remove the record: the "
        "next up then hands nothing over",
        key=RECORD_VAR,
    )


def _said(layout: Layout) -> str:
    kind = (
        "one pair"
        if layout.names == UNSHARDED
        else f"shards {', '.join(layout.names)} (by {layout.by})"
    )
    return f"{kind} of {', '.join(layout.replicas) or 'no replica'}"


def longest_interval_s(variables: Mapping[str, Any]) -> float:
    """The longest interval a replica scrapes a GPU or node host at: the global one or a tier's
    (``prometheus_scrape_tiers``)."""
    found = [prometheus_seconds(variables.get("prometheus_scrape_interval", "15s"))]
    tiers = variables.get("prometheus_scrape_tiers") or {}
    if isinstance(tiers, Mapping):
        found += [
            prometheus_seconds(t["interval"])
            for t in tiers.values()
            if isinstance(t, Mapping) and t.get("interval")
        ]
    return max(found)


def hand_over_wait_s() -> float:
    """How long the replicas need, once the hand-over pass converged, before the old owners may
    let go: one longest scrape interval (each new owner has scraped each host it takes) and a
    margin."""
    with _LOCK:
        longest = max((s.interval_s for s in _SEEN.values() if s.handing_over()), default=0.0)
    return longest + MARGIN_S if longest else 0.0


def handing_over() -> list[Path]:
    """The records whose layout this pass handed over from (a second pass must settle them)."""
    with _LOCK:
        return [p for p, s in _SEEN.items() if s.handing_over()]


def changes() -> list[str]:
    """Each record this pass hands over from, said: the record, the layout the last whole
    ``up`` recorded and the one the inventory asks for."""
    with _LOCK:
        return [
            f"{path}: {_said(seen.read)} recorded, the inventory asks for {_said(seen.wanted)}"
            for path, seen in _SEEN.items()
            if seen.handing_over()
        ]


def settle() -> list[Path]:
    """After a whole, clean pass: record the layout every replica now has; returns the records
    that changed. Written by rename (never half-written), 0644 in a 0700 directory."""
    changed = []
    with _LOCK:
        for path, seen in _SEEN.items():
            read, want = seen.read, seen.wanted
            if read == want and read is not None and read.replicas == want.replicas:
                continue
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            staged = path.with_name(f".{path.name}.tmp")
            staged.write_text(json.dumps(want.as_json(), indent=1) + "\n")
            staged.replace(path)
            changed.append(path)
        _SEEN.clear()
    return changed


def forget() -> None:
    """Drop what this process read and saw (the next pass plans from the records anew)."""
    with _LOCK:
        _SEEN.clear()
