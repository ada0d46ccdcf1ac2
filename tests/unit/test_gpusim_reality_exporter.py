"""The simulated dcgm-exporter serves what the real one serves: one row per real scrape, plus
its shipped files and field names per release.

Scrapes (``gpu_reality_fixtures/dcgm-exporter-metrics/``) are compared family by family: the
metric names and their order, HELP and TYPE lines, the label names of every series in order, the
value's form (integer or ``%f``), and which GPUs / GPU instances a family has a series for.
Label values and readings are normalised. Adding a scrape is one row.
"""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployer.lab.gpusim import build_packages, exporter_fields
from deployer.lab.gpusim.catalog import EXPORTERS
from deployer.lab.gpusim.sandbox import Daemon, free_port, run, unpack
from tests.reality import capture, capture_text
from tests.unit.gpusim_captures import sim_host, smi_packages

SERIES = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
METRICS = "dcgm-exporter-metrics/"


@dataclass(frozen=True)
class Scrape:
    path: str
    model: str
    count: int
    driver: str  # the simulated release of the captured branch
    exporter: str
    csv: str | None = None  # None: the shipped default-counters.csv
    mig: Any = None
    #: label names the capture's (older) exporter did not have, or label fields its CSV had
    ignore_labels: tuple[str, ...] = ()
    #: families whose presence depends on the DCGM generation, checked elsewhere
    ignore_families: tuple[str, ...] = ()
    families: tuple[str, ...] = field(default=())  # a scrape excerpt: only these


A800_CSV = """DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION, label, Driver Version
"""

SCRAPES = [
    Scrape(METRICS + "l40s_595.58.03_default-counters.metrics", "L40S", 1, "595.45.04", "4.8.2"),
    Scrape(METRICS + "l40s_595.58.03_default-counters.metrics", "L40S", 1, "595.45.04", "4.7.1"),
    # under gpu-operator, a GPU in use by a pod carries its pod-resources labels (container,
    # namespace, pod); a bare-metal host has no pods
    Scrape(METRICS + "h100x8_580.105.08_excerpt.metrics", "H100", 8, "580.126.20", "4.8.2",
           families=("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"),
           ignore_labels=("container", "namespace", "pod")),
    # 8x A800, GPU 0 in MIG mode with three 2g.20gb instances; an exporter older than pci_bus_id
    # (4.4.1-4.6.0) whose CSV had the label field DCGM_FI_PROCESS_NAME; its DCGM wrote XID 0
    # where DCGM 4 leaves the field blank (the L40S scrape)
    Scrape(METRICS + "a800_mig_535.129.03_excerpt.metrics", "A800", 2, "535.54.03", "4.8.2",
           csv=A800_CSV, mig={0: ["2g.20gb", "2g.20gb", "2g.20gb"]},
           ignore_labels=("pci_bus_id", "DCGM_FI_PROCESS_NAME"),
           ignore_families=("DCGM_FI_DEV_XID_ERRORS",)),
]  # fmt: skip


def parse(text: str) -> dict[str, dict]:
    """family -> {"help", "type", "series": [(labels as list of (k, v)), value]} in order."""
    fams: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            fams.setdefault(name, {"series": []})["help"] = help_text
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            fams.setdefault(name, {"series": []})["type"] = typ
        elif line and not line.startswith("#"):
            m = SERIES.match(line)
            assert m, line
            fams.setdefault(m["name"], {"series": []})["series"].append(
                (LABEL.findall(m["labels"]), m["value"])
            )
    return fams


def value_form(v: str) -> str:
    return "%f" if re.fullmatch(r"-?\d+\.\d{6}", v) else ("%d" if re.fullmatch(r"-?\d+", v) else v)


def where(labels: list[tuple[str, str]]) -> tuple:
    d = dict(labels)
    return (d.get("gpu"), d.get("GPU_I_PROFILE"))


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def exporter_pkg(version: str) -> str:
    return f"datacenter-gpu-manager-exporter_{version}"


def core_pkg(version: str) -> str:
    dcgm = next(e.dcgm for e in EXPORTERS if e.version == version)
    return f"datacenter-gpu-manager-4-core_{dcgm}"


def serve(tmp_path: Path, debs, cap: Scrape) -> str:
    pkgs = (*smi_packages(cap.driver), core_pkg(cap.exporter), exporter_pkg(cap.exporter))
    root = sim_host(tmp_path / "root", debs, pkgs, cap.model, cap.count, mig=cap.mig)
    csv = "/etc/dcgm-exporter/default-counters.csv"
    if cap.csv:
        (root / "etc/gpusim/test.csv").write_text(cap.csv)
        csv = "/etc/gpusim/test.csv"
    port = free_port()
    with Daemon(root, ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{port}", "-f", csv], port):
        return fetch(port)


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


IDS = [f"{s.path.split('/')[1].split('_')[0]}-{s.exporter}" for s in SCRAPES]


@pytest.mark.parametrize("cap", SCRAPES, ids=IDS)
def test_the_scrape_has_the_captured_families_labels_and_value_forms(tmp_path, debs, cap) -> None:
    real = parse(capture_text(cap.path))
    sim = parse(serve(tmp_path, debs, cap))
    names = [n for n in (cap.families or real) if n not in cap.ignore_families]
    assert [n for n in sim if n in names or not cap.families] == [n for n in real if n in names], (
        "the same families, in the same order"
    )
    for name in names:
        r, s = real[name], sim[name]
        if "help" in r:  # an excerpt keeps the series only
            assert (s.get("help"), s.get("type")) == (r.get("help"), r.get("type")), name

        def shape(series):
            return [([k for k, _ in labels if k not in cap.ignore_labels], where(labels),
                     value_form(v)) for labels, v in series]  # fmt: skip

        sim_series = s["series"]
        if cap.families:  # an excerpt: the series of the GPUs it kept
            kept = {where(labels)[0] for labels, _ in r["series"]}
            sim_series = [(labels, v) for labels, v in sim_series if where(labels)[0] in kept]
        assert shape(sim_series) == shape(r["series"]), name


def test_a_mig_instance_has_the_memory_of_its_profile() -> None:
    # the A800 scrape: FB_FREE + FB_USED of a 2g.20gb instance is 19967 MiB; the simulated
    # 2g.20gb (telegraf/a100-sxm4-v12.xml) has 19968 MiB, one of which is never free
    from deployer.lab.gpusim.models import MODELS

    real = parse(capture_text(SCRAPES[3].path))
    free = [float(v) for labels, v in real["DCGM_FI_DEV_FB_FREE"]["series"] if where(labels)[1]]
    used = [float(v) for labels, v in real["DCGM_FI_DEV_FB_USED"]["series"] if where(labels)[1]]
    total = MODELS["A800"].profile("2g.20gb").memory_mib
    assert {f + u for f, u in zip(free, used, strict=True)} == {total - 1}


@pytest.mark.parametrize("version", [e.version for e in EXPORTERS])
@pytest.mark.parametrize("name", ["default-counters.csv", "dcp-metrics-included.csv"])
def test_the_package_ships_upstreams_csv_of_its_release(tmp_path, debs, version, name) -> None:
    tag = {"4.7.1": "4.4.2-4.7.1", "4.8.2": "4.5.3-4.8.2", "4.8.3": "HEAD"}[version]
    unpack([p for p in debs if p.name.startswith(f"{exporter_pkg(version)}-")], tmp_path)
    shipped = (tmp_path / "etc/dcgm-exporter" / name).read_bytes()
    assert shipped == capture(f"dcgm-exporter/{tag}__{name}").read_bytes()


@pytest.mark.parametrize(("version", "commit"), [("4.7.1", "7ac2f778d507"),
                                                 ("4.8.2", "ec245c09fe3e")])  # fmt: skip
def test_the_field_names_are_go_dcgms_of_the_release(version: str, commit: str) -> None:
    names = json.loads(capture_text("dcgm-exporter/go-dcgm-field-names.json"))[commit]
    real = {**names["current"], **names["legacy"]}
    sim = exporter_fields.field_names(version)
    ids = set(sim.values())
    assert sim == {n: i for n, i in real.items() if i in ids}


def test_4_6_field_renames_keep_the_old_names_as_aliases() -> None:
    names = exporter_fields.field_names("4.8.3")
    assert names["DCGM_FI_DEV_GPU_TEMP_CELSIUS"] == names["DCGM_FI_DEV_GPU_TEMP"] == 150
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS" not in exporter_fields.field_names("4.8.2")


@pytest.mark.parametrize(("version", "label"), [("4.7.1", "Hostname"), ("4.8.2", "Hostname"),
                                                ("4.8.3", "hostname")])  # fmt: skip
def test_the_host_label_is_named_as_the_release_names_it(tmp_path, debs, version, label) -> None:
    cap = Scrape(SCRAPES[0].path, "L40S", 1, "595.45.04", version)
    sim = parse(serve(tmp_path, debs, cap))
    [(labels, _)] = sim["DCGM_FI_DEV_GPU_TEMP"]["series"]
    assert [k for k, _ in labels][5] == label


def test_a_4_6_name_is_fatal_for_an_older_exporter(tmp_path: Path, debs) -> None:
    pkgs = (*smi_packages("580.65.06"), core_pkg("4.8.2"), exporter_pkg("4.8.2"))
    root = sim_host(tmp_path / "root", debs, pkgs, "H100", 1)
    (root / "etc/gpusim/new.csv").write_text("DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\n")
    res = run(root, ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{free_port()}", "-f",
                     "/etc/gpusim/new.csv"])  # fmt: skip
    assert res.returncode == 1
    assert "unknown ExporterCounter field 'DCGM_FI_DEV_GPU_TEMP_CELSIUS'" in res.stderr


def test_a_4_6_name_keeps_its_name_as_the_metric_name(tmp_path: Path, debs) -> None:
    pkgs = (*smi_packages("580.65.06"), core_pkg("4.8.3"), exporter_pkg("4.8.3"))
    root = sim_host(tmp_path / "root", debs, pkgs, "H100", 1)
    (root / "etc/gpusim/new.csv").write_text("DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\n"
                                             "DCGM_FI_DEV_GPU_TEMP, gauge, t\n")  # fmt: skip
    port = free_port()
    argv = ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{port}", "-f", "/etc/gpusim/new.csv"]
    with Daemon(root, argv, port):
        fams = parse(fetch(port))
    assert {"DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_GPU_TEMP"} <= set(fams)


@pytest.mark.parametrize("version", [e.version for e in EXPORTERS])
def test_every_field_upstream_ships_or_the_product_names_is_simulated(version: str) -> None:
    # the simulator knows only the fields it models (an unmodelled real field would be refused
    # like an unknown name), so every field of upstream's CSVs, commented-out ones included, and
    # of the product's catalogue has a simulated reading
    from deployer import dcgm_fields
    from deployer.lab.gpusim.standins.exporter import EXPORTER_METRICS, SPECS

    names = set(dcgm_fields.FIELDS)
    for tag in ("4.4.2-4.7.1", "4.5.3-4.8.2", "HEAD"):
        for csv_name in ("default-counters.csv", "dcp-metrics-included.csv"):
            text = capture_text(f"dcgm-exporter/{tag}__{csv_name}")
            names |= set(re.findall(r"^#?\s*(DCGM_(?:FI|EXP)_\w+)\s*,", text, re.M))
    known = exporter_fields.field_names(version)
    if version == "4.7.1":  # go-dcgm 7ac2f77 has no CLOCK_THROTTLE_REASONS alias: fatal there
        names.discard(exporter_fields.CLOCK_THROTTLE_REASONS)
    assert {n for n in names if n not in known and n not in EXPORTER_METRICS} == set()
    assert {n for n in names if n in known and known[n] not in SPECS} == set()
