"""Drain hooks: take a GPU host out of the workload scheduler before its driver changes.

Every hook answers four actions, each a shell command run on the *drain host* (the controller by
default, or an inventory host such as a Slurm login node; ``--drain-host``):

``is_drained``  exit 0 when the node is already drained/cordoned (before the run touches it: the
                run then never undrains it)
``drain``       stop new work landing on the node (with a reason naming the run)
``idle``        exit 0 when the scheduler runs nothing on the node any more (polled, bounded)
``resume``      put the node back into service

Slurm: ``scontrol update nodename=X state=drain reason=...``, ``squeue -w X -h`` empty,
``scontrol update nodename=X state=resume``. Kubernetes: ``kubectl cordon X`` then ``kubectl drain
X --ignore-daemonsets --delete-emptydir-data --timeout=..s [--pod-selector=...]``, ``kubectl
uncordon X``. Command: a template with ``{host}`` (the node name), ``{action}`` (is-drained,
drain, idle, resume) and ``{reason}``. The node name is the host var ``slurm_node_name`` /
``kubernetes_node_name`` / ``drain_node_name`` when set, else the inventory hostname.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

from deployer.errors import InputError

DRAIN_KINDS = ("slurm", "kubernetes", "command", "none")
NODE_NAME_VARS = {
    "slurm": "slurm_node_name",
    "kubernetes": "kubernetes_node_name",
    "command": "drain_node_name",
}
ACTIONS = ("is_drained", "drain", "idle", "resume")


class DrainHook(Protocol):
    kind: str

    def command(self, action: str, node: str, reason: str) -> str | None:
        """The shell command for ``action`` on ``node``; None when the hook does nothing."""
        ...


@dataclass(frozen=True)
class NoDrain:
    kind: str = "none"

    def command(self, action: str, node: str, reason: str) -> str | None:
        return None


@dataclass(frozen=True)
class SlurmDrain:
    kind: str = "slurm"

    def command(self, action: str, node: str, reason: str) -> str | None:
        n = shlex.quote(node)
        if action == "is_drained":
            # sinfo's %T: "drained", "draining", "drained*", "down*", ... (state of the node)
            return f"sinfo -h -N -n {n} -o %T | grep -qiE '^(drain|down)'"
        if action == "drain":
            return f"scontrol update nodename={n} state=drain reason={shlex.quote(reason)}"
        if action == "idle":
            return f'test -z "$(squeue -w {n} -h)"'
        if action == "resume":
            return f"scontrol update nodename={n} state=resume"
        raise ValueError(action)


@dataclass(frozen=True)
class KubernetesDrain:
    pod_selector: str | None = None
    timeout_s: int = 600
    kind: str = "kubernetes"

    def command(self, action: str, node: str, reason: str) -> str | None:
        n = shlex.quote(node)
        if action == "is_drained":
            return f"test \"$(kubectl get node {n} -o jsonpath='{{.spec.unschedulable}}')\" = true"
        if action == "drain":
            selector = (
                f" --pod-selector={shlex.quote(self.pod_selector)}" if self.pod_selector else ""
            )
            return (
                f"kubectl cordon {n} && kubectl drain {n} --ignore-daemonsets "
                f"--delete-emptydir-data --timeout={self.timeout_s}s{selector}"
            )
        if action == "idle":
            selector = f" -l {shlex.quote(self.pod_selector)}" if self.pod_selector else ""
            return (
                'test -z "$(kubectl get pods --all-namespaces -o name '
                f'--field-selector=spec.nodeName={n},status.phase=Running{selector})"'
            )
        if action == "resume":
            return f"kubectl uncordon {n}"
        raise ValueError(action)


@dataclass(frozen=True)
class CommandDrain:
    template: str
    kind: str = "command"

    def command(self, action: str, node: str, reason: str) -> str | None:
        if action not in ACTIONS:
            raise ValueError(action)
        return self.template.format(
            host=shlex.quote(node),
            action=action.replace("_", "-"),
            reason=shlex.quote(reason),
        )


def make_hook(
    kind: str,
    *,
    command: str | None = None,
    pod_selector: str | None = None,
    timeout_s: int = 600,
) -> DrainHook:
    """The hook ``--drain`` names; a command hook needs ``--drain-command`` with ``{host}`` and
    ``{action}`` (InputError otherwise)."""
    if kind == "none":
        return NoDrain()
    if kind == "slurm":
        return SlurmDrain()
    if kind == "kubernetes":
        return KubernetesDrain(pod_selector=pod_selector, timeout_s=timeout_s)
    if kind == "command":
        if not command:
            raise InputError(
                "--drain command needs --drain-command TEMPLATE", key="--drain-command"
            )
        for needed in ("{host}", "{action}"):
            if needed not in command:
                raise InputError(
                    f"the drain command template must contain {needed}", key="--drain-command"
                )
        try:
            command.format(host="h", action="drain", reason="r")
        except (KeyError, IndexError, ValueError) as exc:
            raise InputError(
                f"the drain command template has an unknown placeholder: {exc} "
                "(known: {host}, {action}, {reason}; write {{ and }} for braces)",
                key="--drain-command",
            ) from exc
        return CommandDrain(command)
    raise InputError(
        f"unknown drain kind {kind!r} (one of {', '.join(DRAIN_KINDS)})", key="--drain"
    )


def node_name(kind: str, host: str, variables: dict) -> str:
    """The scheduler's name for an inventory host."""
    var = NODE_NAME_VARS.get(kind)
    value = variables.get(var) if var else None
    return str(value) if value else host
