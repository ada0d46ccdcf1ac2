"""The assignment of a large sharded tier, remembered on the controller between runs
(deployer/monitoring/shard_memo.py): the same shards as hashing, hashing only what is new."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from deployer.monitoring import handoff, shard_memo, shards

NAMES = ["a", "b", "c", "d"]
KEYS = [f"host:gpu{i:04d}" for i in range(400)]


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """Every input counts as large; the keys each run hashed (``shards.assign``), counted."""
    monkeypatch.setenv(handoff.RECORD_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(shard_memo, "MIN_PAIRS", 1)
    counts: list[int] = []
    real = shards.assign

    def counting(keys, names):  # type: ignore[no-untyped-def]
        keys = list(keys)
        counts.append(len(keys))
        return real(keys, names)

    monkeypatch.setattr(shards, "assign", counting)
    return counts


def remembered(keys: list[str], names: list[str]) -> dict[str, str]:
    """The assignment as planning asks for it: hashed by ``shards.assign`` (counted above)."""
    return shard_memo.assign(keys, names, shards.assign)


def test_a_remembered_assignment_is_the_hashed_one_and_the_next_run_hashes_nothing(hashed):
    first = remembered(KEYS, NAMES)
    assert first == shards.assign(KEYS, NAMES)
    path = shard_memo.path_for(NAMES)
    assert path.parent.name == "assignments" and path.parent.parent == handoff.record_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    hashed.clear()
    assert remembered(KEYS, NAMES) == first
    assert hashed == []


def test_a_host_added_since_is_the_only_key_hashed(hashed):
    remembered(KEYS, NAMES)
    hashed.clear()
    got = remembered([*KEYS, "host:gpu-new"], NAMES)
    assert hashed == [1]
    assert got == shards.assign([*KEYS, "host:gpu-new"], NAMES)
    hashed.clear()
    remembered([*KEYS, "host:gpu-new"], NAMES)
    assert hashed == []  # and remembered in turn


def test_other_shard_names_are_another_file_never_this_one(hashed):
    remembered(KEYS, NAMES)
    five = [*NAMES, "e"]
    want = shards.assign(KEYS, five)
    hashed.clear()
    assert remembered(KEYS, five) == want
    assert hashed == [len(KEYS)]
    assert shard_memo.path_for(five) != shard_memo.path_for(NAMES)


@pytest.mark.parametrize(
    "damage",
    [
        "not json",
        '{"format": "something else", "shards": ["a", "b", "c", "d"], "keys": [], "shard": []}',
        "out of range",
        "lengths differ",
        "other shards",
    ],
)
def test_a_damaged_or_foreign_file_is_ignored_and_replaced(hashed, damage):
    want = remembered(KEYS, NAMES)
    path = shard_memo.path_for(NAMES)
    data = json.loads(path.read_text())
    if damage == "out of range":
        data["shard"][0] = 9
        text = json.dumps(data)
    elif damage == "lengths differ":
        data["shard"].pop()
        text = json.dumps(data)
    elif damage == "other shards":
        data["shards"] = ["a", "b", "c", "z"]
        text = json.dumps(data)
    else:
        text = damage
    path.write_text(text)
    hashed.clear()
    assert remembered(KEYS, NAMES) == want
    assert hashed == [len(KEYS)]
    hashed.clear()
    remembered(KEYS, NAMES)
    assert hashed == []  # rewritten whole


def test_a_directory_it_cannot_write_costs_only_the_hashing(hashed, tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv(handoff.RECORD_DIR_ENV, str(blocked))
    assert remembered(KEYS, NAMES) == shards.assign(KEYS, NAMES)
    assert remembered(KEYS, NAMES) == shards.assign(KEYS, NAMES)


def test_a_small_tier_reads_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(handoff.RECORD_DIR_ENV, str(tmp_path))
    assert len(KEYS) * len(NAMES) < shard_memo.MIN_PAIRS
    assert remembered(KEYS, NAMES) == shards.assign(KEYS, NAMES)
    assert not (tmp_path / "assignments").exists()


def test_hosts_long_gone_are_dropped_from_the_file(hashed):
    remembered(KEYS, NAMES)
    few = [*KEYS[:100], "host:gpu-new"]  # 301 of 401 remembered keys are no longer asked for
    remembered(few, NAMES)
    kept = json.loads(shard_memo.path_for(NAMES).read_text())["keys"]
    assert sorted(kept) == sorted(few)


def test_the_planning_path_remembers_and_gives_every_host_its_hashed_shard(hashed):
    hosts = [k.split(":", 1)[1] for k in KEYS]
    got = shards.host_shards(hosts, {}, NAMES, remembered=True)
    assert got == shards.host_shards(hosts, {}, NAMES)
    assert shard_memo.path_for(NAMES).exists()
