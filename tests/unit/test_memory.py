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
