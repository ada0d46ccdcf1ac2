"""The ``status`` rows of a sharded tier (pure: observed data in, ``Check`` rows out): the one
that proves the shard split, and the one of a re-shard the last whole ``up`` has not finished.

For each sharded job (``dcgm``, ``node``; deployer/monitoring/shards.py): every target of the
inventory is scraped by exactly one shard, by every replica of that shard, and by no replica of
another shard. A replica whose targets could not be read has its own failed row and is left out
here (what it scrapes is unknown, not wrong). A target no replica has discovered is pending here:
each replica's own "scraping job" row turns it failed after its discovery grace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deployer.monitoring.check import FAILED, OK, PENDING, Check, worst
from deployer.monitoring.file_sd import Target

CHECK = "every target scraped by exactly one shard"
#: the row of a re-shard the last whole ``up`` did not finish (StackExpectation.reshards)
RESHARD_CHECK = "re-shard finished"


def up_hands_over(changing_run: str | None) -> bool:
    """Whether the run holding the inventory's lock (deployer/run_lock.py ``holder``) is a whole
    ``up``, which hands the moved hosts over and records the layout (an ``up with --limit`` or
    another command does not)."""
    return changing_run is not None and changing_run.startswith("up,")


def reshard_check(change: str, changing_run: str | None) -> Check:
    """``change``: the record and both layouts (deployer/monitoring/handoff.py ``changes``);
    ``changing_run``: who holds the inventory's run lock (deployer/run_lock.py ``holder``),
    then the ``up`` handing over, or None."""
    up = (
        "hands the moved hosts over to their new shards and records the layout once every "
        "replica has them"
    )
    if up_hands_over(changing_run):
        said = (
            f"{change}. A run holds this inventory's lock ({changing_run}): the `up` {up}; run "
            "status again when it has finished"
        )
    else:
        now = (
            "No `up` runs"
            if changing_run is None
            else f"Another run ({changing_run}) holds the lock"
        )
        said = (
            f"{change}. {now}: a whole `up` {up}; until it has, their new shards do not scrape them"
        )
    return Check("prometheus", "*", RESHARD_CHECK, FAILED, said)


def shard_checks(
    replica_shards: Mapping[str, str],
    expected: Mapping[str, Sequence[Target]],
    seen: Mapping[str, set[tuple[str, str]] | None],
    jobs: Sequence[str] = ("dcgm", "node"),
) -> list[Check]:
    """``replica_shards``: replica -> shard; ``expected``: replica -> the targets its file_sd
    holds; ``seen``: replica -> the (job, instance) pairs it scrapes (None: not read)."""
    owner: dict[tuple[str, str], tuple[str, str]] = {}  # (job, instance) -> (shard, node)
    for rep, targets in expected.items():
        for t in targets:
            if t.job in jobs:
                owner[(t.job, t.instance)] = (replica_shards[rep], t.node)
    rows = []
    for job in jobs:
        problems: list[str] = []
        states = [OK]
        total = 0
        for (j, instance), (shard, node) in sorted(owner.items()):
            if j != job:
                continue
            total += 1
            by: dict[str, list[str]] = {}
            missing = []
            for rep, got in seen.items():
                if got is None:
                    continue
                if (job, instance) in got:
                    by.setdefault(replica_shards[rep], []).append(rep)
                elif replica_shards[rep] == shard:
                    missing.append(rep)
            others = sorted(s for s in by if s != shard)
            name = f"{node} ({instance})"
            if others:
                states.append(FAILED)
                problems.append(f"{name} scraped by shards {', '.join(sorted(by))} (its: {shard})")
            elif not by:
                states.append(PENDING)
                problems.append(f"{name} scraped by no shard yet (its shard: {shard})")
            elif missing:
                states.append(PENDING)
                problems.append(f"{name} not scraped by {', '.join(missing)} of shard {shard} yet")
        shards_n = len(set(replica_shards.values()))
        detail = "; ".join(problems) if problems else f"{total} targets, {shards_n} shards"
        rows.append(Check("prometheus", "*", f"{CHECK} (job {job})", worst(states), detail))
    return rows
