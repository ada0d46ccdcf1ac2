"""An inventory whose groups are not the product's: ``gpumon_groups`` (group_vars/all, -e) and
``--group`` map the product's groups onto the inventory's, as ``[gpu:children]`` would; a run in
which no selected host is in any play is refused, naming the site's groups and the inventory's."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer import session as session_mod
from deployer.cli import cli
from deployer.errors import InputError
from deployer.hostpattern import select
from deployer.inventory import load_inventory
from deployer.secrets import SecretValues

# DeepOps' shape: GPU nodes in slurm-node, the monitoring host in slurm-metric.
DEEPOPS = """\
all:
  hosts:
    login01: {ansible_host: 192.0.2.5}
  children:
    slurm-master:
      hosts:
        login01:
    slurm-node:
      hosts:
        gpu01: {ansible_host: 192.0.2.11}
        gpu02: {ansible_host: 192.0.2.12}
    slurm-metric:
      hosts:
        login01:
"""


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "hosts.yml"


def load(path: Path, **extra):
    return load_inventory(path, extra_vars=extra, secrets=SecretValues())


@pytest.fixture(autouse=True)
def no_connections(monkeypatch):
    def refuse(self, host):
        raise AssertionError(f"a connection to {host} was attempted")

    monkeypatch.setattr(session_mod.DeploySession, "open_connection", refuse)


def test_group_vars_all_maps_the_product_gpu_group_onto_the_inventorys(tmp_path):
    path = write(
        tmp_path,
        {
            "hosts.yml": DEEPOPS,
            "group_vars/all.yml": "gpumon_groups: {gpu: [slurm-node], prometheus: slurm-metric}\n",
            "group_vars/gpu.yml": "gpu_model: H100\ngpu_count: 8\n",
        },
    )
    inv = load(path)
    assert inv.group_hosts("gpu") == ["gpu01", "gpu02"]
    assert inv.group_hosts("prometheus") == ["login01"]
    assert [h.name for h in select(inv, "gpu", play=True)] == ["gpu01", "gpu02"]
    # group_vars/gpu.yml applies to the mapped hosts, as a parent group's vars do
    assert inv.host("gpu01").vars["gpu_count"] == 8
    assert "gpu" in inv.host("gpu01").group_names
    assert not any("gpu.yml" in w for w in inv.warnings)


def test_a_group_of_the_inventory_own_vars_win_over_the_product_groups(tmp_path):
    path = write(
        tmp_path,
        {
            "hosts.yml": DEEPOPS,
            "group_vars/all.yml": "gpumon_groups: {gpu: [slurm-node]}\n",
            "group_vars/gpu.yml": "gpu_count: 8\n",
            "group_vars/slurm-node.yml": "gpu_count: 4\n",
        },
    )
    assert load(path).host("gpu02").vars["gpu_count"] == 4  # the child is deeper: it wins


def test_extra_vars_replace_the_inventorys_mapping(tmp_path):
    path = write(
        tmp_path,
        {"hosts.yml": DEEPOPS, "group_vars/all.yml": "gpumon_groups: {gpu: [slurm-node]}\n"},
    )
    inv = load(path, gpumon_groups={"gpu": ["slurm-metric"]})
    assert inv.group_hosts("gpu") == ["login01"]


def test_a_mapped_group_the_inventory_lacks_is_refused_naming_the_file_and_key(tmp_path):
    path = write(
        tmp_path,
        {"hosts.yml": DEEPOPS, "group_vars/all.yml": "gpumon_groups: {gpu: [kube_node]}\n"},
    )
    with pytest.raises(InputError) as exc:
        load(path)
    text = str(exc.value)
    assert "group_vars/all.yml" in text and "gpumon_groups.gpu" in text
    assert "'kube_node'" in text and "slurm-node" in text  # what exists, to pick from


@pytest.mark.parametrize("value", ["[gpu]", "{gpu: {a: b}}", "{gpu: [1]}"])
def test_a_mapping_of_the_wrong_shape_is_refused(tmp_path, value):
    path = write(
        tmp_path, {"hosts.yml": DEEPOPS, "group_vars/all.yml": f"gpumon_groups: {value}\n"}
    )
    with pytest.raises(InputError) as exc:
        load(path)
    assert "gpumon_groups" in str(exc.value) and "group_vars/all.yml" in str(exc.value)


def test_the_group_flag_maps_for_one_run(tmp_path):
    path = write(tmp_path, {"hosts.yml": DEEPOPS})
    result = CliRunner().invoke(
        cli, ["inventory", "-i", str(path), "--output", "json", "--group", "gpu=slurm-node"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["groups"]["gpu"]["children"] == ["slurm-node"]
    assert data["hosts"]["gpu01"]["groups"] == ["gpu", "slurm-node"]


def test_a_malformed_group_flag_is_a_usage_error(tmp_path):
    path = write(tmp_path, {"hosts.yml": DEEPOPS})
    result = CliRunner().invoke(cli, ["inventory", "-i", str(path), "--group", "gpu"])
    assert result.exit_code == 2
    assert "PRODUCT_GROUP=GROUP" in result.output


def test_up_on_an_inventory_without_the_products_groups_exits_2_naming_both(tmp_path):
    path = write(tmp_path, {"hosts.yml": DEEPOPS})
    result = CliRunner().invoke(cli, ["up", "-i", str(path), "--check"])
    assert result.exit_code == 2, result.output
    out = result.output
    assert "no selected host is in a group the site's plays apply to" in out
    assert "gpu" in out and "prometheus" in out  # the site's groups
    assert "slurm-node" in out  # the inventory's
    assert "--group gpu=" in out


EXAMPLES = Path(__file__).resolve().parents[2] / "inventories"


@pytest.mark.parametrize(
    ("inventory", "gpu", "alertmanager"),
    [
        ("deepops/inventory", ["gpu01", "gpu02"], ["mon01", "mon02", "login01"]),
        ("kubespray/inventory.ini", ["gpu1", "gpu2", "gpu3"], ["node1", "node2", "node3"]),
    ],
)
def test_the_worked_examples_map_onto_deepops_and_kubespray_groups(inventory, gpu, alertmanager):
    inv = load(EXAMPLES / inventory)
    assert inv.group_hosts("gpu") == gpu
    assert inv.group_hosts("alertmanager") == alertmanager
    assert len(inv.group_hosts("prometheus")) == 2


@pytest.mark.parametrize("inventory", ["deepops/inventory", "kubespray/inventory.ini"])
def test_check_offline_plans_every_gpu_host_of_the_worked_examples(inventory):
    result = CliRunner().invoke(cli, ["check", "-i", str(EXAMPLES / inventory), "--offline"])
    assert result.exit_code == 0, result.output
    assert "every GPU host's plan passes the matrix" in result.output
