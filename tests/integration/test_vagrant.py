"""The Vagrantfile: it validates, and it builds the same cluster as the lab's topology.

Needs the ``vagrant`` command (installed by scripts/setup); provider settings are validated too
when the vagrant-libvirt plugin is installed.  Booting VMs is the slow, opt-in tier
(GPUMON_VAGRANT=1) and not part of these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deployer.lab.topology import DEFAULT_TOPOLOGY, load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("vagrant") is None,
    reason="vagrant is not installed (scripts/setup installs it)",
)


def has_libvirt_plugin() -> bool:
    out = subprocess.run(["vagrant", "plugin", "list"], capture_output=True, text=True,
                         timeout=120, check=False).stdout  # fmt: skip
    return "vagrant-libvirt" in out


def validate(vagrant_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", **env}
    args = ["vagrant", "validate"]
    if has_libvirt_plugin():
        full_env["VAGRANT_DEFAULT_PROVIDER"] = "libvirt"
    else:
        args.append("--ignore-provider")
    return subprocess.run(args, cwd=vagrant_dir, env=full_env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_vagrantfile_validates():
    proc = validate(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vagrantfile_builds_the_lab_topology_with_the_same_names_addresses_and_groups(
    tmp_path: Path,
):
    out = tmp_path / "topology.json"
    proc = validate(ROOT, GPUMON_VAGRANT_TOPOLOGY_OUT=str(out), GPUMON_GPU_NODES="6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = [
        {"name": h.name, "address": h.address, "groups": list(h.groups)}
        for h in load_topology(gpu_nodes=6).hosts
    ]
    assert json.loads(out.read_text()) == expected


def test_a_misspelt_provider_setting_fails_validation(tmp_path: Path):
    if not has_libvirt_plugin():
        pytest.skip("provider settings are only validated with the vagrant-libvirt plugin")
    text = (ROOT / "Vagrantfile").read_text().replace("lv.memory =", "lv.memroy =")
    (tmp_path / "Vagrantfile").write_text(text)
    proc = validate(tmp_path, GPUMON_LAB_TOPOLOGY=str(DEFAULT_TOPOLOGY))
    assert proc.returncode != 0
    assert "memroy" in proc.stdout + proc.stderr
