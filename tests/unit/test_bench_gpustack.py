"""bench.gpustack's pure parts: the floor script built from planned read scripts, the cold reset
script, the host fingerprint and its residue. No lab, no timings."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.gpustack import (
    GPU_PACKAGES,
    floor_script,
    floor_statuses,
    gpumon_argv,
    parse_fingerprint,
    reset_script,
    residue,
)

# ---- the floor ----------------------------------------------------------------------------------


def run_sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)


def test_the_floor_runs_the_facts_script_then_every_read_in_order():
    got = run_sh(floor_script("echo FACTS", ["echo one", "echo two"]))
    out = got.stdout
    assert out.index("FACTS") < out.index("one") < out.index("two")


def test_the_floor_reports_each_parts_exit_status_after_its_marker():
    got = run_sh(floor_script("true", ["exit 3", "echo ok"]))
    assert floor_statuses(got.stdout) == {"facts": 0, "read 0": 3, "read 1": 0}


def test_a_failing_read_does_not_stop_the_floor_and_the_floor_exits_zero():
    got = run_sh(floor_script("false", ["exit 7", "echo after"]))
    assert got.returncode == 0
    assert "after" in got.stdout


def test_the_floor_drops_the_reads_stderr_as_the_executor_batch_does():
    got = run_sh(floor_script("true", ["echo noise >&2"]))
    assert got.stderr == ""


def test_the_floor_keeps_a_read_script_with_its_own_quotes_and_newlines_intact():
    read = "x='a b'\nprintf '%s\\n' \"$x\""
    got = run_sh(floor_script("true", [read]))
    assert "a b\n" in got.stdout
    assert floor_statuses(got.stdout)["read 0"] == 0


def test_floor_statuses_of_output_without_markers_is_empty():
    assert floor_statuses("no markers here\n") == {}


# ---- the reset ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "package",
    [
        "nvidia-open",
        "nvidia-kernel-open-dkms",
        "nvidia-driver-pinning-595",
        "nvidia-fabricmanager",
        "libnvidia-nscq",
        "libnvidia-ml1",
        "libcuda1",
        "cuda-drivers",
        "cuda-drivers-535",
        "datacenter-gpu-manager-4-core",
        "datacenter-gpu-manager-4-cuda12",
        "datacenter-gpu-manager-exporter",
    ],
)
def test_the_reset_purges_every_package_the_gpu_roles_install(package):
    assert GPU_PACKAGES.match(package)


@pytest.mark.parametrize(
    "package", ["libc6", "systemd", "openssh-server", "python3", "libcudart12", "nvidia"]
)
def test_the_reset_leaves_the_base_systems_packages_alone(package):
    assert not GPU_PACKAGES.match(package)


def test_the_reset_shell_selects_the_same_packages_as_the_python_pattern():
    listing = "nvidia-smi ii \nlibc6 ii \ncuda-drivers-535 hi \nlibcudart12 ii \n"
    script = reset_script().splitlines()
    select = next(line for line in script if line.startswith("pkgs="))
    pipeline = select.split("| ", 1)[1].rstrip(")")
    got = subprocess.run(
        ["sh", "-c", pipeline], input=listing, capture_output=True, text=True, check=True
    )
    assert got.stdout.split() == ["nvidia-smi", "cuda-drivers-535"]


def test_the_reset_unholds_before_it_purges():
    script = reset_script()
    assert script.index("apt-mark unhold") < script.index(" purge ")


@pytest.mark.parametrize(
    "path",
    [
        "/etc/apt/sources.list.d/nvidia-cuda.sources",
        "/etc/apt/keyrings/nvidia-cuda.gpg",
        "/etc/apt/preferences.d/gpumon-nvidia-driver.pref",
        "/etc/apt/preferences.d/gpumon-dcgm.pref",
        "/etc/apt/preferences.d/gpumon-dcgm-exporter.pref",
        "/etc/modprobe.d/blacklist-nouveau.conf",
        "/etc/systemd/system/dcgm-exporter.service",
        "/etc/systemd/system/nvidia-dcgm.service.d",
        "/opt/node_exporter",
        "/usr/local/libexec/gpumon",
        "/var/lib/node_exporter",
    ],
)
def test_the_reset_removes_what_the_roles_write(path):
    assert f" {path} " in reset_script()


@pytest.mark.parametrize("user", ["dcgm-exporter", "node-exporter", "nvidia-dcgm"])
def test_the_reset_removes_the_users_the_roles_and_packages_create(user):
    assert f"userdel {user}" in reset_script()


def test_the_reset_unloads_the_simulated_module_and_reloads_systemd():
    script = reset_script()
    assert "umount /proc/driver" in script
    assert "rm -rf /run/gpusim" in script
    assert script.index("rm -rf /run/gpusim") < script.index("systemctl daemon-reload")


def test_the_reset_empties_apts_lists_and_cache_as_before_the_first_up():
    script = reset_script()
    assert "find /var/lib/apt/lists" in script
    assert "apt-get clean" in script


def test_the_reset_is_valid_shell():
    assert run_sh(f"sh -n <<'EOF'\n{reset_script()}\nEOF").returncode == 0


# ---- fingerprint and residue --------------------------------------------------------------------

FINGERPRINT = """@@packages
libc6 2.36-9 ii
@@holds
@@users
root:0:/root:/bin/bash
@@groups
root:0
@@paths
/etc d 755 root root
/var/lib/apt/lists/partial d 755 root root
@@unit-files
ssh.service enabled enabled
@@active
ssh.service
"""


def test_parse_fingerprint_splits_the_sections():
    fp = parse_fingerprint(FINGERPRINT)
    assert fp["packages"] == ["libc6 2.36-9 ii"]
    assert fp["holds"] == []
    assert fp["active"] == ["ssh.service"]


def test_parse_fingerprint_refuses_output_without_sections():
    with pytest.raises(ValueError, match="not a fingerprint"):
        parse_fingerprint("permission denied\n")


def test_the_same_fingerprint_has_no_residue():
    fp = parse_fingerprint(FINGERPRINT)
    assert residue(fp, fp) == []


def test_residue_names_what_is_new_and_what_is_gone():
    base = parse_fingerprint(FINGERPRINT)
    now = parse_fingerprint(
        FINGERPRINT.replace("libc6 2.36-9 ii", "libc6 2.36-9 ii\nnvidia-smi 595.45.04-1 ii")
        .replace(
            "root:0:/root:/bin/bash", "root:0:/root:/bin/bash\nnvidia-dcgm:997:/:/usr/sbin/nologin"
        )
        .replace("ssh.service enabled enabled\n", "")
    )
    assert residue(base, now) == [
        "+ packages: nvidia-smi 595.45.04-1 ii",
        "+ users: nvidia-dcgm:997:/:/usr/sbin/nologin",
        "- unit-files: ssh.service enabled enabled",
    ]


def test_residue_ignores_apts_own_locks_and_partial_directories():
    base = parse_fingerprint(FINGERPRINT)
    now = parse_fingerprint(
        FINGERPRINT.replace(
            "/var/lib/apt/lists/partial d 755 root root",
            "/var/lib/apt/lists/partial d 700 _apt root\n/var/lib/apt/lists/lock f 640 root root",
        )
    )
    assert residue(base, now) == []


def test_residue_ignores_sessions_of_the_bench_itself_but_not_services():
    base = parse_fingerprint(FINGERPRINT)
    now = parse_fingerprint(
        FINGERPRINT.replace("ssh.service\n", "ssh.service\nsession-4.scope\nnvidia-dcgm.service\n")
    )
    assert residue(base, now) == ["+ active: nvidia-dcgm.service"]


# ---- the command ------------------------------------------------------------------------------


def test_gpumon_runs_up_on_the_gpu_group_of_the_given_inventory_with_json(tmp_path):
    argv = gpumon_argv(tmp_path / "inv.yml", ["a=1"])
    assert argv[1:] == ["up", "-i", str(tmp_path / "inv.yml"), "--limit", "gpu", "-e", "a=1",
                        "--output", "json"]  # fmt: skip


def test_the_check_run_is_the_same_command_with_check():
    argv = gpumon_argv(Path("inv.yml"), [], check=True)
    assert "--check" in argv
    assert argv[-2:] == ["--output", "json"]
