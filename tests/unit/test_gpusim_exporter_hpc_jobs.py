"""The simulated dcgm-exporter's ``--hpc-job-mapping-dir``: the hpcMapper transformation of
NVIDIA/dcgm-exporter (``internal/pkg/transformation/hpc.go`` @691c927, tag 4.5.3-4.8.2, and
@b921c57, tag 4.4.2-4.7.1), read at every scrape, as the real exporter reads it."""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path

import pytest

from deployer.lab.gpusim import build_packages, hardware_for, prepare_root
from deployer.lab.gpusim.sandbox import Daemon, free_port, pick, unpack

prometheus_parser = pytest.importorskip("prometheus_client.parser")

DRIVER = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
          "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip
RELEASES = {
    "4.4.2-4.7.1": ("datacenter-gpu-manager-4-core_4.4.2", "datacenter-gpu-manager-exporter_4.7.1"),
    "4.5.3-4.8.2": ("datacenter-gpu-manager-4-core_4.5.3", "datacenter-gpu-manager-exporter_4.8.2"),
}
CSV = """DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_EXP_XID_ERRORS_COUNT, gauge, XID errors observed during the configured time window.
DCGM_FI_DRIVER_VERSION, label, Driver Version
"""
MAP = "/run/gpumon/dcgm-job-map"
MIG = {0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}  # GI ids 2, 3, 9, 10


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def host(tmp_path: Path, debs, release: str = "4.5.3-4.8.2", count: int = 4, mig=None) -> Path:
    root = tmp_path / "root"
    unpack(pick(debs, *DRIVER, *RELEASES[release]), root)
    prepare_root(root, hardware_for("H100", count, "gpu01", False, mig))
    (root / "etc/gpusim/jobs.csv").write_text(CSV)
    return root


def exporter(root: Path, port: int, *args: str) -> Daemon:
    argv = ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{port}", "-f", "/etc/gpusim/jobs.csv"]
    return Daemon(root, [*argv, *args], port)


def jobs_dir(root: Path) -> Path:
    d = root / MAP.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    return d


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def temps(text: str) -> list[tuple[str, str | None, str | None]]:
    """(gpu, GPU_I_ID, hpc_job) of every DCGM_FI_DEV_GPU_TEMP series, in exposition order."""
    fams = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
    return [
        (s.labels["gpu"], s.labels.get("GPU_I_ID"), s.labels.get("hpc_job"))
        for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples
    ]


def test_without_the_option_no_series_has_a_job(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    (jobs_dir(root) / "1").write_text("42\n")
    port = free_port()
    with exporter(root, port):
        assert [job for _, _, job in temps(scrape(port))] == [None] * 4


def test_each_series_of_a_listed_gpu_carries_its_job(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    (jobs_dir(root) / "1").write_text("42\n")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert temps(scrape(port)) == [
            ("0", None, None), ("1", None, "42"), ("2", None, None), ("3", None, None)]  # fmt: skip


def test_the_job_is_rendered_after_the_labels_and_sorted_with_the_attributes(
    tmp_path: Path, debs
) -> None:
    # render_metrics.go:47-54 @691c927: fixed labels, label fields, then attributes by name
    # (err_code, err_msg from gpu_collector.go:323-331, hpc_job from hpc.go:119)
    from deployer.lab.gpusim import apply_fault

    root = host(tmp_path, debs)
    (jobs_dir(root) / "1").write_text("42\n")
    apply_fault(root, "xid", {"gpu": 1, "xid": 79})
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        text = scrape(port)
    temp = next(ln for ln in text.splitlines() if ln.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="1"'))
    assert ',Hostname="gpu01",DCGM_FI_DRIVER_VERSION="580.65.06",hpc_job="42"} ' in temp
    xid = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_XID_ERRORS{"))
    assert 'err_code="79",err_msg="GPU has fallen off the bus",hpc_job="42"} 79' in xid
    count = next(ln for ln in text.splitlines()
                 if ln.startswith('DCGM_EXP_XID_ERRORS_COUNT{gpu="1"'))  # fmt: skip
    assert ',window_size_in_ms="300000",xid="79",hpc_job="42"} 1' in count


def test_a_gpu_with_two_jobs_has_every_series_twice(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    (jobs_dir(root) / "2").write_text("7\n8\n")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert [t for t in temps(scrape(port)) if t[0] == "2"] == [
            ("2", None, "7"), ("2", None, "8")]  # fmt: skip


def test_an_empty_file_leaves_the_gpus_series_unlabelled(tmp_path: Path, debs) -> None:
    # hpc.go:107 `exists && len(jobs) != 0` (since 4.3.1-4.4.0, fe52755): the epilog empties
    # a GPU's file rather than removing it
    root = host(tmp_path, debs)
    (jobs_dir(root) / "0").write_text("")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert temps(scrape(port))[0] == ("0", None, None)


def test_the_file_is_read_at_every_scrape(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    d = jobs_dir(root)
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP, "-c", "60000"):
        assert temps(scrape(port))[3] == ("3", None, None)
        (d / "3").write_text("99\n")
        assert temps(scrape(port))[3] == ("3", None, "99")
        (d / "3").write_text("")
        assert temps(scrape(port))[3] == ("3", None, None)


@pytest.mark.parametrize("name", [".3.1234", ".lock", "gpu3", "3.txt", "03"])
def test_files_not_named_after_a_gpu_label_nothing(tmp_path: Path, debs, name: str) -> None:
    # hpc.go:165 ^\d+(\.\d+)?$ ("03" passes it but is no gpu label; the prolog's temporary
    # files are dot files)
    root = host(tmp_path, debs)
    (jobs_dir(root) / name).write_text("5\n")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert [job for _, _, job in temps(scrape(port))] == [None] * 4


def test_the_directory_may_come_after_the_exporter(tmp_path: Path, debs) -> None:
    # hpc.go:39-69: missing at start, ignored silently until it exists
    root = host(tmp_path, debs)
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert len(temps(scrape(port))) == 4
        (jobs_dir(root) / "0").write_text("11\n")
        assert temps(scrape(port))[0] == ("0", None, "11")


def test_the_environment_variable_sets_the_directory(tmp_path, debs, monkeypatch) -> None:
    # pkg/cmd/app.go:288-291 @691c927: EnvVars DCGM_HPC_JOB_MAPPING_DIR
    root = host(tmp_path, debs)
    (jobs_dir(root) / "0").write_text("12\n")
    monkeypatch.setenv("DCGM_HPC_JOB_MAPPING_DIR", MAP)
    port = free_port()
    with exporter(root, port):
        assert temps(scrape(port))[0] == ("0", None, "12")


def test_a_listed_file_that_cannot_be_opened_fails_the_whole_scrape(tmp_path, debs) -> None:
    # hpc.go:80-84 returns readFile's error, server.go:308-320 returns it, the handler answers
    # 500: a link whose target is gone stands for a file removed between listing and opening
    root = host(tmp_path, debs)
    d = jobs_dir(root)
    (d / "1").write_text("42\n")
    os.symlink("/nonexistent/gone", d / "2")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        with pytest.raises(urllib.error.HTTPError) as failed:
            scrape(port)
        assert failed.value.code == 500
        assert failed.value.read() == b"internal server error\n"
        (d / "2").unlink()
        assert temps(scrape(port))[1] == ("1", None, "42")


def test_from_4_8_2_a_mig_instance_is_keyed_gpu_dot_instance(tmp_path, debs) -> None:
    # hpc.go:98-105 @691c927 (NVIDIA/dcgm-exporter#602): "<gpu>.<GPU_I_ID>" for an instance;
    # the GPU's own file names no instance series
    root = host(tmp_path, debs, count=2, mig=MIG)
    d = jobs_dir(root)
    (d / "0.3").write_text("21\n")
    (d / "0").write_text("20\n")
    (d / "1").write_text("30\n")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert temps(scrape(port)) == [
            ("0", "2", None), ("0", "3", "21"), ("0", "9", None), ("0", "10", None),
            ("1", None, "30")]  # fmt: skip


def test_up_to_4_7_1_every_instance_of_a_mig_gpu_takes_the_gpus_file(tmp_path, debs) -> None:
    # hpc.go:97,176 @b921c57: keyed on the gpu label alone; "0.3" is no integer, skipped
    root = host(tmp_path, debs, release="4.4.2-4.7.1", count=2, mig=MIG)
    d = jobs_dir(root)
    (d / "0").write_text("20\n")
    (d / "0.3").write_text("21\n")
    port = free_port()
    with exporter(root, port, "--hpc-job-mapping-dir", MAP):
        assert temps(scrape(port)) == [
            ("0", "2", "20"), ("0", "3", "20"), ("0", "9", "20"), ("0", "10", "20"),
            ("1", None, None)]  # fmt: skip
