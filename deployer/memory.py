"""How the engine keeps Python's cyclic garbage collector out of the way of the large structures
a run builds and keeps (an inventory of 100,000 hosts, every host's variables for a targets
file): paused while they are built, left as the caller had it; frozen once built for the run."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The pauses open now, over every thread: the collector is one per process, so it comes back
# when the last pause ends (in whatever order they end), and only if it was on when the first
# began.
_pauses = 0
_resume = False
_lock = threading.Lock()


@contextmanager
def collector_paused(*, keep: bool = False) -> Iterator[None]:
    """No cyclic collection inside the block: what it builds stays alive, so a collection would
    rescan it again and again and free nothing. Restored as found, also on error, when the last
    of the pauses open in any thread ends.

    With ``keep``, what is alive when the block ends is kept for the run (:func:`keep_for_the_run`)
    before the collector comes back. Without it, everything the block made is young: the first
    allocation after it scans all of it, and later collections again (at 100,000 GPU hosts, a
    tenth of planning went to the scans after the preflight's and the targets files' pauses)."""
    global _pauses, _resume
    with _lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
        if keep:
            keep_for_the_run()
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


def keep_for_the_run() -> None:
    """Move everything alive now out of the collector's sight (``gc.freeze``): call it once what
    lives for the whole run (the inventory) is built. Objects made later are collected as usual."""
    gc.freeze()
