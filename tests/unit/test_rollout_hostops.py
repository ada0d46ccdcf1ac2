"""On-host shell of the rollout: the probe's output parsed, the exporter's driver label read, the
services stopped in NVIDIA's order, and the GPU-job probe run for real in a shell."""

from __future__ import annotations

import subprocess

from deployer.rollout import hostops

PROBE_OUT = """\
@@loaded
580.126.20
@@smi
580.126.20, GPU-aaa
580.126.20, GPU-bbb
@@smi_rc=0
@@health
Health Monitor Report: Healthy
@@health_rc=0
@@diag
software ... Fail: GPU 1: validation failure injected by the gpumon-deploy lab
@@diag_rc=226
"""


def test_the_probe_output_is_parsed_per_section():
    p = hostops.parse_probe(PROBE_OUT)
    assert p.loaded == "580.126.20"
    assert p.smi_versions == ("580.126.20", "580.126.20")
    assert p.smi_uuids == ("GPU-aaa", "GPU-bbb")
    assert (p.smi_rc, p.health_rc, p.diag_rc) == (0, 0, 226)
    assert "validation failure" in p.diag_output


def test_a_failing_nvidia_smi_gives_no_gpus_and_its_error():
    out = (
        "@@loaded\n535.54.03\n@@smi\nFailed to initialize NVML: Driver/library version mismatch\n"
        "@@smi_rc=18\n@@health\n@@health_rc=247\n@@diag\n@@diag_rc=skipped\n"
    )
    p = hostops.parse_probe(out)
    assert p.smi_uuids == () and "version mismatch" in p.smi_error
    assert p.diag_rc is None and p.health_rc == 247


def test_the_probe_script_runs_diag_only_when_asked():
    assert "dcgmi diag -r 2" in hostops.probe_script(2)
    assert "dcgmi diag" not in hostops.probe_script(0)


def test_the_exporter_driver_label_and_gpus_are_read_from_metrics():
    metrics = (
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",DCGM_FI_DRIVER_VERSION="580.126.20"} 40\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbb",DCGM_FI_DRIVER_VERSION="580.126.20"} 41\n'
        '# DCGM_FI_DRIVER_VERSION="535.54.03" in a comment does not count\n'
    )
    assert hostops.exporter_driver_labels(metrics) == ({"580.126.20"}, {"GPU-aaa", "GPU-bbb"})


def test_services_stop_exporter_first_then_dcgm_persistenced_fabric_manager():
    script = hostops.stop_services_script()
    order = [script.index(s) for s in hostops.GPU_SERVICES]
    assert order == sorted(order)
    assert hostops.GPU_SERVICES[0] == "dcgm-exporter.service"
    assert hostops.GPU_SERVICES[-1] == "nvidia-fabricmanager.service"


def _jobs(tmp_path, smi_body: str, smi_rc: int = 0) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{smi_body}'\nexit {smi_rc}\n")
    smi.chmod(0o755)
    script = hostops.jobs_script(str(tmp_path / "absent-check"))
    return subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": f"{bindir}:/usr/bin:/bin"},
        check=False,
    )


def test_no_compute_process_is_idle(tmp_path):
    assert _jobs(tmp_path, "").returncode == 0


def test_a_compute_process_is_busy_and_listed(tmp_path):
    r = _jobs(tmp_path, "4242, python3, 1024 MiB\n")
    assert r.returncode == 3 and "4242, python3" in r.stdout


def test_nvidia_smi_failing_is_an_error_not_idle(tmp_path):
    r = _jobs(tmp_path, "Failed to initialize NVML", smi_rc=18)
    assert r.returncode == 2
