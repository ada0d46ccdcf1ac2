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
