"""deployer/debversion.py: Debian's version order, held to ``dpkg --compare-versions``."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from deployer.debversion import compare

KERNELS = ["6.1.0-28", "6.1.0-9", "6.1.0-28", "6.12.9-1", "6.1.0", "6.18.44-fc", "5.10.0-33"]


@pytest.mark.parametrize(
    ("a", "b", "sign"),
    [
        ("6.1.0-28", "6.1.0-9", 1),  # numbers, not text
        ("6.12.9-1", "6.1.0-28", 1),
        ("1.0~rc1", "1.0", -1),  # ~ sorts before the end
        ("1.0", "1.0+b1", -1),
        ("1:0.9", "2.0", 1),  # the epoch first
        ("1.0-1", "1.0-1", 0),
        ("1.00", "1.0", 0),  # leading zeros
        ("1.0a", "1.0+", -1),  # letters before other characters
    ],
)
def test_versions_order_as_debian_orders_them(a, b, sign):
    got = compare(a, b)
    assert (got > 0) - (got < 0) == sign


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="no dpkg on this machine")
def test_the_order_is_dpkg_s_own_on_this_machine():
    rng = random.Random(7)
    alphabet = "0123456789..~+ab-"
    made = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))).strip("-")
        for _ in range(150)
    ]
    versions = [v for v in made if v and v[0].isdigit() and "--" not in v] + KERNELS
    pairs = [(rng.choice(versions), rng.choice(versions)) for _ in range(300)]
    for a, b in pairs:
        said = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False)
        equal = subprocess.run(["dpkg", "--compare-versions", a, "eq", b], check=False)
        want = -1 if said.returncode == 0 else (0 if equal.returncode == 0 else 1)
        got = compare(a, b)
        assert (got > 0) - (got < 0) == want, (a, b)
