"""The rollout controller: drives every host of a run through the state machine, batch by batch.

Batches run one after another; the hosts of a batch run in parallel, each in its own thread,
each step recorded in the run's state file (``state.StateStore``) before the next begins. Hosts
interrupted mid-step (a lost connection, Ctrl-C, a killed controller) are taken up again by
``--resume`` at the step they were in; every step is idempotent, so repeating the interrupted one
is safe, and finished hosts are never touched again.

The GPU roles are converged through the command's one ``DeploySession`` (what it loaded serves
every converge: ``converge_hosts``) for one host at a time, with the target driver and
``nvidia_driver_reboot: never`` as typed overrides: the first converge ("installing") installs the
pinned packages and stops at the role's check tagged ``nvidia_driver_loaded`` when a reboot is
needed; the rollout reboots (or reloads the modules) itself, then converges again ("starting") so
that DCGM, its CUDA variant and the exporter come up on the new driver and the roles verify them.
Every step reaches its host through a ``HostAccess`` (deployer/hostaccess.py) on the session's
kept connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from deployer import boot
from deployer.connection import CommandResult, Connection, LocalConnection
from deployer.errors import HostUnreachable
from deployer.gpu.driver_record import DriverRecord, write_command
from deployer.hostaccess import HostAccess, Interrupted, pause
from deployer.monitoring import rollouts
from deployer.monitoring import tier as monitoring_tier
from deployer.monitoring.http import Fetch, http_fetch
from deployer.monitoring.silences import SilenceError, Silences, host_matchers, silence_payload
from deployer.plan import PlannedTask
from deployer.results import RunReport, Status, TaskResult
from deployer.roles import Play
from deployer.rollout import batching, drain, hostops
from deployer.rollout.drain import DrainHook, DrainStateError, NodeState, node_name
from deployer.rollout.host_targets import GPU_ROLES, HostTarget
from deployer.rollout.hostops import output_tail
from deployer.rollout.options import RolloutOptions, Timeouts, target_overrides
from deployer.rollout.state import FAILED, SKIPPED, TERMINAL, RunRecord, StateStore, next_step
from deployer.rollout.validation import validate
from deployer.session import DeploySession
from deployer.spans import span, timed

POLL_S = 5.0
# Steps that change nothing on the host: a host that fails in one (GPU jobs still running at
# --job-timeout, the drain refused) goes back to the scheduler as the run found it.
BEFORE_ANY_CHANGE = ("draining", "waiting_jobs")
# The nvidia_driver role's check that the loaded kernel module is the planned driver: the one
# failure the installing converge expects when the new driver needs a reboot (the next step).
LOADED_CHECK_TAG = "nvidia_driver_loaded"
Clock = Callable[[], float]


class StepFailed(Exception):
    """The host cannot go on: it stays where it is (drained, silenced) with this reason."""


class View:
    """Progress callbacks (the live table implements them)."""

    def changed(self, record: RunRecord, host: str) -> None:
        pass

    def detail(self, host: str, text: str) -> None:
        pass

    def message(self, text: str) -> None:
        pass


class _TaskEvents:
    """Engine events of one host's converge, shown as that host's detail."""

    def __init__(self, view: View, host: str) -> None:
        self.view, self.host = view, host

    def host_started(self, host: str) -> None:
        pass

    def task_started(self, host: str, task: PlannedTask) -> None:
        self.view.detail(self.host, f"{task.role}: {task.name}")

    def task_done(self, result: TaskResult) -> None:
        pass

    def host_done(self, host: str, status: str) -> None:
        pass


@dataclass
class Rollout:
    record: RunRecord
    store: StateStore
    targets: dict[str, HostTarget]
    hook: DrainHook
    tier: monitoring_tier.MonitoringTier
    session: DeploySession
    drain_connection: Callable[[], Connection] = LocalConnection
    view: View = field(default_factory=View)
    http_fetch: Fetch = http_fetch
    silences: Silences | None = None
    clock: Clock = time.monotonic
    sleep: Callable[[float], None] | None = None  # None: wait on the stop event (Ctrl-C ends it)
    timeouts: Timeouts = field(default_factory=Timeouts)
    # host -> its access (default: the session's kept connections, this run's clock and stop)
    access: Callable[[str], HostAccess] | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._hosts: dict[str, HostAccess] = {}
        self._drain_conn: Connection | None = None
        self._drain_lock = threading.Lock()
        if self.silences is None and self.tier.alertmanagers:
            self.silences = Silences(self.tier.alertmanagers)

    @property
    def options(self) -> RolloutOptions:
        """The run's options, as persisted in its record."""
        return self.record.options

    # ------------------------------------------------------------------ the run
    def run(self) -> RunRecord:
        """Drive the run to its end, a stop (max failures / unavailable) or an interruption."""
        rec = self.record
        rec.status, rec.stop_reason = "running", None
        self.store.save(rec)
        try:
            for index, batch in enumerate(rec.batches):
                if not self._run_batch(index, batch):
                    break
            else:
                rec.status = "finished"
        except KeyboardInterrupt:
            self._stop.set()
            rec.status = "interrupted"
            rec.stop_reason = "interrupted (Ctrl-C): continue with --resume"
        finally:
            if self._drain_conn is not None:
                self._drain_conn.close()
            self.store.save(rec)
        return rec

    def _run_batch(self, index: int, batch: list[str]) -> bool:
        """Run one batch to its end; False when the run must stop.

        The batch's hosts are driven in parallel as --max-unavailable allows; the limits are
        judged again every time a host finishes (``batching.next_hosts``), so a place freed by a
        host that came back goes to the next pending host of the batch at once, and a limit is
        only a stop when no host of the run is still being driven to free a place."""
        rec = self.record
        running: dict[str, Future[None]] = {}
        with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
            try:
                while True:
                    if rec.status != "interrupted":
                        interrupted = [
                            h
                            for h in batch
                            if h not in running and rec.hosts[h].state not in TERMINAL | {"pending"}
                        ]
                        fresh = [
                            h for h in batch if h not in running and rec.hosts[h].state == "pending"
                        ]
                        step = batching.next_hosts(
                            interrupted,
                            fresh,
                            running=running,
                            out_of_service=rec.out_of_service(),
                            max_unavailable=rec.options.max_unavailable_hosts or 1,
                            failures=len(rec.failures()),
                            max_failures=rec.options.max_failures,
                        )
                        if step.start:
                            self.view.message(
                                f"batch {index + 1}/{len(rec.batches)}: {', '.join(step.start)}"
                            )
                        for h in step.start:
                            if rec.hosts[h].state == "pending":
                                # out of service in the state file before its thread runs
                                self._enter(h, "draining")
                            running[h] = pool.submit(self._drive, h)
                        if step.stop_reason and not running:
                            self._stopped(step.stop_reason)
                            return False
                    if not running:
                        break
                    finished, _ = wait(running.values(), timeout=0.2, return_when=FIRST_COMPLETED)
                    for h, f in list(running.items()):
                        if f in finished:
                            del running[h]
                            f.result()
            except KeyboardInterrupt:
                self._stop.set()
                rec.status = "interrupted"
                rec.stop_reason = "interrupted (Ctrl-C): continue with --resume"
                for f in running.values():
                    f.exception()
                raise
        if rec.status == "interrupted":
            return False
        failed = [h for h in batch if rec.hosts[h].state == FAILED]
        if index == 0 and rec.options.canary and failed:
            self._stopped(f"the canary failed ({', '.join(failed)}): no further batch is started")
            return False
        if len(rec.failures()) >= rec.options.max_failures and index + 1 < len(rec.batches):
            self._stopped(
                f"--max-failures {rec.options.max_failures} reached "
                f"({', '.join(rec.failures())}): no new batch is started"
            )
            return False
        return True

    def _stopped(self, reason: str) -> None:
        self.record.status, self.record.stop_reason = "stopped", reason
        self.view.message(f"stopped: {reason}")
        self.store.save(self.record)

    # ------------------------------------------------------------------ one host
    def _drive(self, host: str) -> None:
        rec = self.record.hosts[host]
        if rec.state == "pending":
            self._enter(host, "draining")
        while rec.state not in TERMINAL:
            if self._stop.is_set():
                return
            step = rec.state
            try:
                with span(f"step:{step}", host):
                    getattr(self, f"_step_{step}")(host)
            except StepFailed as exc:
                if step in BEFORE_ANY_CHANGE:
                    self._release(host)
                self._fail(host, str(exc))
                return
            except HostUnreachable as exc:
                with self._lock:
                    rec.notes.append(f"{step}: connection lost: {exc}")
                    self.record.status = "interrupted"
                    self.record.stop_reason = (
                        f"{host}: connection lost during {step}; continue with --resume"
                    )
                self._host(host).drop()
                self.store.save(self.record)
                self.view.changed(self.record, host)
                return
            except Interrupted:
                return
            except Exception as exc:  # a bug must fail this host, not leave it unrecorded
                self._fail(host, f"{type(exc).__name__}: {exc}")
                return
            self._enter(host, next_step(step))

    def _enter(self, host: str, step: str) -> None:
        rec = self.record.hosts[host]
        with self._lock:
            rec.state = step
            rec.history.append([step, time.time()])
        self.store.save(self.record)
        self.view.changed(self.record, host)

    def _fail(self, host: str, reason: str) -> None:
        rec = self.record.hosts[host]
        with self._lock:
            rec.failed_step = rec.state
            rec.reason = reason
            rec.state = FAILED
            rec.history.append([FAILED, time.time()])
        self.store.save(self.record)
        self.view.changed(self.record, host)

    def _note(self, host: str, text: str) -> None:
        with self._lock:
            self.record.hosts[host].notes.append(text)
        self.store.save(self.record)

    # ------------------------------------------------------------------ connections
    def _host(self, host: str) -> HostAccess:
        with self._lock:
            access = self._hosts.get(host)
            if access is None:
                access = (
                    self.access(host)
                    if self.access is not None
                    else HostAccess(host, self.session.pool, self._stop, self.clock, self.sleep)
                )
                self._hosts[host] = access
        return access

    def _run_on(self, host: str, command: str, *, timeout: float | None = None) -> CommandResult:
        return self._host(host).run(command, timeout=timeout)

    def _drain_run(self, command: str) -> CommandResult:
        with self._drain_lock:
            if self._drain_conn is None or getattr(self._drain_conn, "closed", False):
                self._drain_conn = self.drain_connection()
            conn = self._drain_conn
        return conn.run(command, timeout=self.options.job_timeout + 60)

    def _wait(self, seconds: float) -> None:
        pause(self._stop, seconds, self.sleep)

    # ------------------------------------------------------------------ the steps
    def _reason(self, host: str) -> str:
        return drain.run_reason(
            self.record.run_id,
            self.record.hosts[host].before.get("driver_installed"),
            self.record.target["version"],
        )

    def _node(self, host: str) -> str:
        return node_name(self.hook.kind, host, self.targets[host].variables)

    def _node_state(self, host: str) -> NodeState | None:
        """The node as the scheduler sees it now (None: the hook has no scheduler)."""
        node = self._node(host)
        check = self.hook.command("is_drained", node, "")
        if check is None:
            return None
        result = self._drain_run(check)
        try:
            return self.hook.parse_state(node, result.rc, result.stdout, result.stderr)
        except DrainStateError as exc:
            raise StepFailed(f"cannot read the {self.hook.kind} state of {node}: {exc}") from exc

    def _step_draining(self, host: str) -> None:
        rec = self.record.hosts[host]
        node = self._node(host)
        state = self._node_state(host)
        if state is None:
            return
        who = drain.owner(state, self.record.run_id)
        if who == drain.EARLIER_RUN:
            # drained by a run that may be alive (another controller's, since the preflight):
            # failed here, the node left as it is, never taken over
            said = rollouts.take_over_refusal(
                drain.reason_run(state.reason) or "", self.options.take_over, self.store.dir.parent
            )
            if said is not None:
                raise StepFailed(f"node {node!r} is drained by {said}")
        if rec.was_drained is None:
            with self._lock:
                rec.was_drained = who in (drain.SOMEONE_ELSE, drain.UNKNOWN)
            if who == drain.EARLIER_RUN:
                self._note(
                    host,
                    f"drained by run {drain.reason_run(state.reason)}, which did not finish: "
                    "this run takes the drain over (and resumes the node after validation)",
                )
            self.store.save(self.record)
        elif rec.drained_by_run and who == drain.SOMEONE_ELSE:
            # a resumed run: someone drained the node again, with their reason, after this run
            # had drained it; the drain is theirs now and the run leaves it to them
            with self._lock:
                rec.drained_by_run = False
            self._note(host, f"drained again by someone else during the run ({state.reason!r})")
        if who in (drain.NOBODY, drain.EARLIER_RUN):
            if rec.was_drained:
                # drained when the run started, in service now: it is drained like any other
                with self._lock:
                    rec.was_drained = False
                self._note(host, "resumed by someone else since the run started: drained again")
            result = self._drain_run(self.hook.command("drain", node, self._reason(host)) or "")
            if result.rc != 0:
                raise StepFailed(f"drain failed (rc={result.rc}): {output_tail(result)}")
            with self._lock:
                rec.drained_by_run = True
            self.store.save(self.record)
        elif who == drain.THIS_RUN and not rec.drained_by_run:
            with self._lock:  # drained, then interrupted before the state file said so
                rec.drained_by_run = True
            self.store.save(self.record)
        idle = self.hook.command("idle", node, "") or "true"
        deadline = self.clock() + self.options.job_timeout
        while True:
            result = self._drain_run(idle)
            if result.rc == 0:
                return
            if self.clock() >= deadline:
                raise StepFailed(
                    f"the scheduler still runs work on {node} after "
                    f"{self.options.job_timeout}s (--job-timeout): {output_tail(result)}"
                )
            self.view.detail(
                host, f"waiting for the scheduler to empty {node}: {output_tail(result, 1)}"
            )
            self._wait(POLL_S)

    def _release(self, host: str) -> None:
        """Give a host that failed before anything changed on it back to the scheduler: resume
        it when this run drained it and the drain is still the run's."""
        rec = self.record.hosts[host]
        if not rec.drained_by_run:
            return
        try:
            if self._resume_if_ours(host, "returned to the scheduler unchanged"):
                with self._lock:
                    rec.returned = True
                self.store.save(self.record)
        except (StepFailed, HostUnreachable) as exc:
            self._note(host, f"could not return it to the scheduler: {exc}")

    def _resume_if_ours(self, host: str, done: str) -> bool:
        """Resume the node if the drain on it is this run's (the reason says so, where the
        scheduler keeps one); otherwise leave it and say why. True when it is in service."""
        state = self._node_state(host)
        if state is None:
            return False
        who = drain.owner(state, self.record.run_id)
        if who == drain.NOBODY:
            self._note(
                host,
                f"already back in service ({state.state or 'not drained'}): "
                "resumed by someone else during the run",
            )
            return True
        if who not in (drain.THIS_RUN, drain.UNKNOWN):
            self._note(
                host,
                f"left drained: drained again during the run by someone else ({state.reason!r})",
            )
            return False
        command = self.hook.command("resume", self._node(host), "")
        if command is None:
            return False
        result = self._drain_run(command)
        if result.rc != 0:
            raise StepFailed(f"undrain failed (rc={result.rc}): {output_tail(result)}")
        self._note(host, done)
        return True

    def _step_waiting_jobs(self, host: str) -> None:
        check = self.targets[host].variables.get(
            "nvidia_driver_check", "/usr/local/libexec/gpumon/nvidia-driver-check"
        )
        script = hostops.jobs_script(str(check))
        deadline = self.clock() + self.options.job_timeout
        while True:
            result = self._run_on(host, script, timeout=60)
            if result.rc == 0:
                return
            if result.rc != 3:
                raise StepFailed(f"cannot list GPU processes: {output_tail(result)}")
            if self.clock() >= deadline:
                raise StepFailed(
                    f"GPU compute processes still running after {self.options.job_timeout}s: "
                    + "; ".join(result.stdout.strip().splitlines()[:5])
                )
            self.view.detail(host, "GPU jobs: " + "; ".join(result.stdout.split("\n")[:2]))
            self._wait(POLL_S)

    def _step_silencing(self, host: str) -> None:
        rec = self.record.hosts[host]
        if self.silences is None:
            if not any("not silenced" in n for n in rec.notes):
                self._note(host, "no Alertmanager in the inventory: not silenced")
            return
        comment = self._reason(host)
        for matchers in host_matchers(host, self.targets[host].address):
            existing = self.silences.find(comment, matchers)
            try:
                if existing is None:
                    payload = silence_payload(
                        matchers,
                        start=time.time(),
                        minutes=self.options.silence_minutes,
                        comment=comment,
                    )
                    existing, peer = self.silences.create(payload, prefer=rec.silence_peer)
                    with self._lock:
                        rec.silence_peer = peer
            except SilenceError as exc:
                raise StepFailed(str(exc)) from exc
            with self._lock:
                if existing not in rec.silence_ids:
                    rec.silence_ids.append(existing)
            self.store.save(self.record)

    def _step_stopping(self, host: str) -> None:
        result = self._run_on(host, hostops.stop_services_script(), timeout=180)
        if result.rc != 0:
            raise StepFailed(f"stopping the GPU services failed: {output_tail(result)}")

    def _step_installing(self, host: str) -> None:
        report = self._converge(host)
        failed = _failed_tasks(report, host)
        if report.host(host).unreachable:
            raise HostUnreachable(report.host(host).unreachable)
        if not failed:
            return
        # The one failure expected: the role's check that the loaded module is the target, when
        # a reboot or reload is needed to load it (the next step does that).
        t = failed[0]
        if len(failed) == 1 and LOADED_CHECK_TAG in t.tags:
            return
        raise StepFailed(f"converge failed at {t.role}: {t.task}: {t.error}")

    def _step_rebooting(self, host: str) -> None:
        rec = self.record.hosts[host]
        want = self.record.target["version"]
        loaded = self._run_on(host, hostops.LOADED_DRIVER, timeout=30).stdout.strip()
        mode = self.options.reboot
        access = self._host(host)
        boot_now = access.boot_id()
        marker = [n for n in rec.notes if n.startswith("boot before reboot: ")]
        if mode == "always":
            if marker and marker[-1].split(": ", 1)[1] != boot_now:
                return  # rebooted already (a resumed run)
        elif loaded == want:
            return
        if mode == "never":
            self.view.detail(host, "reloading the NVIDIA kernel modules")
            result = self._run_on(host, hostops.RELOAD_MODULES, timeout=300)
            loaded = self._run_on(host, hostops.LOADED_DRIVER, timeout=30).stdout.strip()
            if result.rc != 0 or loaded != want:
                raise StepFailed(
                    f"module reload did not load {want} (loaded: {loaded or 'none'}): "
                    f"{output_tail(result)}; reboot the host or use --reboot auto"
                )
            return
        self._note(host, f"boot before reboot: {boot_now}")
        self.view.detail(host, f"rebooting (loaded {loaded or 'none'}, want {want})")
        timeout = int(
            self.targets[host].variables.get("nvidia_driver_reboot_timeout", self.timeouts.reboot_s)
        )
        try:
            access.reboot(boot_now, timeout)
        except boot.NotBack as exc:
            raise StepFailed(str(exc)) from None

    def _step_starting(self, host: str) -> None:
        report = self._converge(host)
        if report.host(host).unreachable:
            raise HostUnreachable(report.host(host).unreachable)
        failed = _failed_tasks(report, host)
        if failed:
            t = failed[0]
            raise StepFailed(f"converge failed at {t.role}: {t.task}: {t.error}")

    def _step_validating(self, host: str) -> None:
        rec = self.record.hosts[host]
        target = self.targets[host]
        # the GPUs seen before the run (kept in the state file, so a resumed run checks the same)
        uuids = set(rec.before.get("gpu_uuids") or [g.uuid for g in target.facts.gpus])
        problems, checks = validate(
            self._host(host),
            target,
            want=self.record.target["version"],
            expected_uuids=uuids,
            diag_level=self.options.diag_level,
            tier=self.tier,
            fetch=timed("http", self.http_fetch),
            timeouts=self.timeouts,
            detail=lambda text: self.view.detail(host, text),
        )
        with self._lock:
            rec.validation = checks
        self.store.save(self.record)
        if problems:
            raise StepFailed("validation failed: " + "; ".join(problems))

    def _step_recording(self, host: str) -> None:
        """The validated target written on the host (``deployer.gpu.driver_record``): the next
        ``up`` keeps this driver while the inventory still says what it said at the start."""
        target = self.record.target
        record = DriverRecord(
            version=target["version"],
            branch=target["branch"],
            run_id=self.record.run_id,
            finished=time.time(),
            inventory=dict(self.record.hosts[host].inventory_driver),
        )
        result = self._run_on(host, write_command(record), timeout=60)
        if result.rc != 0:
            raise StepFailed(f"recording the driver on the host failed: {output_tail(result)}")

    def _step_undraining(self, host: str) -> None:
        rec = self.record.hosts[host]
        if not rec.drained_by_run:
            if rec.was_drained:
                self._note(host, "left drained: it was drained before the run")
            return
        self._resume_if_ours(host, "resumed: back in service")

    def _step_unsilencing(self, host: str) -> None:
        rec = self.record.hosts[host]
        if self.silences is None:
            return
        for sid in rec.silence_ids:
            try:
                self.silences.expire(sid, prefer=rec.silence_peer)
            except SilenceError as exc:
                raise StepFailed(str(exc)) from exc

    # ------------------------------------------------------------------ converge
    def _converge(self, host: str) -> RunReport:
        """The GPU roles' plays for ``host`` on the session (its facts read again), pointed at
        the target by typed overrides (no ``-e`` text to parse again)."""
        plays = _gpu_plays(self.session.plays)
        return self.session.converge_hosts(
            [host],
            plays,
            overrides=target_overrides(self.record.target),
            events=_TaskEvents(self.view, host),
        )


def _gpu_plays(plays: tuple[Play, ...]) -> tuple[Play, ...]:
    """The site's plays of GPU roles only (a play that also applies another role is left out)."""
    return tuple(p for p in plays if p.roles and set(p.roles) <= set(GPU_ROLES))


def _failed_tasks(report: RunReport, host: str) -> list[TaskResult]:
    return [t for t in report.host(host).tasks if t.status == Status.FAILED]


def initial_record_skips(record: RunRecord, targets: dict[str, HostTarget]) -> None:
    """Mark up-to-date hosts skipped (they need no upgrade)."""
    for h, t in targets.items():
        if t.up_to_date and record.hosts[h].state == "pending":
            record.hosts[h].state = SKIPPED
            record.hosts[h].reason = f"already runs {t.resolved.driver_version}"
            record.hosts[h].history.append([SKIPPED, time.time()])
