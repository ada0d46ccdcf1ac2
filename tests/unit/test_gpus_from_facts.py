"""GPU model and count from facts when the inventory does not declare them; a declared value is an
expectation the facts must meet (a mismatch refuses the plan, naming the host, what was declared
and what was found); ``check --offline`` says which hosts it cannot judge without facts."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from deployer.cli import cli
from deployer.connection import CommandResult
from deployer.errors import InputError
from deployer.facts import GPU, HostFacts, parse_facts
from deployer.gpu import rules, version_plan


def pci_facts(*ids: str) -> HostFacts:
    """A host without a driver: the GPUs only on the PCI bus (sysfs vendor, class, device)."""
    lines = [f"0000:{i:02x}:00.0 0x0302 0x{dev}" for i, dev in enumerate(ids)]
    out = "@@os\nid=debian\nversion_id=12\narch=x86_64\n@@pci\n" + "\n".join(lines) + "\n"
    return parse_facts("g1", CommandResult("facts", 0, out + "@@smi\n@@smi_rc\nrc=absent\n", ""))


def smi_facts(name: str, count: int) -> HostFacts:
    gpus = [GPU(i, f"GPU-{i}", name, 81559, f"0000:{i:02x}:00.0", "Disabled") for i in range(count)]
    return HostFacts(host="g1", gpus=gpus, nvidia_smi="ok")


def plan(variables: dict, facts: HostFacts) -> version_plan.VersionPlan:
    names = facts.gpu_names()[0] or None
    return version_plan.plan_from_vars("g1", variables, gpu_names=names)


def test_facts_read_the_pci_device_ids_of_nvidia_gpus():
    f = pci_facts("2330", "2330")
    assert f.nvidia_pci_gpus == 2
    assert f.gpu_names() == (["10de:2330", "10de:2330"], "the PCI bus")


def test_a_host_without_a_driver_gets_model_and_count_from_its_pci_ids():
    p = plan({}, pci_facts("2330", "2330", "2330", "2330"))  # H100 SXM5's device id
    assert (p.gpu_count, len(p.gpu_names)) == (4, 4)
    assert rules.check([p]) == []
    assert rules.resolve(p).gpu_model == "H100"


def test_nvidia_smi_names_win_over_the_pci_ids():
    f = smi_facts("NVIDIA A100-SXM4-80GB", 8)
    f.nvidia_pci_gpu_ids = ["2330"] * 8
    assert rules.resolve(plan({}, f)).gpu_model == "A100"


def test_a_declared_count_the_facts_do_not_show_is_refused_naming_both():
    refused = rules.check(
        [plan({"gpu_model": "H100", "gpu_count": 8}, smi_facts("NVIDIA H100 80GB HBM3", 7))]
    )
    assert [r.rule for r in refused] == ["gpu-count-facts"]
    assert (
        "g1" in str(refused[0])
        and "7 GPU(s)" in str(refused[0])
        and "gpu_count 8" in str(refused[0])
    )


def test_a_declared_model_the_facts_contradict_is_refused_naming_both():
    refused = rules.check(
        [plan({"gpu_model": "H100", "gpu_count": 8}, smi_facts("NVIDIA A100-SXM4-80GB", 8))]
    )
    assert [r.rule for r in refused] == ["gpu-model-facts"]
    assert "A100" in refused[0].message and "H100" in refused[0].message


def test_declared_values_the_facts_confirm_pass():
    assert (
        rules.check(
            [plan({"gpu_model": "H100", "gpu_count": 2}, smi_facts("NVIDIA H100 80GB HBM3", 2))]
        )
        == []
    )


def test_check_offline_names_the_hosts_it_cannot_judge_and_judges_the_rest(tmp_path):
    (tmp_path / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            all:
              children:
                gpu:
                  hosts:
                    g1: {ansible_host: 192.0.2.1, gpu_model: H100, gpu_count: 8}
                    g2: {ansible_host: 192.0.2.2}
            """
        )
    )
    result = CliRunner().invoke(cli, ["check", "-i", str(tmp_path / "hosts.yml"), "--offline"])
    assert result.exit_code == 0, result.output
    assert "NOT JUDGED g2: no gpu_model in the inventory" in result.output
    assert "NOT JUDGED g1" not in result.output
    assert "compatible: every judged GPU host's plan passes the matrix" in result.output


def test_a_declared_model_without_a_count_plans_before_facts_and_check_offline_judges_it(
    tmp_path,
):
    (tmp_path / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            all:
              children:
                gpu:
                  hosts:
                    g1: {ansible_host: 192.0.2.1, gpu_model: H100}
            """
        )
    )
    result = CliRunner().invoke(cli, ["check", "-i", str(tmp_path / "hosts.yml"), "--offline"])
    assert result.exit_code == 0, result.output
    assert "NOT JUDGED" not in result.output
    assert "compatible: every GPU host's plan passes the matrix" in result.output


def test_a_declared_model_the_matrix_refuses_is_refused_offline_without_a_count(tmp_path):
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    gpu:\n      hosts:\n"
        "        g1: {ansible_host: 192.0.2.1, gpu_model: V100, nvidia_driver_branch: '595'}\n"
    )
    result = CliRunner().invoke(cli, ["check", "-i", str(tmp_path / "hosts.yml"), "--offline"])
    assert result.exit_code == 2, result.output
    assert "REFUSED" in result.output and "g1" in result.output


def test_an_undeclared_count_the_facts_cannot_give_names_the_host_and_what_to_set():
    with pytest.raises(InputError) as err:
        version_plan.plan_from_vars("g1", {"gpu_model": "H100"}, gpu_names=None)
    assert err.value.key == "gpu_count"
    assert "host g1" in str(err.value) and "facts show no GPU to count" in str(err.value)
    assert "declare gpu_count" in str(err.value)


def test_one_rule_reads_the_model_from_gpu_names_for_the_plan_and_for_init():
    from deployer.gpu.matrix import models_from_gpu_names
    from deployer.init_inventory import finding

    names = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]
    assert models_from_gpu_names(names) == (
        {"H100": "NVIDIA H100 80GB HBM3", "A100": "NVIDIA A100-SXM4-80GB"},
        None,
    )
    assert models_from_gpu_names(["NVIDIA H100 80GB HBM3", "Mystery GPU"])[1] == "Mystery GPU"
    mixed = HostFacts(host="g1", gpus=smi_facts("NVIDIA H100 80GB HBM3", 1).gpus * 2)
    mixed.gpus[1] = GPU(1, "GPU-1", "NVIDIA A100-SXM4-80GB", 81559, "0:1:0", "Disabled")
    found = finding("g1", mixed, {})
    assert "gpu_model" not in found.found and "not recognised" in found.problems[0]
    assert [r.rule for r in rules.check([plan({}, mixed)])] == ["gpu-models-mixed"]
