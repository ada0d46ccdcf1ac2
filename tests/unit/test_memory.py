"""The collector pause: off inside, restored as the caller had it, also on error."""

from __future__ import annotations

import gc

import pytest

from deployer.memory import collector_paused


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_off_inside_and_as_found_after(enabled_before):
    (gc.enable if enabled_before else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled_before
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("boom")
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_what_a_kept_block_leaves_alive_is_out_of_the_collectors_sight_after_it():
    # the inventory's or a targets file's labels: built once, alive for the run; a collection
    # after the pause would scan every one of them, and find nothing to free
    gc.unfreeze()
    try:
        with collector_paused(keep=True):
            kept = [{"node": f"gpu{i:03d}"} for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(kept)
        young = {id(o) for o in gc.get_objects()}
        assert not [o for o in kept if id(o) in young]
    finally:
        gc.unfreeze()


def test_a_kept_block_that_fails_keeps_nothing():
    gc.unfreeze()
    try:
        with pytest.raises(ValueError), collector_paused(keep=True):
            raise ValueError("boom")
        assert gc.get_freeze_count() == 0
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_pauses_overlapping_in_threads_keep_the_collector_off_until_the_last_one_ends():
    # Hosts' threads each pause the collector (a targets file, a preflight): the first pause to
    # end must not switch it back on under the others, whatever order they end in.
    import threading

    gc.enable()
    first_in, second_in, first_out, second_out = (threading.Event() for _ in range(4))
    seen: dict[str, bool] = {}

    def first() -> None:
        with collector_paused():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with collector_paused():
            second_in.set()
            first_out.wait(10)
            seen["after the first ended"] = gc.isenabled()
        second_out.set()

    threads = [threading.Thread(target=f) for f in (first, second)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert second_out.is_set()
        assert seen == {"after the first ended": False}
        assert gc.isenabled()
    finally:
        gc.enable()


def _rack_inventory(tmp_path, hosts: int):
    lines = ["all:", "  children:", "    gpu:", "      hosts:"]
    lines += [
        f"        gpu{i:04d}: {{ansible_host: 10.0.{i >> 8}.{i & 255}}}" for i in range(hosts)
    ]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_runs_inventory_is_kept_before_the_collector_comes_back(tmp_path):
    # A command's inventory lives for its run (DeploySession.load): frozen inside the load's
    # pause, so no collection scans it once the collector is back (frozen after the return,
    # the first allocation in between scanned all of it: a sixth of a second at 100,000 hosts).
    from deployer.inventory import load_inventory

    path = _rack_inventory(tmp_path, 500)
    collections: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.unfreeze()
    gc.enable()
    gc.callbacks.append(seen)
    try:
        inventory = load_inventory(path, keep=True)
        assert collections == []
        assert gc.isenabled()
        young = {id(o) for o in gc.get_objects()}
        assert not [h for h in inventory.hosts.values() if id(h) in young]
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()


def test_an_inventory_loaded_for_a_look_is_not_kept(tmp_path):
    # Loaded without ``keep`` (a test, a parity check): nothing frozen, all of it collectable.
    from deployer.inventory import load_inventory

    gc.unfreeze()
    try:
        load_inventory(_rack_inventory(tmp_path, 50))
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_a_commands_session_keeps_its_inventory(tmp_path):
    from deployer.session import DeploySession, RunOptions

    gc.unfreeze()
    try:
        session = DeploySession.load(
            RunOptions(inventory=_rack_inventory(tmp_path, 50)), plan=False
        )
        young = {id(o) for o in gc.get_objects()}
        assert not [h for h in session.inventory.hosts.values() if id(h) in young]
    finally:
        gc.unfreeze()
