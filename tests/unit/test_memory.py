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
