"""Drain hooks: the exact command lines for Slurm and Kubernetes, the command template, and the
errors for a template that cannot work."""

from __future__ import annotations

import pytest

from deployer.errors import InputError
from deployer.rollout.drain import (
    CommandDrain,
    KubernetesDrain,
    NoDrain,
    SlurmDrain,
    make_hook,
    node_name,
)

REASON = "gpumon-deploy upgrade-driver run R1: driver 570.133.20 -> 580.126.20"


def test_slurm_drains_with_a_reason_waits_on_squeue_and_resumes():
    s = SlurmDrain()
    assert s.command("drain", "gpu01", REASON) == (
        "scontrol update nodename=gpu01 state=drain "
        "reason='gpumon-deploy upgrade-driver run R1: driver 570.133.20 -> 580.126.20'"
    )
    assert s.command("idle", "gpu01", REASON) == (
        "jobs=$(squeue -h -w gpu01 -o 'job %i (%u, %T): %j') || exit 2; "
        'if [ -n "$jobs" ]; then printf \'%s\\n\' "$jobs"; exit 1; fi'
    )
    assert s.command("resume", "gpu01", REASON) == "scontrol update nodename=gpu01 state=resume"
    assert s.command("is_drained", "gpu01", "") == "sinfo -h -N -n gpu01 -o '%T|%E'"


def test_kubernetes_cordons_drains_gpu_pods_and_uncordons():
    k = KubernetesDrain(pod_selector="nvidia.com/gpu.workload=true", timeout_s=300)
    assert k.command("drain", "gpu01", REASON) == (
        "kubectl cordon gpu01 && kubectl drain gpu01 --ignore-daemonsets "
        "--delete-emptydir-data --timeout=300s --pod-selector=nvidia.com/gpu.workload=true"
    )
    assert k.command("resume", "gpu01", REASON) == "kubectl uncordon gpu01"
    assert k.command("is_drained", "gpu01", "") == (
        "test \"$(kubectl get node gpu01 -o jsonpath='{.spec.unschedulable}')\" = true"
    )
    assert k.command("idle", "gpu01", "") == (
        'test -z "$(kubectl get pods --all-namespaces -o name '
        "--field-selector=spec.nodeName=gpu01,status.phase=Running "
        '-l nvidia.com/gpu.workload=true)"'
    )


def test_kubernetes_without_a_selector_drains_every_pod_but_daemonsets():
    assert KubernetesDrain().command("drain", "n1", REASON) == (
        "kubectl cordon n1 && kubectl drain n1 --ignore-daemonsets --delete-emptydir-data "
        "--timeout=600s"
    )


def test_node_names_are_quoted_for_the_shell():
    assert SlurmDrain().command("resume", "gpu01;rm", "") == (
        "scontrol update nodename='gpu01;rm' state=resume"
    )


def test_the_command_template_gets_host_action_and_reason_quoted():
    c = CommandDrain("/usr/local/bin/sched {action} {host} {reason}")
    assert c.command("is_drained", "gpu 1", "why") == "/usr/local/bin/sched is-drained 'gpu 1' why"
    assert c.command("drain", "gpu01", "a b") == "/usr/local/bin/sched drain gpu01 'a b'"
    assert [c.command(a, "h", "r").split()[1] for a in ("idle", "resume")] == ["idle", "resume"]


def test_no_drain_runs_nothing():
    assert all(NoDrain().command(a, "h", "r") is None for a in ("is_drained", "drain", "resume"))


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (None, "needs --drain-command"),
        ("sched {action}", "must contain {host}"),
        ("sched {host}", "must contain {action}"),
        ("sched {host} {action} {user}", "unknown placeholder"),
    ],
)
def test_bad_command_templates_are_input_errors(template, message):
    with pytest.raises(InputError, match=message) as exc:
        make_hook("command", command=template)
    assert exc.value.key == "--drain-command"


def test_the_scheduler_name_comes_from_host_vars_when_set():
    assert node_name("slurm", "gpu01", {"slurm_node_name": "node-001"}) == "node-001"
    assert node_name("kubernetes", "gpu01", {"slurm_node_name": "node-001"}) == "gpu01"
    assert node_name("none", "gpu01", {}) == "gpu01"
