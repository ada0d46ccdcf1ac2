"""Drain hooks: take a GPU host out of the workload scheduler before its driver changes.

Every hook answers four actions, each a shell command run on the *drain host* (the controller by
default, or an inventory host such as a Slurm login node; ``--drain-host``):

``is_drained``  the node's state (``parse_state`` reads the answer): for Slurm its state and
                drain reason; for the others exit 0 when the node is drained/cordoned
``drain``       stop new work landing on the node (with a reason naming the run)
``idle``        exit 0 when the scheduler runs nothing on the node any more (polled, bounded);
                otherwise the work it still runs, one line each
``resume``      put the node back into service

Who drained a node decides whether the run may resume it (``owner``): a node drained before the
run by someone else stays drained afterwards, and so does a node someone else drains again while
the run holds it. Slurm keeps a reason with every drain, so the reason string tells them apart:
the run drains with ``gpumon-deploy upgrade-driver run <id>: ...`` and resumes only a node that
still carries exactly that reason. The GPU Operator's users report the bug this prevents, an
upgrade that uncordons the nodes an administrator had cordoned: NVIDIA/gpu-operator#304 ("GPU
operator is uncordoning cordonned/drained nodes"), NVIDIA/k8s-driver-manager#212, and the
review of NVIDIA/k8s-driver-manager#240, where a marker kept apart from the cordon itself goes
stale and later removes an administrator's cordon. Kubernetes and command hooks keep no reason:
a node drained before the run is never resumed, one the run drained is; and a new run refuses
hosts an earlier run of the inventory left drained with no controller driving it (resuming that
run finishes them: ``command._refuse_hosts_left``).

Slurm: ``sinfo -h -N -n X -o '%T|%E'`` (state, reason), ``scontrol update nodename=X state=drain
reason=...``, ``squeue -h -w X`` empty (only jobs allocated to X: pending jobs that ask for X do
not count), ``scontrol update nodename=X state=resume``. Kubernetes: ``kubectl cordon X`` then
``kubectl drain X --ignore-daemonsets --delete-emptydir-data --timeout=..s [--pod-selector=...]``,
``kubectl uncordon X``. Command: a template with ``{host}`` (the node name), ``{action}``
(is-drained, drain, idle, resume) and ``{reason}``. The node name is the host var
``slurm_node_name`` / ``kubernetes_node_name`` / ``drain_node_name`` when set, else the inventory
hostname.
"""

from __future__ import annotations

import re
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
# Every reason this tool writes starts so (``run_reason``); ``owner`` reads the run id back.
RUN_REASON_PREFIX = "gpumon-deploy upgrade-driver run "
_RUN_ID = re.compile(re.escape(RUN_REASON_PREFIX) + r"(\S+?):")

# who drained a node (``owner``)
NOBODY = "nobody"  # in service
THIS_RUN = "this-run"
EARLIER_RUN = "earlier-run"  # another gpumon-deploy run that did not finish
SOMEONE_ELSE = "someone-else"  # an administrator, a health check, Slurm itself
UNKNOWN = "unknown"  # drained, and the scheduler keeps no reason to tell by


class DrainStateError(Exception):
    """The node's state could not be read (the scheduler did not answer, or no such node)."""


@dataclass(frozen=True)
class NodeState:
    """A node as the scheduler sees it."""

    drained: bool  # no new work lands there: drained or draining, down, failed, cordoned
    reason: str | None = None  # the scheduler's reason; None where it keeps none
    state: str = ""  # in the scheduler's words (sinfo's %T), for notes


def run_reason(run_id: str, driver_before: str | None, driver_after: str) -> str:
    """The drain reason of a run: names the tool, the run and the driver change."""
    return f"{RUN_REASON_PREFIX}{run_id}: driver {driver_before or 'none'} -> {driver_after}"


def reason_run(reason: str | None) -> str | None:
    """The run id in a reason this tool wrote, else None."""
    m = _RUN_ID.match(reason or "")
    return m.group(1) if m else None


def owner(state: NodeState, run_id: str | None) -> str:
    """Who drained the node: NOBODY, THIS_RUN, EARLIER_RUN, SOMEONE_ELSE or UNKNOWN."""
    if not state.drained:
        return NOBODY
    if state.reason is None:
        return UNKNOWN
    run = reason_run(state.reason)
    if run is None:
        return SOMEONE_ELSE
    return THIS_RUN if run == run_id else EARLIER_RUN


class DrainHook(Protocol):
    kind: str

    def command(self, action: str, node: str, reason: str) -> str | None:
        """The shell command for ``action`` on ``node``; None when the hook does nothing."""
        ...

    def parse_state(self, node: str, rc: int, stdout: str, stderr: str) -> NodeState:
        """The node's state from the ``is_drained`` command's answer (DrainStateError when
        the answer says nothing about the node)."""
        ...


def _state_by_status(node: str, rc: int, stdout: str, stderr: str) -> NodeState:
    """Hooks that answer is_drained by exit status: 0 drained, anything else in service
    (127: the command does not exist on the drain host, an error)."""
    if rc == 127:
        raise DrainStateError((stderr or stdout).strip()[-200:] or "command not found")
    return NodeState(drained=rc == 0)


@dataclass(frozen=True)
class NoDrain:
    kind: str = "none"

    def command(self, action: str, node: str, reason: str) -> str | None:
        return None

    def parse_state(self, node: str, rc: int, stdout: str, stderr: str) -> NodeState:
        return NodeState(drained=False)


# sinfo's long state names (%T, lower case) of a node that takes no new work: with the DRAIN
# flag "drained"/"draining" (and a suffix: "*" not responding, "@" reboot requested, ...),
# "down", "fail"/"failing". Slurm 22.05: node_state_string(), src/common/slurm_protocol_defs.c:3558
# @987c99f0 (SchedMD/slurm tag slurm-22-05-8-1): a DOWN node with the DRAIN flag reads "drained".
_SLURM_OUT = re.compile(r"^(drain|down|fail)")


@dataclass(frozen=True)
class SlurmDrain:
    kind: str = "slurm"

    def command(self, action: str, node: str, reason: str) -> str | None:
        n = shlex.quote(node)
        if action == "is_drained":
            return f"sinfo -h -N -n {n} -o '%T|%E'"
        if action == "drain":
            return f"scontrol update nodename={n} state=drain reason={shlex.quote(reason)}"
        if action == "idle":
            # jobs allocated to the node in any state (running, completing, suspended, ...);
            # exit 2 when squeue itself fails, 1 with the jobs listed
            return (
                f"jobs=$(squeue -h -w {n} -o 'job %i (%u, %T): %j') || exit 2; "
                'if [ -n "$jobs" ]; then printf \'%s\\n\' "$jobs"; exit 1; fi'
            )
        if action == "resume":
            return f"scontrol update nodename={n} state=resume"
        raise ValueError(action)

    def parse_state(self, node: str, rc: int, stdout: str, stderr: str) -> NodeState:
        if rc != 0:
            raise DrainStateError(
                f"sinfo failed (rc={rc}): {(stderr or stdout).strip()[-200:] or 'no output'}"
            )
        # one line per partition the node is in; the state and reason are the node's
        line = next((x for x in stdout.splitlines() if x.strip()), None)
        if line is None:
            raise DrainStateError(f"Slurm has no node {node!r} (set slurm_node_name for this host)")
        state, _, reason = line.partition("|")
        state = state.strip().lower()
        reason = reason.strip()
        return NodeState(
            drained=bool(_SLURM_OUT.match(state)),
            reason="" if reason in ("", "none", "(null)") else reason,
            state=state,
        )


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

    def parse_state(self, node: str, rc: int, stdout: str, stderr: str) -> NodeState:
        return _state_by_status(node, rc, stdout, stderr)


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

    def parse_state(self, node: str, rc: int, stdout: str, stderr: str) -> NodeState:
        return _state_by_status(node, rc, stdout, stderr)


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
