"""The simulated nvidia-smi and kernel module, run from the built packages against a temp root."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.lab.gpusim import apply_fault, build_packages, hardware_for, prepare_root
from deployer.lab.gpusim.sandbox import pick, run, unpack

OPEN_580 = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
            "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip
PROPRIETARY_535 = ("libnvidia-ml1_535.54.03", "libcuda1_535.54.03", "nvidia-smi_535.54.03",
                   "nvidia-kernel-dkms_535.54.03")  # fmt: skip


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def host(tmp_path: Path, debs: list[Path], packages=OPEN_580, model="H100", count=8) -> Path:
    root = tmp_path / "root"
    unpack(pick(debs, *packages), root)
    prepare_root(root, hardware_for(model, count, "gpu01", model in ("H100", "H200")))
    return root


def smi(root: Path, *args: str):
    return run(root, ["/usr/bin/nvidia-smi", *args])


def test_list_shows_every_described_gpu(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    res = smi(root, "-L")
    hw = hardware_for("H100", 8, "gpu01", True)
    assert res.returncode == 0
    assert res.stdout.splitlines() == [
        f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" for g in hw["gpus"]
    ]


@pytest.mark.parametrize(
    ("fmt", "expected_first_lines"),
    [
        ("csv", ["index, name, memory.total [MiB], driver_version, mig.mode.current",
                 "0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06, Disabled"]),
        ("csv,noheader", ["0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06, Disabled"]),
        ("csv,noheader,nounits", ["0, NVIDIA H100 80GB HBM3, 81559, 580.65.06, Disabled"]),
        ("csv,nounits", ["index, name, memory.total [MiB], driver_version, mig.mode.current",
                         "0, NVIDIA H100 80GB HBM3, 81559, 580.65.06, Disabled"]),
    ],
)  # fmt: skip
def test_query_gpu_formats(tmp_path: Path, debs, fmt: str, expected_first_lines: list[str]) -> None:
    root = host(tmp_path, debs)
    res = smi(
        root,
        "--query-gpu=index,name,memory.total,driver_version,mig.mode.current",
        f"--format={fmt}",
    )
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert lines[: len(expected_first_lines)] == expected_first_lines
    assert len(lines) == 8 + (0 if "noheader" in fmt else 1)


def test_query_gpu_reports_uuid_and_bus_id_of_the_description(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    res = smi(root, "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader")
    hw = hardware_for("H100", 8, "gpu01", True)
    assert res.stdout.splitlines() == [f"{g['uuid']}, {g['pci_bus_id']}" for g in hw["gpus"]]


def test_one_gpu_can_be_selected_with_i(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    assert smi(root, "-i", "3", "--query-gpu=index", "--format=csv,noheader").stdout == "3\n"


def test_volta_has_no_mig_mode(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, PROPRIETARY_535, model="V100")
    res = smi(root, "--query-gpu=name,mig.mode.current", "--format=csv,noheader")
    assert res.stdout.splitlines()[0] == "Tesla V100-SXM2-32GB, [N/A]"


def test_an_unknown_field_is_refused_like_the_real_tool(tmp_path: Path, debs) -> None:
    res = smi(host(tmp_path, debs), "--query-gpu=index,bogus", "--format=csv")
    assert res.returncode == 2
    assert 'Field "bogus" is not a valid field to query.' in res.stdout


def test_no_compute_apps_prints_nothing(tmp_path: Path, debs) -> None:
    res = smi(
        host(tmp_path, debs),
        "--query-compute-apps=pid,process_name,used_memory",
        "--format=csv,noheader",
    )
    assert (res.returncode, res.stdout) == (0, "")


def test_gpu_jobs_show_as_compute_apps(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    apply_fault(
        root,
        "gpu-jobs",
        {"gpu": 2, "pid": 4242, "process_name": "train.py", "used_memory_mib": 30000},
    )
    res = smi(root, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    assert res.stdout == "4242, train.py, 30000 MiB\n"


def test_temperature_fault_shows_in_the_query(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    apply_fault(root, "gpu-temp", {"gpu": 1, "value": 92})
    res = smi(root, "-i", "1", "--query-gpu=temperature.gpu", "--format=csv,noheader")
    assert res.stdout == "92\n"


def test_a_missing_gpu_is_no_longer_listed(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    apply_fault(root, "gpu-missing", {"gpu": 5})
    listed = [line.split(":")[0] for line in smi(root, "-L").stdout.splitlines()]
    assert listed == [f"GPU {i}" for i in (0, 1, 2, 3, 4, 6, 7)]


def test_table_shows_driver_and_cuda_version(tmp_path: Path, debs) -> None:
    res = smi(host(tmp_path, debs))
    assert res.returncode == 0
    assert "Driver Version: 580.65.06" in res.stdout and "CUDA Version: 13.0" in res.stdout
    assert "SIMULATED" in res.stdout


@pytest.mark.parametrize(("packages", "cuda"), [(PROPRIETARY_535, "12.2"), (OPEN_580, "13.0")])
def test_q_reports_the_cuda_version_of_the_branch(
    tmp_path: Path, debs, packages, cuda: str
) -> None:
    out = smi(host(tmp_path, debs, packages), "-q").stdout
    assert f"\nCUDA Version                                           : {cuda}\n" in out


def test_first_use_loads_the_module_and_writes_proc_version_open_wording(
    tmp_path: Path, debs
) -> None:
    root = host(tmp_path, debs)
    smi(root, "-L")
    text = (root / "run/gpusim/proc-driver/nvidia/version").read_text()
    assert text.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  ")


def test_proprietary_module_has_the_proprietary_wording(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, PROPRIETARY_535, model="V100")
    assert run(root, ["/usr/libexec/gpusim/nvidia-module-load"]).returncode == 0
    text = (root / "run/gpusim/proc-driver/nvidia/version").read_text()
    assert text.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  ")


def test_nvswitch_devices_appear_with_the_module(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    run(root, ["/usr/libexec/gpusim/nvidia-module-load"])
    assert len(list((root / "run/gpusim/proc-driver/nvidia-nvswitch/devices").iterdir())) == 4


def test_upgrade_without_reboot_is_a_version_mismatch(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    assert smi(root, "-L").returncode == 0  # 580.65.06 loaded
    unpack(pick(debs, "libnvidia-ml1_580.126.20", "libcuda1_580.126.20", "nvidia-smi_580.126.20",
                "nvidia-kernel-open-dkms_580.126.20"), root)  # fmt: skip
    res = smi(root, "--query-gpu=driver_version", "--format=csv,noheader")
    assert res.returncode == 18
    assert (
        res.stdout
        == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.126.20\n"
    )
    assert "580.65.06" in (root / "run/gpusim/proc-driver/nvidia/version").read_text()


def test_after_reboot_the_new_driver_is_loaded(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    smi(root, "-L")
    unpack(pick(debs, *(p.replace("580.65.06", "595.45.04") for p in OPEN_580)), root)
    for p in (root / "run").rglob("*"):  # a reboot empties /run
        if p.is_file():
            p.unlink()
    assert run(root, ["/usr/libexec/gpusim/nvidia-module-load"]).returncode == 0
    res = smi(root, "--query-gpu=driver_version", "--format=csv,noheader")
    assert res.stdout.splitlines() == ["595.45.04"] * 8


def test_without_a_driver_nvidia_smi_cannot_communicate(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, ("libnvidia-ml1_580.65.06", "nvidia-smi_580.65.06"))
    res = smi(root, "-L")
    assert res.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in res.stdout


def test_version_and_help_say_simulated(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    assert "SIMULATED" in smi(root, "--version").stdout
    assert "SIMULATED" in smi(root, "-h").stdout


MIG_HOST = {0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}  # gpu05 of the default lab


def mig_host(tmp_path: Path, debs) -> Path:
    root = tmp_path / "root"
    unpack(pick(debs, *OPEN_580), root)
    prepare_root(root, hardware_for("H100", 2, "gpu05", False, MIG_HOST))
    return root


def test_the_facts_query_tells_which_gpu_is_in_mig_mode(tmp_path: Path, debs) -> None:
    fields = "index,uuid,name,memory.total,pci.bus_id,mig.mode.current,driver_version"
    out = smi(mig_host(tmp_path, debs), f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    gpus = hardware_for("H100", 2, "gpu05", False, MIG_HOST)["gpus"]
    assert out.stdout.splitlines() == [
        f"{g['index']}, {g['uuid']}, NVIDIA H100 80GB HBM3, 81559, {g['pci_bus_id']}, {mode}, "
        "580.65.06"
        for g, mode in zip(gpus, ("Enabled", "Disabled"), strict=True)
    ]


def test_list_shows_the_mig_devices_under_their_gpu(tmp_path: Path, debs) -> None:
    lines = smi(mig_host(tmp_path, debs), "-L").stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == [
        "GPU 0", "  MIG 3g.40gb     Device  0", "  MIG 2g.20gb     Device  1",
        "  MIG 1g.10gb     Device  2", "  MIG 1g.10gb     Device  3", "GPU 1"]  # fmt: skip


def test_a_mig_gpu_has_no_utilisation_and_no_remapped_rows(tmp_path: Path, debs) -> None:
    out = smi(mig_host(tmp_path, debs), "--query-gpu=utilization.gpu,remapped_rows.pending",
              "--format=csv,noheader")  # fmt: skip
    assert out.stdout.splitlines() == ["[N/A], [N/A]", "0 %, No"]


def test_a_board_without_a_memory_sensor_reads_n_a(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, model="L40S", count=2)
    out = smi(root, "--query-gpu=temperature.memory,mig.mode.current", "--format=csv,noheader")
    assert out.stdout.splitlines() == ["N/A, [N/A]"] * 2
