"""Every field the product asks ``nvidia-smi --query-gpu`` for is one that real nvidia-smi lists.

One field a driver does not know fails the whole query, so the facts of a host (its GPUs, its
driver) would be lost to one name. The fields are checked against every ``--help-query-gpu`` of
the real captures: the R590 runs of utkuozdemir/nvidia_gpu_exporter's captures and netdata's
older one (../shared/gpu_reality_fixtures/SOURCES.md). The product's queries are read from its
own source (every ``--query-gpu=`` outside the lab's simulator), so a new query is checked
without a list to keep. The queries that ask ``kmd_version`` where a driver has refused
``driver_version`` are checked against the captures that list it (R595 on).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.contract.captures import help_fields, section
from tests.reality import REPO, capture_text

HELP_CAPTURES = [
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", True),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt", True),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt", True),
    # proposed for ../shared (tests/reality.py PROPOSED): skipped until they join it
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h200__580.173.02.txt", True),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h200__610.43.02.txt", True),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt", True),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt", True),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt", True),
    ("netdata_go.d.plugin/help-query-gpu.txt", False),  # the whole file is the help
]
_QUERY = re.compile(r"--query-gpu=([A-Za-z0-9_.,]+)")


def product_queries(*, refused_driver_version: bool = False) -> dict[str, set[str]]:
    """``path -> fields`` of every ``--query-gpu=`` in the product (not the lab's simulator).
    The queries naming ``kmd_version`` are asked only where nvidia-smi refused ``driver_version``
    (deployer/facts.py ``REFUSED_DRIVER_VERSION``): they are these with
    ``refused_driver_version``, the others without."""
    sources = [
        *(p for p in (REPO / "deployer").rglob("*.py") if "lab" not in p.parts),
        *(p for p in (REPO / "roles").rglob("*") if p.is_file()),
        *(p for p in (REPO / "templates").rglob("*") if p.is_file()),
    ]
    out: dict[str, set[str]] = {}
    for p in sources:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for fields in _QUERY.findall(text):
            names = set(fields.split(","))
            if ("kmd_version" in names) == refused_driver_version:
                out.setdefault(str(p.relative_to(REPO)), set()).update(names)
    return out


def listed(relpath: str, sectioned: bool) -> set[str]:
    text = capture_text(relpath)
    return help_fields(section(text, "capabilities :: help-query-gpu") if sectioned else text)


def test_the_product_s_queries_are_found():
    found = product_queries()
    assert (
        "deployer/facts.py" in found
        and {"mig.mode.current", "driver_version"} <= found["deployer/facts.py"]
    ), found
    assert "roles/nvidia_driver/files/nvidia-driver-check" in found, found
    # asked again by the new name where a driver refuses the deprecated one: the same three
    renamed = product_queries(refused_driver_version=True)
    assert set(renamed) == {
        "deployer/facts.py",
        "deployer/rollout/hostops.py",
        "roles/nvidia_driver/files/nvidia-driver-check",
    }, renamed
    assert all(
        fields == found[path] - {"driver_version"} | {"kmd_version"}
        for path, fields in renamed.items()
    ), (renamed, found)


@pytest.mark.parametrize(("relpath", "sectioned"), HELP_CAPTURES, ids=lambda v: str(v))
def test_every_field_the_product_queries_is_listed_by_real_nvidia_smi(relpath, sectioned):
    known = listed(relpath, sectioned)
    assert len(known) > 100, f"{relpath}: the help was not read ({len(known)} names)"
    queries = product_queries()
    if "kmd_version" in known:  # a driver that knows the new name (R595 on): asked it, too
        renamed = product_queries(refused_driver_version=True)
        queries = {p: queries.get(p, set()) | renamed.get(p, set()) for p in {*queries, *renamed}}
    unknown = {path: sorted(fields - known) for path, fields in queries.items() if fields - known}
    assert unknown == {}, f"fields {Path(relpath).name} does not list: {unknown}"
