"""``gpumon-deploy upgrade-driver``: preflight, the ``--check`` plan, a new run or ``--resume``.

Exit status: 0 every selected host upgraded (or already at the target); 1 a host failed, the run
stopped at --max-failures / --max-unavailable, a host was unreachable, or the run was
interrupted (continue with ``--resume RUN``); 2 bad input, a plan the matrix refuses for some
selected host, or a host that cannot install its plan (a package its sources do not offer, a
package dpkg left half-installed) -- the refused hosts are listed and nothing is touched
(``--limit`` them out, e.g. ``--limit 'gpu:!gpu04'``, to upgrade the others). ``--check``
answers as the run would: 2 for a refused plan, 1 when a selected host could not be read
(unreachable, its host key refused), so its part of the plan is unknown, 0 only for a plan of
every selected host.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from deployer.connection import Connection, LocalConnection
from deployer.errors import InputError, RefusedOnRead
from deployer.gpu import gpu_plan
from deployer.gpu.rules import PackagePin
from deployer.monitoring import rollouts
from deployer.monitoring import tier as monitoring_tier
from deployer.monitoring.silences import host_matchers
from deployer.rollout import availability, drain
from deployer.rollout.batching import plan_batches
from deployer.rollout.controller import Rollout, initial_record_skips
from deployer.rollout.drain import DrainHook, DrainStateError, make_hook, node_name
from deployer.rollout.host_targets import HostTarget, Preflight, newer_than_target, run_preflight
from deployer.rollout.options import RolloutOptions
from deployer.rollout.state import HostRecord, RunRecord, StateStore, new_run_id
from deployer.rollout.view import LiveView, plan_text, report
from deployer.secrets import mask_text
from deployer.session import TLS_DIR_UNKNOWN, DeploySession, RunOptions

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


@dataclass
class UpgradeRequest:
    """One invocation: the run's options (persisted; on ``--resume`` the record's) and what
    belongs to this invocation only."""

    inventory: Path
    to: str | None
    options: RolloutOptions = field(default_factory=RolloutOptions)
    resume: str | None = None
    check: bool = False
    output: str = "text"
    state_dir: Path | None = None


def _hook(options: RolloutOptions) -> DrainHook:
    return make_hook(
        options.drain,
        command=options.drain_command,
        pod_selector=options.pod_selector,
        timeout_s=options.job_timeout,
    )


def _drain_connection(session: DeploySession, drain_host: str | None):
    if not drain_host or drain_host in ("localhost", "controller"):
        return LocalConnection
    if drain_host not in session.inventory.hosts:
        raise InputError(
            f"drain host {drain_host!r} is not in the inventory (or say 'controller')",
            key="--drain-host",
        )

    def opener() -> Connection:
        return session.open_connection(drain_host)

    return opener


@dataclass
class BeforeRun:
    """Selected hosts out of service before the run (host -> why), and those of them someone
    else drained: the run never resumes those (``drain.owner``)."""

    out: dict[str, str]
    drained_by_others: set[str]


def _already_out(
    pre: Preflight,
    hook: DrainHook,
    opener,
    state_dir: Path | None = None,
    take_over: Collection[str] = (),
) -> BeforeRun:
    """Read every selected node's scheduler state once, before the run (errors here are input
    errors: nothing is touched yet). A node an earlier run drained is taken over only when that
    run is known to be dead: its record is on this controller and no controller drives it, or
    ``take_over`` (``--take-over``) names it; otherwise it may be another controller's run
    under way on it, and the run is refused (:func:`_earlier_run_owner`)."""
    before = BeforeRun({h: f"unreachable: {why}" for h, why in pre.unreachable.items()}, set())
    conn = None
    try:
        for h, t in pre.hosts.items():
            node = node_name(hook.kind, h, t.variables)
            check = hook.command("is_drained", node, "")
            if check is None:
                continue
            conn = conn or opener()
            result = conn.run(check, timeout=120)
            try:
                state = hook.parse_state(node, result.rc, result.stdout, result.stderr)
            except DrainStateError as exc:
                key = drain.NODE_NAME_VARS.get(hook.kind, "--drain")
                raise RefusedOnRead(
                    f"{h}: the {hook.kind} drain hook cannot read node {node!r} on the drain "
                    f"host: {exc}",
                    key=key if result.rc == 0 else "--drain",
                ) from exc
            who = drain.owner(state, None)
            if who in (drain.SOMEONE_ELSE, drain.UNKNOWN):
                why = f" ({state.state}: {state.reason!r})" if state.reason else ""
                before.out[h] = f"drained before the run ({hook.kind}){why}"
                before.drained_by_others.add(h)
            elif who == drain.EARLIER_RUN:
                run_id = drain.reason_run(state.reason) or ""
                _earlier_run_owner(h, node, run_id, state_dir, take_over)
                before.out[h] = (
                    f"drained by run {run_id}, which did not finish: this run takes it over"
                )
    finally:
        if conn is not None:
            conn.close()
    return before


def _earlier_run_owner(
    host: str, node: str, run_id: str, state_dir: Path | None, take_over: Collection[str]
) -> None:
    """Refuse (an input error) a node drained by run ``run_id`` unless this run may take it
    over (``rollouts.take_over_refusal``)."""
    said = rollouts.take_over_refusal(run_id, take_over, state_dir)
    if said is not None:
        raise RefusedOnRead(f"{host}: node {node!r} is drained by {said}", key="--take-over")


# Drain hooks whose drain keeps no owner (deployer/rollout/drain.py): a new run cannot tell a
# node an earlier run left drained from one an administrator drained, so it would leave it so.
_NO_OWNER_KINDS = ("kubernetes", "command")


def _refuse_hosts_left(req: UpgradeRequest, selected: list[str], kind: str) -> None:
    """An input error when an earlier run of this inventory on this controller, one no controller
    drives any more, left selected hosts out of service: resuming it finishes them; a new run
    over them would find them drained with no owner to tell, upgrade them and leave them
    drained. With ``--drain slurm`` the drain reason names the run and a new run takes them over
    (``drain.owner``); with ``--drain none`` nothing of theirs stays drained."""
    chosen = set(selected)
    left = [
        (run, hosts)
        for run, out in rollouts.left_mid_run(rollouts.runs_of(req.inventory, req.state_dir))
        if (hosts := {h: step for h, step in out.items() if h in chosen})
    ]
    if left:
        said = "; ".join(rollouts.left_detail(run, hosts) for run, hosts in left)
        raise InputError(
            f"{said}. A new run would not take them over: a {kind} drain keeps no owner to tell "
            "a run's from an administrator's, so it would upgrade them and leave them drained",
            key="--resume",
        )


def _new_record(
    req: UpgradeRequest, options: RolloutOptions, pre: Preflight, hook: DrainHook, opener
) -> RunRecord:
    hosts = [h for h in pre.session.hosts if h in pre.hosts]
    # hosts already at the target are skipped, so the canary is a host that really upgrades
    todo = [h for h in hosts if not pre.hosts[h].up_to_date]
    options = options.for_hosts(len(pre.session.hosts))
    batches = plan_batches(todo, options.canary, options.batch_size_hosts or 1)
    before = _already_out(pre, hook, opener, req.state_dir, options.take_over)
    t = pre.target
    record = RunRecord(
        run_id=new_run_id(t.version),
        inventory=str(Path(req.inventory).resolve()),
        target={
            "requested": t.requested,
            "branch": t.branch,
            "version": t.version,
            "listed": t.listed,
        },
        options=options,
        batches=batches,
        hosts={},
        unavailable_before=before.out,
    )
    batch_of = {h: i for i, b in enumerate(batches) for h in b}
    for h in hosts:
        ht = pre.hosts[h]
        record.hosts[h] = HostRecord(
            host=h,
            batch=batch_of.get(h, -1),
            before=ht.before,
            after=ht.after,
            inventory_driver=ht.inventory_driver,
            was_drained=True if h in before.drained_by_others else None,
        )
    initial_record_skips(record, pre.hosts)
    return record


def _plan(record: RunRecord, pre: Preflight, hook: DrainHook, tier) -> dict[str, Any]:
    hosts = {}
    for h, r in record.hosts.items():
        t = pre.hosts[h]
        node = node_name(hook.kind, h, t.variables)
        reason = f"gpumon-deploy upgrade-driver run {record.run_id}"
        steps = [
            f"{action}: {cmd}"
            for action in ("drain", "idle", "resume")
            if (cmd := hook.command(action, node, reason)) is not None
        ]
        drain = "; ".join(steps) or "none"
        if r.was_drained:
            drain += " (already drained: left drained afterwards)"
        silence = (
            " and ".join(
                "{"
                + ",".join(f'{m["name"]}{"=~" if m["isRegex"] else "="}"{m["value"]}"' for m in ms)
                + "}"
                for ms in host_matchers(h, t.address)
            )
            + f" for {record.options.silence_minutes} min on {tier.alertmanagers[0]}"
            if tier.alertmanagers
            else "no Alertmanager in the inventory: not silenced"
        )
        hosts[h] = {
            "before": r.before,
            "after": r.after,
            "drain": drain,
            "silence": silence,
            "skip": r.reason if r.state == "skipped" else None,
        }
    return {
        "target": record.target,
        "options": record.options.to_json(),
        "batches": record.batches,
        "unavailable_before": record.unavailable_before,
        "hosts": hosts,
    }


def _print_refusals(pre: Preflight, err: TextIO) -> None:
    for r in pre.refusals:
        print(f"REFUSED {r}", file=err)
    if any(r.rule == TLS_DIR_UNKNOWN for r in pre.refusals):
        print("nothing was changed: this controller's gpumon_tls_dir does not hold the tier's "
              "CA (see above)", file=err)  # fmt: skip
        return
    hosts = sorted({r.host for r in pre.refusals})
    print(
        f"nothing was changed: the target {pre.target.version} is refused for "
        f"{', '.join(hosts)}; leave them out with --limit (e.g. --limit 'gpu:!{hosts[0]}')",
        file=err,
    )


def _packages_offered(
    pre: Preflight, finished: Collection[str], *, check: bool, err: TextIO
) -> bool:
    """Whether every host the run installs on can install its plan: every package offered by
    its sources, nothing dpkg left half-installed (deployer/rollout/availability.py), room for
    it on its filesystems (``nvidia_driver_min_free_mib``: deployer/rollout/free_space.py), a
    boot loader that starts a kernel DKMS builds its module for (boot_kernel.py); the refusals
    printed when not. Hosts a resumed run ``finished`` are not asked."""
    wanted = {
        h: t.resolved.install + _headers(t)
        for h, t in pre.hosts.items()
        if not t.up_to_date and t.facts.os_family == "debian" and h not in finished
    }
    if not wanted:
        return True
    pool = pre.session.pool
    verdict = availability.check(
        wanted,
        lambda host, command, timeout: pool.get(host).run(command, timeout=timeout),
        refresh=not check,
        space={h: gpu_plan.min_free_mib(h, pre.hosts[h].variables) for h in wanted},
        kernels={h: (pre.hosts[h].facts.kernel, pre.hosts[h].facts.newest_kernel) for h in wanted},
    )
    for host, note in sorted(verdict.notes.items()):
        print(f"NOTE {host}: {note}", file=err)
    if not verdict.refusals:
        return True
    pre.refusals = sorted(verdict.refusals, key=lambda r: r.host)
    _print_refusals(pre, err)
    return False


def _headers(t: HostTarget) -> tuple[PackagePin, ...]:
    """The kernel headers the driver role installs before the driver (the running kernel's, the
    newest installed kernel's), where the host lacks them."""
    names = gpu_plan.kernel_headers_packages(vars(t.facts), t.variables)  # no copy: read only
    return tuple(PackagePin(n, None, None, gpu_plan.HEADERS_COMPONENT) for n in names)


def upgrade_driver(
    req: UpgradeRequest, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command; the exit status (see the module docstring)."""
    out = out or sys.stdout  # looked up at call time: the streams a caller set up (click's)
    err = err or sys.stderr
    options, to, record = req.options, req.to, None
    if req.resume:
        store = StateStore.find(req.resume, req.state_dir)
        record = store.load()
        if req.to is not None and req.to not in (
            record.target["requested"],
            record.target["version"],
        ):
            raise InputError(
                f"run {record.run_id} upgrades to {record.target['version']}, not {req.to}",
                key="--to",
            )
        options, to = record.options, record.target["version"]  # the run's, as it was started
    hook = _hook(options)
    if to is None:
        raise InputError("--to BRANCH_OR_VERSION is required (or --resume RUN)", key="--to")
    options.check()  # bad amounts are input errors before any host is contacted
    # The command's one session: inventory, site, roles and templates loaded once for the
    # preflight, the monitoring tier and every converge of the run.
    session = DeploySession.load(
        RunOptions(
            inventory=req.inventory, limit=options.limit, extra_vars=list(options.extra_vars)
        ),
        plan=False,
    )
    try:
        if record is None and hook.kind in _NO_OWNER_KINDS:
            _refuse_hosts_left(req, session.hosts, hook.kind)  # before any host is contacted
        pre = run_preflight(session, to)
        # hosts a resumed run finished are never touched again: only the others need preflight
        finished = (
            set() if record is None
            else {h for h, r in record.hosts.items() if r.state in ("done", "skipped")}
        )  # fmt: skip
        if record is not None:
            pending = [h for h in record.hosts if h not in finished]
            refused = [r for r in pre.refusals if r.host in pending]
            if refused:
                pre.refusals = refused
                _print_refusals(pre, err)
                return EXIT_INPUT
            missing = [h for h in pending if h not in pre.hosts and h not in pre.unreachable]
            if missing:
                raise InputError(
                    f"hosts of run {record.run_id} not in the inventory any more: {', '.join(missing)}",
                    key="-i",
                )
        elif pre.refusals:
            _print_refusals(pre, err)
            return EXIT_INPUT
        for h, t in sorted(pre.hosts.items()):
            running = newer_than_target(pre.target, t)
            if running is not None and h not in finished:  # an explicit version: said
                print(
                    f"NOTE {h}: driver {running} -> {pre.target.version} is a downgrade, as "
                    f"--to {pre.target.requested} asks",
                    file=err,
                )
        if not _packages_offered(pre, finished, check=req.check, err=err):
            return EXIT_INPUT
        opener = _drain_connection(session, options.drain_host)
        tier = monitoring_tier.load(session)
        if record is None:
            record = _new_record(req, options, pre, hook, opener)
        for h, why in pre.unreachable.items():
            said = "FAILED (its facts could not be read)" if h in session.unread else "UNREACHABLE"
            print(f"{said} {h}: {why} (counted out of service, not upgraded)", file=err)
        if req.check:
            plan = _plan(record, pre, hook, tier)
            if req.output == "json":
                out.write(_shown(plan))
            else:
                out.write(plan_text(plan) + "\n")
            # as the run itself would: a host that could not be read is not planned (exit 1)
            return EXIT_FAILED if pre.unreachable else EXIT_OK
        if not req.resume:
            store = StateStore.create(record, req.state_dir)
        print(f"run {record.run_id}: state in {store.path}", file=err)
        with store.locked(), LiveView(err) as view:
            rollout = Rollout(
                record=record,
                store=store,
                targets=pre.hosts,
                hook=hook,
                tier=tier,
                session=session,
                drain_connection=opener,
                view=view,
            )
            record = rollout.run()
        data = report(record)
        path = store.write_report(data)
        if req.output == "json":
            out.write(_shown(data))
        summary = data["summary"]
        print(
            f"run {record.run_id} {record.status}"
            + (f": {record.stop_reason}" if record.stop_reason else "")
            + f"; report {path}",
            file=err,
        )
        for h, why in summary["failed"].items():
            left = (
                "returned to the scheduler: nothing was changed on it"
                if record.hosts[h].returned
                else "left drained and silenced"
            )
            print(f"FAILED {h}: {why} ({left})", file=err)
        ok = record.status == "finished" and not record.failures() and not pre.unreachable
        return EXIT_OK if ok else EXIT_FAILED
    finally:
        session.pool.close_all()


def _shown(data: Any) -> str:
    """A plan or report as ``--output json`` prints it: the run's options keep the ``-e`` values
    they were given (the state file, 0600, needs them to resume), and a secret among them (a
    password given with ``-e``) is masked, as every registered secret is."""
    return mask_text(json.dumps(data, indent=2, default=str)) + "\n"
