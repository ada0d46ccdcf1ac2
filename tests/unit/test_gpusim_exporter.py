"""The simulated dcgm-exporter: a real HTTP server, its exposition parsed with prometheus_client."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest

from deployer.lab.gpusim import apply_fault, build_packages, hardware_for, heal, prepare_root
from deployer.lab.gpusim.sandbox import Daemon, free_port, pick, run, unpack

prometheus_parser = pytest.importorskip("prometheus_client.parser")

DRIVER_580 = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
              "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip
CORE = "datacenter-gpu-manager-4-core_4.4.2"
EXPORTER = "datacenter-gpu-manager-exporter_4.7.1"
DEFAULT_ENABLED = [
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
]  # fmt: skip
EXTRA_CSV = """# test collectors
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_EXP_XID_ERRORS_COUNT, gauge, XID errors observed during the configured time window.
DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION, label, Driver Version
"""


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def host(tmp_path: Path, debs, model: str = "H100", count: int = 8) -> Path:
    root = tmp_path / "root"
    unpack(pick(debs, *DRIVER_580, CORE, EXPORTER), root)
    prepare_root(root, hardware_for(model, count, "gpu01", model == "H100"))
    (root / "etc/gpusim/extra.csv").write_text(EXTRA_CSV)
    return root


def exporter(root: Path, port: int, *args: str) -> Daemon:
    return Daemon(root, ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{port}", *args], port)


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()


def families(text: str) -> dict:
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def samples(text: str, name: str) -> list:
    fam = families(text).get(name)
    return fam.samples if fam else []


def wait_for(port: int, predicate, timeout: float = 3.0) -> str:
    deadline = time.monotonic() + timeout
    text = scrape(port)
    while not predicate(text) and time.monotonic() < deadline:
        time.sleep(0.1)
        text = scrape(port)
    return text


@pytest.fixture
def served(tmp_path: Path, debs):
    root = host(tmp_path, debs)
    port = free_port()
    with exporter(root, port, "-f", "/etc/dcgm-exporter/default-counters.csv"):
        yield root, port


#: blank until the first XID, as the L40S scrape shows (no series without an event)
BLANK_UNTIL_EVENT = ("DCGM_FI_DEV_XID_ERRORS",)


def test_every_upstream_default_counter_is_served_for_every_gpu(served) -> None:
    _, port = served
    fams = families(scrape(port))
    for name in DEFAULT_ENABLED:
        if name in BLANK_UNTIL_EVENT:
            assert name not in fams, name
            continue
        assert name in fams, name
        assert len(fams[name].samples) == 8, name


def test_the_last_xid_appears_with_its_code_and_message(served) -> None:
    # gpu_collector.go:323-331 @691c927: err_code / err_msg attributes on DCGM_FI_DEV_XID_ERRORS
    root, port = served
    apply_fault(root, "xid", {"gpu": 1, "xid": 79})
    text = wait_for(port, lambda t: bool(samples(t, "DCGM_FI_DEV_XID_ERRORS")))
    [s] = samples(text, "DCGM_FI_DEV_XID_ERRORS")
    assert s.value == 79
    assert (s.labels["gpu"], s.labels["err_code"], s.labels["err_msg"]) == (
        "1",
        "79",
        "GPU has fallen off the bus",
    )
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_XID_ERRORS{"))
    assert line.endswith(',DCGM_FI_DRIVER_VERSION="580.65.06",err_code="79",'
                         'err_msg="GPU has fallen off the bus"} 79')  # fmt: skip


def test_types_and_help_come_from_the_csv(served) -> None:
    _, port = served
    fams = families(scrape(port))
    assert fams["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert fams["DCGM_FI_DEV_GPU_TEMP"].documentation == "GPU temperature (in C)."
    energy = fams.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert energy.type == "counter"


def test_series_carry_the_real_labels(served) -> None:
    _, port = served
    hw = hardware_for("H100", 8, "gpu01", True)
    for s in samples(scrape(port), "DCGM_FI_DEV_GPU_TEMP"):
        g = hw["gpus"][int(s.labels["gpu"])]
        assert s.labels == {"gpu": str(g["index"]), "UUID": g["uuid"], "pci_bus_id": g["pci_bus_id"],
                            "device": f"nvidia{g['index']}", "modelName": "NVIDIA H100 80GB HBM3",
                            "Hostname": "gpu01", "DCGM_FI_DRIVER_VERSION": "580.65.06"}  # fmt: skip


def test_the_exposition_says_it_is_simulated(served) -> None:
    _, port = served
    assert scrape(port).startswith("# SIMULATED")


def test_health_endpoint_answers_ok(served) -> None:
    _, port = served
    assert scrape(port, "/health") == "OK"


@pytest.mark.parametrize(
    ("kind", "params", "metric", "gpu", "value"),
    [
        ("gpu-temp", {"gpu": 2, "value": 94}, "DCGM_FI_DEV_GPU_TEMP", "2", 94),
        ("memory-temp", {"gpu": 0, "value": 101}, "DCGM_FI_DEV_MEMORY_TEMP", "0", 101),
        ("ecc-dbe", {"gpu": 5, "count": 2}, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "5", 2),
        ("ecc-dbe", {"gpu": 1, "count": 3}, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "1", 3),
        ("ecc-dbe", {"gpu": 1, "row_remap_failure": True}, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1", 1),
        ("gpu-jobs", {"gpu": 7, "used_memory_mib": 40000}, "DCGM_FI_DEV_FB_USED", "7", 40000),
    ],
)
def test_a_fault_changes_the_metric_within_seconds_and_heal_restores_it(
    served, kind: str, params: dict, metric: str, gpu: str, value: float
) -> None:
    root, port = served

    def current(text: str) -> float:
        return next(s.value for s in samples(text, metric) if s.labels["gpu"] == gpu)

    before = current(scrape(port))
    assert before != value
    apply_fault(root, kind, params)
    assert current(wait_for(port, lambda t: current(t) == value)) == value
    heal(root)
    assert current(wait_for(port, lambda t: current(t) == before)) == before


def test_a_missing_gpu_loses_its_series_and_gets_them_back_after_heal(served) -> None:
    root, port = served
    apply_fault(root, "gpu-missing", {"gpu": 4})
    text = wait_for(port, lambda t: len(samples(t, "DCGM_FI_DEV_GPU_TEMP")) == 7)
    assert "4" not in {s.labels["gpu"] for s in samples(text, "DCGM_FI_DEV_GPU_TEMP")}
    heal(root)
    assert len(samples(wait_for(port, lambda t: len(samples(t, "DCGM_FI_DEV_GPU_TEMP")) == 8),
                       "DCGM_FI_DEV_GPU_TEMP")) == 8  # fmt: skip


def test_only_the_fields_of_the_csv_are_emitted(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    port = free_port()
    with exporter(root, port, "-f", "/etc/gpusim/extra.csv"):
        names = set(families(scrape(port)))
    assert names == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                     "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ROW_REMAP_FAILURE"}  # fmt: skip


def test_the_xid_count_metric_counts_xids_in_the_window(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    port = free_port()
    with exporter(root, port, "-f", "/etc/gpusim/extra.csv", "-c", "60000"):
        quiet = samples(scrape(port), "DCGM_EXP_XID_ERRORS_COUNT")
        apply_fault(root, "xid", {"gpu": 3, "xid": 48})
        apply_fault(root, "xid", {"gpu": 3, "xid": 48})
        text = wait_for(port, lambda t: any("xid" in s.labels
                                            for s in samples(t, "DCGM_EXP_XID_ERRORS_COUNT")))  # fmt: skip
    # a zero series per GPU without XIDs, labelled with the window only (expcollector.go:101-104)
    assert len(quiet) == 8 and {s.value for s in quiet} == {0}
    assert all("xid" not in s.labels and s.labels["window_size_in_ms"] == "300000" for s in quiet)
    [s] = [s for s in samples(text, "DCGM_EXP_XID_ERRORS_COUNT") if s.labels["gpu"] == "3"]
    assert (s.labels["xid"], s.labels["window_size_in_ms"], s.value) == ("48", "300000", 2)


def test_row_remap_fields_are_absent_on_volta(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, model="V100")
    port = free_port()
    with exporter(root, port):
        fams = families(scrape(port))
    assert "DCGM_FI_DEV_GPU_TEMP" in fams
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" not in fams
    assert {s.labels["modelName"] for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples} == {
        "Tesla V100-SXM2-32GB"
    }


def test_the_no_hostname_flag_changes_nothing_in_4_x(tmp_path: Path, debs) -> None:
    # NoHostname is parsed but read nowhere (git grep NoHostname at 4.4.2-4.7.1 and 691c927)
    root = host(tmp_path, debs, count=1)
    port = free_port()
    with exporter(root, port, "-n"):
        [s] = samples(scrape(port), "DCGM_FI_DEV_GPU_TEMP")
    assert s.labels["Hostname"] == "gpu01"


def test_remote_mode_refuses_to_start_without_a_host_engine(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    argv = [
        "/usr/bin/dcgm-exporter",
        "-a",
        f"127.0.0.1:{free_port()}",
        "-r",
        f"localhost:{free_port()}",
    ]
    started = time.monotonic()
    res = run(root, argv, timeout=20, env={"GPUSIM_HOSTENGINE_WAIT_S": "1"})
    assert time.monotonic() - started < 10
    assert res.returncode == 1
    assert "Error connecting to nv-hostengine" in res.stderr


def test_remote_mode_serves_through_a_running_host_engine(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    he_port, port = free_port(), free_port()
    he = Daemon(
        root, ["/usr/bin/nv-hostengine", "-n", "-p", str(he_port), "--pid", "/run/he.pid"], he_port
    )
    with he, exporter(root, port, "-r", f"127.0.0.1:{he_port}"):
        assert len(samples(scrape(port), "DCGM_FI_DEV_GPU_TEMP")) == 8


def test_with_a_remote_host_engine_the_host_label_is_the_host_part_of_r(tmp_path, debs) -> None:
    # hostname.GetHostname (internal/pkg/hostname/hostname.go:29-50): outside Kubernetes, -r
    # localhost:5555 labels every host's series Hostname="localhost"
    root = host(tmp_path, debs, count=1)
    he_port, port = free_port(), free_port()
    he = Daemon(
        root, ["/usr/bin/nv-hostengine", "-n", "-p", str(he_port), "--pid", "/run/he.pid"], he_port
    )
    with he, exporter(root, port, "-r", f"localhost:{he_port}"):
        [s] = samples(scrape(port), "DCGM_FI_DEV_GPU_TEMP")
    assert s.labels["Hostname"] == "localhost"


def test_remote_mode_waits_briefly_for_a_host_engine_that_is_starting(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    he_port, port = free_port(), free_port()
    he = Daemon(
        root, ["/usr/bin/nv-hostengine", "-n", "-p", str(he_port), "--pid", "/run/he.pid"], he_port
    )
    late_start = threading.Timer(1.0, he.__enter__)
    late_start.start()
    try:
        with exporter(root, port, "-r", f"127.0.0.1:{he_port}"):
            assert len(samples(scrape(port), "DCGM_FI_DEV_GPU_TEMP")) == 8
    finally:
        late_start.join()
        he.__exit__(None, None, None)


def test_an_unknown_field_in_the_csv_stops_the_exporter(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    (root / "etc/gpusim/bad.csv").write_text("DCGM_FI_DEV_NOPE, gauge, nope\n")
    res = run(
        root,
        ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{free_port()}", "-f", "/etc/gpusim/bad.csv"],
    )
    assert res.returncode == 1
    assert ('level=ERROR msg="could not find DCGM field; err: unknown ExporterCounter field '
            "'DCGM_FI_DEV_NOPE'\"") in res.stderr  # fmt: skip


@pytest.mark.parametrize("name", ["DCGM_EXP_XID_ERRORS_TOTAL", "DCGM_EXP_CLOCK_EVENTS_TOTAL"])
def test_only_the_four_exporter_metrics_exist(tmp_path: Path, debs, name: str) -> None:
    root = host(tmp_path, debs)
    (root / "etc/gpusim/bad.csv").write_text(f"{name}, counter, nope\n")
    res = run(
        root,
        ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{free_port()}", "-f", "/etc/gpusim/bad.csv"],
    )
    assert res.returncode == 1
    assert f"unknown ExporterCounter field '{name}'" in res.stderr


def test_version_names_the_release_tag(tmp_path: Path, debs) -> None:
    out = run(host(tmp_path, debs), ["/usr/bin/dcgm-exporter", "--version"]).stdout
    assert out.startswith("dcgm-exporter version 4.4.2-4.7.1\n")
    assert "SIMULATED" in out


MIG_HOST = {0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}  # gpu05 of the default lab


@pytest.fixture
def mig_served(tmp_path: Path, debs):
    root = tmp_path / "root"
    unpack(pick(debs, *DRIVER_580, CORE, EXPORTER), root)
    prepare_root(root, hardware_for("H100", 2, "gpu05", False, MIG_HOST))
    (root / "etc/gpusim/extra.csv").write_text(EXTRA_CSV + "DCGM_FI_DEV_FB_FREE, gauge, free\n"
                                               "DCGM_FI_DEV_GPU_UTIL, gauge, util\n")  # fmt: skip
    port = free_port()
    with exporter(root, port, "-f", "/etc/gpusim/extra.csv"):
        yield root, port


def where(s) -> tuple:
    return (s.labels["gpu"], s.labels.get("GPU_I_ID"), s.labels.get("GPU_I_PROFILE"))


def test_a_mig_gpu_is_reported_per_gpu_instance(mig_served) -> None:
    # device_monitoring.go:97-128 @691c927: with the default -d f, a GPU in MIG mode is its
    # GPU instances
    _, port = mig_served
    text = scrape(port)
    assert [where(s) for s in samples(text, "DCGM_FI_DEV_GPU_TEMP")] == [
        ("0", "2", "3g.40gb"), ("0", "3", "2g.20gb"), ("0", "9", "1g.10gb"), ("0", "10", "1g.10gb"),
        ("1", None, None)]  # fmt: skip
    assert [where(s) for s in samples(text, "DCGM_FI_DEV_GPU_UTIL")] == [("1", None, None)]
    assert [where(s)[0] for s in samples(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE")] == ["1"]
    free = {where(s)[1]: s.value for s in samples(text, "DCGM_FI_DEV_FB_FREE")}
    assert free["2"] < 40448 and free[None] > 80000


def test_an_xid_on_a_mig_gpu_shows_on_each_of_its_instances(mig_served) -> None:
    root, port = mig_served
    apply_fault(root, "xid", {"gpu": 0, "xid": 43})
    text = wait_for(port, lambda t: bool(samples(t, "DCGM_FI_DEV_XID_ERRORS")))
    xids = samples(text, "DCGM_FI_DEV_XID_ERRORS")
    assert [(where(s)[1], s.labels["err_code"], s.value) for s in xids] == [
        ("2", "43", 43), ("3", "43", 43), ("9", "43", 43), ("10", "43", 43)]  # fmt: skip
    counts = samples(text, "DCGM_EXP_XID_ERRORS_COUNT")
    assert [(where(s)[:2], s.labels.get("xid"), s.value) for s in counts] == [
        (("0", "2"), "43", 1), (("0", "3"), "43", 1), (("0", "9"), "43", 1),
        (("0", "10"), "43", 1), (("1", None), None, 0)]  # fmt: skip


def test_a_board_without_a_memory_sensor_reads_zero(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, model="L40S", count=2)
    port = free_port()
    with exporter(root, port):
        fams = families(scrape(port))
    assert [s.value for s in fams["DCGM_FI_DEV_MEMORY_TEMP"].samples] == [0, 0]
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in fams
