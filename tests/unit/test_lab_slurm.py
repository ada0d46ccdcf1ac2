"""The lab's Slurm as data: slurm.conf and gres.conf from the topology (every GPU host a node
with its simulated GPUs as GRES, partitions from slurm_partition), the topology's controller
key, the simulated device nodes gres.conf names, the munge key and sinfo's answers."""

from __future__ import annotations

import os
import stat

import pytest

from deployer.errors import InputError
from deployer.lab import devnodes, slurm
from deployer.lab.topology import load_topology, parse_topology
from deployer.yamlsrc import load_yaml_text


def topo(text: str):
    return parse_topology(load_yaml_text(text, "t.yml"), source="t.yml")


TWO_NODES = """
slurm:
  controller: mon01
hosts:
  gpu01: {groups: [gpu], gpu_model: H100, gpu_count: 8, slurm_partition: train}
  gpu02: {groups: [gpu], gpu_model: A100, gpu_count: 1}
  mon01: {groups: [alertmanager]}
"""


def test_the_default_topology_runs_slurmctld_on_mon01_and_slurmd_on_every_gpu_host():
    cluster = slurm.cluster_for(load_topology())
    assert cluster.controller.name == "mon01"
    assert [n.name for n in cluster.nodes] == [h.name for h in load_topology().group("gpu")]


def test_every_gpu_host_is_a_node_whose_gres_are_its_simulated_gpus():
    conf = slurm.slurm_conf(slurm.cluster_for(topo(TWO_NODES)))
    lines = conf.splitlines()
    assert any(x.startswith("NodeName=gpu01 ") and "Gres=gpu:h100:8" in x for x in lines)
    assert any(x.startswith("NodeName=gpu02 ") and "Gres=gpu:a100:1" in x for x in lines)
    assert "GresTypes=gpu" in lines
    assert any(x.startswith("SlurmctldHost=mon01(10.213.0.") for x in lines)


def test_partitions_come_from_slurm_partition_and_the_first_is_the_default():
    conf = slurm.slurm_conf(slurm.cluster_for(topo(TWO_NODES)))
    assert "PartitionName=train Nodes=gpu01 Default=YES MaxTime=INFINITE State=UP" in conf
    assert "PartitionName=gpu Nodes=gpu02 Default=NO MaxTime=INFINITE State=UP" in conf


def test_gres_conf_names_a_device_file_per_gpu():
    gres = slurm.gres_conf(slurm.cluster_for(topo(TWO_NODES))).splitlines()
    assert "NodeName=gpu01 Name=gpu Type=h100 File=/dev/nvidia[0-7]" in gres
    assert "NodeName=gpu02 Name=gpu Type=a100 File=/dev/nvidia0" in gres


def test_the_device_nodes_are_the_nvidia_driver_s_numbers():
    lines = devnodes.tmpfiles_lines(2).splitlines()
    assert lines[1:] == [
        "c /dev/nvidia0 0666 root root - 195:0",
        "c /dev/nvidia1 0666 root root - 195:1",
        "c /dev/nvidiactl 0666 root root - 195:255",
    ]


def test_the_device_unit_is_enabled_in_the_host_root(tmp_path):
    devnodes.prepare_root(tmp_path, 4)
    devnodes.prepare_root(tmp_path, 4)  # every start: idempotent
    link = tmp_path / "etc/systemd/system/sysinit.target.wants" / devnodes.UNIT
    assert os.readlink(link) == f"/etc/systemd/system/{devnodes.UNIT}"
    assert "195:3" in (tmp_path / devnodes.LIST).read_text()
    assert "SIMULATED" in (tmp_path / "etc/systemd/system" / devnodes.UNIT).read_text()


def test_a_topology_without_a_controller_cannot_run_slurm():
    t = topo("hosts:\n  gpu01: {groups: [gpu], gpu_model: H100, gpu_count: 1}\n")
    with pytest.raises(InputError, match="names no Slurm controller") as exc:
        slurm.cluster_for(t)
    assert exc.value.key == "slurm.controller"


def test_a_controller_that_is_not_a_host_is_an_error_naming_the_line():
    text = "slurm:\n  controller: mon09\nhosts:\n  gpu01: {groups: [gpu], gpu_model: H100, gpu_count: 1}\n"
    with pytest.raises(InputError, match="must name a host of the topology") as exc:
        topo(text)
    assert (exc.value.key, exc.value.line) == ("slurm.controller", 2)


def test_the_munge_key_is_made_once_and_kept_0600(tmp_path):
    first = slurm.munge_key(tmp_path)
    assert len(first) == slurm.MUNGE_KEY_BYTES
    assert slurm.munge_key(tmp_path) == first
    assert stat.S_IMODE((tmp_path / "munge.key").stat().st_mode) == 0o600


def test_the_munge_key_travels_in_the_script_on_stdin_not_as_text(tmp_path):
    cluster = slurm.cluster_for(topo(TWO_NODES))
    key = b"\x00\xffsecret-munge-key-bytes" * 40
    script = slurm.host_script(cluster, cluster.nodes[0], key)
    assert b"secret-munge-key-bytes" not in script.encode()
    assert "apt-get install -y -q --no-install-recommends" in script
    assert "policy-rc.d" in script  # no daemon starts from a postinst before it is configured


def test_only_the_controller_gets_slurmctld_and_only_gpu_hosts_slurmd():
    cluster = slurm.cluster_for(topo(TWO_NODES))
    ctl = slurm.host_script(cluster, cluster.controller, b"k")
    node = slurm.host_script(cluster, cluster.nodes[0], b"k")
    assert "restart slurmctld" in ctl and "restart slurmd" not in ctl
    assert "restart slurmd" in node and "slurmctld" not in node


def test_sinfo_lines_give_each_node_once_with_its_reason():
    text = "gpu01|drained|gpumon-deploy upgrade-driver run R1: a | b\ngpu01|drained|x\ngpu02|idle|none\n"
    assert slurm.parse_sinfo_nodes(text) == {
        "gpu01": {"state": "drained", "reason": "gpumon-deploy upgrade-driver run R1: a | b"},
        "gpu02": {"state": "idle", "reason": ""},
    }


def test_the_controller_survives_the_lab_s_record_of_its_topology():
    from deployer.lab.lab import topology_from_dict, topology_to_dict

    t = topo(TWO_NODES)
    assert topology_from_dict(topology_to_dict(t)).slurm_controller == "mon01"


def test_the_prolog_and_epilog_are_directories_of_scripts_as_a_site_keeps_them():
    conf = slurm.slurm_conf(slurm.cluster_for(topo(TWO_NODES))).splitlines()
    assert "Prolog=/etc/slurm/prolog.d/*" in conf
    assert "Epilog=/etc/slurm/epilog.d/*" in conf


def test_each_directory_holds_a_script_of_the_sites_own_so_the_glob_matches(tmp_path):
    script = slurm.host_script(
        slurm.cluster_for(topo(TWO_NODES)), topo(TWO_NODES).host("gpu01"), b"k"
    )
    assert (
        "/etc/slurm/prolog.d/10-lab-site" in script and "/etc/slurm/epilog.d/10-lab-site" in script
    )
    hook = tmp_path / "10-lab-site"
    hook.write_text(slurm.site_hook("prolog").replace(slurm.SITE_HOOK_LOG, str(tmp_path / "log")))
    hook.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}
    import subprocess

    assert subprocess.run([hook], env=env, check=False).returncode == 0
    assert (tmp_path / "log").read_text().split()[1:] == ["prolog", "job=7", "gpus=0,1"]
