"""``gpumon-deploy status`` with Slurm: nodes drained by a rollout or by someone else, and GPUs
whose metrics disagree with Slurm's allocation.

Opt-in per GPU host: ``gpumon_scheduler: slurm`` (group_vars). The node is ``slurm_node_name``
(else the inventory hostname), as the ``upgrade-driver --drain slurm`` hook names it
(``deployer.rollout.drain.node_name``). Slurm is read on ``gpumon_slurm_host`` (an inventory host
with Slurm's client commands, e.g. the slurmctld host or a login node; default ``controller``,
the machine gpumon-deploy runs on, as ``--drain-host``), through status' connection pool, with
the read-only commands of ``deployer.monitoring.slurm_state``.

Rows (component ``slurm``, one or two per node):

- ``in service`` (ok): the node's Slurm state and how many of its GPUs are allocated.
- ``drained by a rollout`` -- the drain reason is an ``upgrade-driver`` run's
  (``deployer.rollout.drain.reason_run``): **ok** while a controller still drives that run (its
  lock is held: ``deployer.monitoring.rollouts``); **failed** otherwise: the run died or ended and
  left the node out of Slurm, capacity nobody will give back by itself. The detail names the run,
  what its record says and how to resume it.
- ``drained by an administrator`` / ``down in Slurm`` (ok, informational): out of service for
  someone else's reason (an administrator, a health check, Slurm itself), shown with it; such a
  node is theirs, and a rollout leaves it drained too.
- ``GPU use = Slurm allocation``, per GPU index (Slurm's GRES index against the exporter's
  ``gpu`` label, docs/unverified.md#slurm-gpu-index), over the last ``gpumon_slurm_gpu_window``
  of the rule pack's per-GPU records (one series per physical GPU, MIG GPUs included:
  ``gpu:gpu_utilization:percent``, ``gpu:gpu_memory_used_mib:sum``):
  **failed** when a GPU Slurm has not allocated was busy for the whole window (utilization at or
  above ``gpumon_slurm_gpu_busy_percent``, or memory at or above
  ``gpumon_slurm_gpu_busy_fb_mib``): something runs outside the scheduler -- a process a job
  left behind, work started by hand -- and Slurm will hand that GPU to the next job, which then
  shares it (slower, or out of memory); or the exporter's GPU numbering is not Slurm's, and then
  the job labels on the metrics are wrong. A GPU that a job holds but that stayed idle for the
  whole window (the job running longer than the window) is listed in the same row and does not
  fail it: a job loading data, waiting on I/O or on a debugger holds its GPUs legitimately, and
  it is the user's capacity to waste, not a fault of the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.connection import Connection, LocalConnection
from deployer.errors import HostKeyRefused, HostUnreachable, InputError
from deployer.monitoring import slurm_state
from deployer.monitoring.check import FAILED, OK, Check
from deployer.monitoring.http import Fetch, query
from deployer.monitoring.rollouts import RunInfo, resume_command, run_info
from deployer.rollout import drain
from deployer.varformats import prometheus_duration

COMPONENT = "slurm"
CONTROLLER = "controller"  # gpumon_slurm_host's default: run the commands here
SCHEDULER_VAR = "gpumon_scheduler"
HOST_VAR = "gpumon_slurm_host"
BUSY_PERCENT_VAR = "gpumon_slurm_gpu_busy_percent"
BUSY_FB_VAR = "gpumon_slurm_gpu_busy_fb_mib"
WINDOW_VAR = "gpumon_slurm_gpu_window"
NODE_VAR = drain.NODE_NAME_VARS["slurm"]  # slurm_node_name, as the drain hook reads it
SCHEDULERS = ("slurm", "none")
# Defaults. Busy: 10 % of the GPU, or 512 MiB of its memory in use: an idle GPU uses a few MiB
# (0-10 MiB per GPU or MIG instance in the real captures: l40s, a800_mig, h100 -q), a process
# with a CUDA context hundreds (docs/unverified.md#slurm-busy-fb). A window of 10 minutes: longer
# than a job's start-up or tear-down, short enough to catch a leftover before the next job lands.
BUSY_PERCENT = 10.0
BUSY_FB_MIB = 512.0
WINDOW = "10m"
COMMAND_TIMEOUT_S = 60.0

# The rule pack's per-GPU records (roles/prometheus/templates/rules/gpu-recording.yml.j2): one
# series per physical GPU with the node, gpu and UUID labels; a MIG GPU's utilization is the
# slice-weighted activity of its instances, its memory the sum of theirs.
UTIL_RECORD = "gpu:gpu_utilization:percent"
FB_RECORD = "gpu:gpu_memory_used_mib:sum"
NODE_LABEL, GPU_LABEL, UUID_LABEL = "node", "gpu", "UUID"

Opener = Callable[[str], Connection]


# ---------------------------------------------------------------- expectation (inventory)


@dataclass(frozen=True)
class SlurmNode:
    host: str  # inventory hostname (the metrics' node label)
    node: str  # Slurm's node name
    busy_percent: float = BUSY_PERCENT
    busy_fb_mib: float = BUSY_FB_MIB


@dataclass
class SlurmExpectation:
    """The Slurm nodes status checks, by the host Slurm is read on."""

    clusters: dict[str, list[SlurmNode]] = field(default_factory=dict)
    window: str = WINDOW
    window_s: float = 600.0
    inventory: str = ""  # for the resume command in a detail


def _duration_s(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|y|w|d|h|m|s)", value))


def _number(host: str, key: str, value: Any, low: float, high: float | None) -> float:
    try:
        n = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{host}: not a number: {value!r}", key=key) from None
    if n < low or (high is not None and n > high):
        bound = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise InputError(f"{host}: {n:g} is out of range ({bound})", key=key)
    return n


def expect_slurm(
    gpu_vars: Mapping[str, Mapping[str, Any]],
    inventory_hosts: Collection[str],
    inventory: str = "",
) -> SlurmExpectation | None:
    """The Slurm part of the expectation from the GPU hosts' resolved variables; None when no
    GPU host opts in. Bad values are InputErrors naming the host and the variable."""
    exp = SlurmExpectation(inventory=inventory)
    windows: dict[str, str] = {}
    for host, v in gpu_vars.items():
        scheduler = str(v.get(SCHEDULER_VAR) or "none").strip().lower()
        if scheduler not in SCHEDULERS:
            raise InputError(
                f"{host}: unknown scheduler {scheduler!r} (one of {', '.join(SCHEDULERS)})",
                key=SCHEDULER_VAR,
            )
        if scheduler != "slurm":
            continue
        where = str(v.get(HOST_VAR) or CONTROLLER)
        if where not in (CONTROLLER, "localhost") and where not in inventory_hosts:
            raise InputError(
                f"{host}: {where!r} is not an inventory host (or say {CONTROLLER!r} to run "
                "Slurm's commands on this machine)",
                key=HOST_VAR,
            )
        window = str(v.get(WINDOW_VAR) or WINDOW)
        why = prometheus_duration(window)
        if why is not None or _duration_s(window) <= 0:
            raise InputError(
                f"{host}: {window!r}: {why or 'must be longer than 0'}", key=WINDOW_VAR
            )
        windows[host] = window
        exp.clusters.setdefault(CONTROLLER if where == "localhost" else where, []).append(
            SlurmNode(
                host=host,
                # only the keys read here are rendered: the GPU roles' other variables may need
                # a run's facts (gpu_plan) that status does not gather
                node=drain.node_name("slurm", host, {NODE_VAR: v.get(NODE_VAR)}),
                busy_percent=_number(
                    host, BUSY_PERCENT_VAR, v.get(BUSY_PERCENT_VAR, BUSY_PERCENT), 0.1, 100
                ),
                busy_fb_mib=_number(host, BUSY_FB_VAR, v.get(BUSY_FB_VAR, BUSY_FB_MIB), 1, None),
            )
        )
    if not exp.clusters:
        return None
    distinct = sorted(set(windows.values()))
    if len(distinct) > 1:
        raise InputError(
            f"one window for every Slurm node, not {', '.join(distinct)} "
            f"({', '.join(f'{h}={w}' for h, w in sorted(windows.items()))})",
            key=WINDOW_VAR,
        )
    exp.window = distinct[0]
    exp.window_s = _duration_s(exp.window)
    return exp


# ---------------------------------------------------------------- observing (I/O)


@dataclass(frozen=True)
class GpuUse:
    """One GPU over the window: lowest and highest utilization (%) and memory used (MiB)."""

    uuid: str = ""
    util_min: float | None = None
    util_max: float | None = None
    fb_min: float | None = None
    fb_max: float | None = None


@dataclass
class SlurmObservation:
    views: dict[str, slurm_state.SlurmView | str] = field(default_factory=dict)  # host -> | err
    usage: dict[tuple[str, int], GpuUse] = field(default_factory=dict)  # (node label, gpu)
    usage_errors: list[str] = field(default_factory=list)  # replicas that did not answer
    runs: dict[str, RunInfo] = field(default_factory=dict)  # run id -> what is known of it


def usage_queries(window: str, job: str = "dcgm") -> dict[tuple[str, str], str]:
    """(record, min|max) -> an instant query with one series per (node, GPU): the lowest or
    highest value of the record over the window (``by`` the GPU, so that a series that changed
    labels within the window -- a job label set and cleared -- counts as the same GPU)."""
    by = f"{NODE_LABEL}, {GPU_LABEL}, {UUID_LABEL}"
    return {
        (record, agg): f'{agg} by ({by}) ({agg}_over_time({record}{{job="{job}"}}[{window}]))'
        for record in (UTIL_RECORD, FB_RECORD)
        for agg in ("min", "max")
    }


def _usage_from(
    fetch: Fetch, base: str, window: str
) -> tuple[dict[tuple[str, int], GpuUse], str | None]:
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for (record, agg), promql in usage_queries(window).items():
        series, err = query(fetch, base, promql)
        if err is not None:
            return {}, err
        for s in series or []:
            labels = s.get("metric") or {}
            try:
                key = (str(labels[NODE_LABEL]), int(labels[GPU_LABEL]))
                value = float(s["value"][1])
            except (KeyError, ValueError, TypeError, IndexError):
                continue
            slot = "util" if record == UTIL_RECORD else "fb"
            got.setdefault(key, {"uuid": str(labels.get(UUID_LABEL, ""))})[f"{slot}_{agg}"] = value
    return {k: GpuUse(**v) for k, v in got.items()}, None


def _read(conn: Connection) -> slurm_state.SlurmView | str:
    answers = []
    for command in slurm_state.COMMANDS:
        result = conn.run(command, timeout=COMMAND_TIMEOUT_S)
        if not result.ok:
            tail = (result.stderr or result.stdout).strip().splitlines()
            return f"`{command}` exited {result.rc}: {tail[-1] if tail else 'no output'}"
        answers.append(result.stdout)
    try:
        return slurm_state.view(*answers)
    except slurm_state.SlurmParseError as exc:
        return f"Slurm's answer is not what Slurm 22.05 prints: {exc}"


def _read_on(where: str, hosts: Opener) -> slurm_state.SlurmView | str:
    """Slurm's view, read on ``where``; a session that dropped mid-read is closed (the pool
    opens a new one) and the read tried once more, as the engine retries a connection."""
    if where == CONTROLLER:
        return _read(LocalConnection())
    why = ""
    for _attempt in range(2):
        conn: Connection | None = None
        try:
            conn = hosts(where)
            return _read(conn)
        except HostKeyRefused as exc:
            return str(exc)
        except HostUnreachable as exc:  # unreachable, or the session dropped
            why = str(exc) or type(exc).__name__
            if conn is None:
                return why  # could not connect at all (the engine already retried)
            conn.close()
        except Exception as exc:  # anything else the session raised: said, not retried
            return str(exc) or type(exc).__name__
    return why


def observe(
    exp: SlurmExpectation,
    replica_urls: list[str],
    fetch: Fetch,
    hosts: Opener,
    *,
    state_root: Path | None = None,
) -> SlurmObservation:
    """Read every Slurm controller of ``exp`` (on its pooled connection, or here), the GPU use
    from the replicas (the first that has a GPU answers for it), and the record of every run
    named in a drain reason."""
    obs = SlurmObservation()
    for where in exp.clusters:
        obs.views[where] = _read_on(where, hosts)
    for base in replica_urls:
        usage, err = _usage_from(fetch, base, exp.window)
        if err is not None:
            obs.usage_errors.append(f"{base}: {err}")
        for key, use in usage.items():
            obs.usage.setdefault(key, use)
    for v in obs.views.values():
        if isinstance(v, str):
            continue
        for n in v.nodes.values():
            run = drain.reason_run(n.reason)
            if run is not None and run not in obs.runs:
                obs.runs[run] = run_info(run, state_root)
    return obs


# ---------------------------------------------------------------- judging (pure)


def _since(n: slurm_state.NodeState) -> str:
    who = ", ".join(x for x in (n.reason_user, n.reason_time) if x)
    return f" ({who})" if who else ""


def rollout_drain_check(
    n: SlurmNode, state: slurm_state.NodeState, run: RunInfo, inventory: str
) -> Check:
    """A node drained with a rollout's reason: ok while that run is driven, else failed."""
    check = "drained by a rollout"
    step = run.hosts.get(n.host)
    at = f", host at step {step.state}" if step else ""
    if run.driven:
        return Check(
            COMPONENT, n.host, check, OK,
            f"{state.state} by run {run.run_id}, in progress{at}{_since(state)}",
        )  # fmt: skip
    undrain = f"scontrol update nodename={n.node} state=resume"
    head = f"{state.state}{_since(state)} by run {run.run_id}, which "
    if not run.found:
        detail = (
            f"{head}no controller drives here (no record in {run.where}; started from another "
            f"controller? set GPUMON_ROLLOUT_STATE_DIR): capacity lost until it is resumed "
            f"({resume_command(run, inventory)} where it was started) or the node is given back "
            f"({undrain})"
        )
    elif run.error:
        detail = f"{head}cannot be read ({run.error}); give the node back with {undrain}"
    elif run.status in ("running", "interrupted", "stopped"):
        died = "died mid-run" if run.status == "running" else f"was {run.status}"
        why = f" ({run.stop_reason})" if run.stop_reason else ""
        detail = (
            f"{head}{died}{why}{at}: capacity lost; resume it: {resume_command(run, inventory)}"
        )
    elif step is not None and step.state == "failed":
        detail = (
            f"{head}finished with this host failed at step {step.failed_step}: "
            f"{step.reason or 'no reason recorded'}; left drained on purpose: fix the host, "
            f"then give it back ({undrain}) or upgrade it again"
        )
    else:
        detail = (
            f"{head}finished ({run.status}{at}) without giving the node back: "
            f"capacity lost; give it back with {undrain}"
        )
    return Check(COMPONENT, n.host, check, FAILED, detail)


def state_check(
    n: SlurmNode,
    view: slurm_state.SlurmView,
    runs: Mapping[str, RunInfo],
    inventory: str,
) -> Check:
    state = view.nodes[n.node]
    ns = drain.SlurmDrain().parse_state(n.node, 0, f"{state.state}|{state.reason}", "")
    who = drain.owner(ns, None)
    if who == drain.NOBODY:
        gpus = view.gpus.get(n.node)
        held = f"; {gpus.allocated}/{gpus.total} GPUs allocated" if gpus else ""
        return Check(COMPONENT, n.host, "in service", OK, f"{state.state}{held}")
    if who == drain.EARLIER_RUN:
        run = drain.reason_run(state.reason) or ""
        info = runs.get(run) or RunInfo(run, found=False, where="not looked up")
        return rollout_drain_check(n, state, info, inventory)
    reason = f": {state.reason!r}" if state.reason else " (no reason recorded)"
    check = "drained by an administrator" if state.state.startswith("drain") else "down in Slurm"
    return Check(
        COMPONENT, n.host, check, OK, f"{state.state}{reason}{_since(state)}; not a rollout's"
    )


def _fmt(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.0f}{unit}"


def _ranges(indexes: Collection[int]) -> str:
    out, run = [], []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def use_check(
    n: SlurmNode,
    view: slurm_state.SlurmView,
    usage: Mapping[tuple[str, int], GpuUse],
    usage_errors: list[str],
    window: str,
    window_s: float,
) -> Check:
    """The node's GPUs: busy where Slurm allocated none (failed), idle where a job holds them
    (listed, not a failure)."""
    check = "GPU use = Slurm allocation"
    gpus = view.gpus.get(n.node)
    mine = {i: u for (node, i), u in usage.items() if node == n.host}
    if gpus is None or gpus.total == 0:
        return Check(COMPONENT, n.host, check, OK, "not compared: Slurm counts no GPU GRES on it")
    if gpus.mig_typed:
        return Check(
            COMPONENT, n.host, check, OK,
            f"not compared: Slurm schedules MIG instances here ({', '.join(gpus.types)}), whose "
            "GRES indexes are not GPU indexes",
        )  # fmt: skip
    if not mine:
        why = "; ".join(usage_errors) if usage_errors else "no replica has its per-GPU records"
        return Check(COMPONENT, n.host, check, OK, f"not compared: {why}")

    def busy(u: GpuUse) -> bool:
        return (u.util_min is not None and u.util_min >= n.busy_percent) or (
            u.fb_min is not None and u.fb_min >= n.busy_fb_mib
        )

    def idle(u: GpuUse) -> bool:
        return (u.util_max is None or u.util_max < n.busy_percent) and (
            u.fb_max is not None and u.fb_max < n.busy_fb_mib
        )

    def reading(u: GpuUse) -> str:
        return f"util {_fmt(u.util_min, '%')}-{_fmt(u.util_max, '%')}, memory {_fmt(u.fb_min, '')}-{_fmt(u.fb_max, ' MiB')}"  # fmt: skip

    jobs = view.jobs_on(n.node)
    problems: list[str] = []
    notes: list[str] = []
    busy_idx = {i for i, u in mine.items() if busy(u)}
    if gpus.allocated_indexes is None:
        # counts only (gres.conf without File=): more GPUs busy than allocated is still a finding
        if len(busy_idx) > gpus.allocated:
            problems.append(
                f"{len(busy_idx)} GPUs busy over the last {window} (GPU {_ranges(busy_idx)}), "
                f"Slurm allocated {gpus.allocated} (it reports counts, not indexes)"
            )
    else:
        allocated = gpus.allocated_indexes
        for i in sorted(busy_idx - allocated):
            problems.append(
                f"GPU {i} ({mine[i].uuid or 'no UUID'}) busy with no Slurm job over the last "
                f"{window}: {reading(mine[i])}"
            )
        for i in sorted(allocated):
            u = mine.get(i)
            holders = [j for j in jobs if i in j.gpus.get(n.node, frozenset())]
            old = [j for j in holders if j.elapsed_s is not None and j.elapsed_s >= window_s]
            if u is None:
                notes.append(f"GPU {i} allocated but has no metrics")
            elif idle(u) and old:
                held_by = ", ".join(
                    f"job {j.id} ({j.user}, {j.state.lower()} {_duration(j.elapsed_s or 0)})"
                    for j in old
                )
                notes.append(
                    f"GPU {i} held by {held_by} but idle over the last {window} "
                    f"({reading(u)}; not a failure)"
                )
    missing = sorted(set(range(gpus.total)) - set(mine))
    if missing:
        notes.append(f"no metrics for GPU {_ranges(missing)} of the {gpus.total} Slurm counts")
    if problems:
        return Check(COMPONENT, n.host, check, FAILED, "; ".join(problems + notes))
    used = gpus.allocated
    summary = f"{gpus.total} GPUs, {used} allocated; none busy outside a job over the last {window}"
    return Check(COMPONENT, n.host, check, OK, "; ".join([summary, *notes]))


def checks(exp: SlurmExpectation, obs: SlurmObservation) -> list[Check]:
    """Every Slurm row, controller by controller, node by node."""
    out: list[Check] = []
    for where, nodes in exp.clusters.items():
        view = obs.views.get(where, "not read")
        if isinstance(view, str):
            out.append(Check(COMPONENT, where, "read Slurm", FAILED, view))
            continue
        for n in nodes:
            if n.node not in view.nodes:
                out.append(
                    Check(
                        COMPONENT, n.host, "known to Slurm", FAILED,
                        f"Slurm (read on {where}) has no node {n.node!r} (set slurm_node_name "
                        "for this host)",
                    )
                )  # fmt: skip
                continue
            out.append(state_check(n, view, obs.runs, exp.inventory))
            out.append(use_check(n, view, obs.usage, obs.usage_errors, exp.window, exp.window_s))
    return out
