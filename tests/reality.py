"""Where the tests find real captures of NVIDIA tools and real inventories written by others.

The captures live outside the repository, in ``../shared/gpu_reality_fixtures/`` (each origin named
in its ``SOURCES.md``) and ``../shared/ansible_inventory_corpus/``; the tests read them there and
never keep a copy. ``GPUMON_SHARED_DIR`` points elsewhere. A capture made by this project on a
machine with a real GPU lives in ``tests/fixtures/gpu_reality/`` with its origin in the
``SOURCES.md`` beside it, and is found through the same helper.

Contract tests are tables: one row per (capture, expected result). Adding a capture is one row.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_ENV = "GPUMON_SHARED_DIR"
# Captures this project made itself on a real GPU machine (origin in SOURCES.md there).
OWN_CAPTURES = REPO / "tests" / "fixtures" / "gpu_reality"


def shared_dir() -> Path:
    """The shared folder beside the checkout (``$GPUMON_SHARED_DIR`` overrides)."""
    return Path(os.environ.get(SHARED_ENV) or REPO.parent / "shared")


def gpu_captures_dir() -> Path:
    return shared_dir() / "gpu_reality_fixtures"


def inventory_corpus_dir() -> Path:
    return shared_dir() / "ansible_inventory_corpus"


# Real captures found in public material and proposed for ../shared (each named, with where it
# comes from, in the closing note that found it), by their future path there: a test row of one
# skips, naming its origin, until the capture has joined the shared folder, then runs like any
# other.
_NGE_FOUND = "utkuozdemir/nvidia_gpu_exporter internal/captures/{} @ {}"
_NGE_18A7DC5 = "18a7dc5a4958bed2161a23188c1a5cf280dff31b"
_NGE_3A1DB3A = "3a1db3ab720b5b1d3d45a271c5902d5b733df750"
_NGE_0EEE0D3 = "0eee0d3187e2f014f1ba6736fd729a195e13a8c8"
_NGE_5DCD6EC = "5dcd6ec10bf50b906d176cb2943b475211b320d4"
PROPOSED = {
    "dcgmi/diag-r2__dcgm-4.4.2__a10g.txt": (
        "`dcgmi diag -r 2 -i 0`, DCGM 4.4.2, driver 580.105.08, GPU device id 2237 (A10G), all "
        "pass: NVIDIA/DCGM issue #124 (https://github.com/NVIDIA/DCGM/issues/124), comment of "
        "jiayelamazon, 2026-01-28 (search index id 70723130662)"
    ),
    "dcgmi/diag-r1__dcgm-3.1.8__h200x8.txt": (
        "`dcgmi diag -r 1`, DCGM 3.1.8, driver 550.127.08, 8x H200 (2335), Persistence Mode "
        "Fail with its Error message: an Azure HPC guide 'Update Nvidia Linux driver on Debian "
        "10.13 ... for use with H200' (search index id 19926464626)"
    ),
    **{
        f"nvidia_gpu_exporter/{name}": _NGE_FOUND.format(name, commit)
        for name, commit in (
            ("linux-x86_64__nvidia-h200__580.173.02.txt", _NGE_18A7DC5),  # R580's -q; no load
            ("linux-x86_64__nvidia-h200__610.43.02.txt", _NGE_18A7DC5),  # R610
            # R580 with MIG on: one 3g.71gb GPU instance, one compute instance; no load run
            ("linux-x86_64__nvidia-h200-mig__580.173.02.txt", _NGE_3A1DB3A),
            # R610 with MIG on, the same layout: KMD Version, Specification temperatures
            ("linux-x86_64__nvidia-h200-mig__610.43.02.txt", _NGE_3A1DB3A),
            # GeForce boards (no model of the matrix, none the simulator makes): what R595's
            # 595.71.05 and R610's 610.57.04 print, one release each past the others' captures
            ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt", _NGE_0EEE0D3),
            ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt", _NGE_0EEE0D3),
            ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt", _NGE_5DCD6EC),
        )
    },
}


def capture(relpath: str) -> Path:
    """A real capture by its path under ``gpu_reality_fixtures/`` (or this project's own
    ``tests/fixtures/gpu_reality/``); skips the test, saying why, when the shared folder is absent."""
    own = OWN_CAPTURES / relpath
    if own.is_file():
        return own
    path = gpu_captures_dir() / relpath
    if not path.is_file():
        if relpath in PROPOSED:
            pytest.skip(f"real capture {relpath} not in ../shared yet; origin: {PROPOSED[relpath]}")
        if not gpu_captures_dir().is_dir():
            pytest.skip(f"real GPU captures not found: {gpu_captures_dir()} (set {SHARED_ENV})")
        raise FileNotFoundError(f"no real capture {relpath} under {gpu_captures_dir()}")
    return path


def capture_text(relpath: str) -> str:
    return capture(relpath).read_text(encoding="utf-8", errors="replace")
