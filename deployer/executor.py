"""Parallel converge: every host's plan runs on its own kept-open connection, hosts in parallel.

Per host and play: all read scripts go to the host in one round trip; each task then compares
desired with actual, writes only the difference (never in check mode), and reads again to prove
it. A write outdates every read taken before it: the read that proves a write also reads the next
task, and a task left without a current read is read again, batched with the tasks after it.
Handlers run once per host after the play's roles, in handler-file order. One host's failure
or unreachability never stops the others.

Two guarantees hold across runs and replicas:

- A handler a change notified is owed until it ran successfully: the owed handler is recorded
  on the host before the change (deployer/owed.py) and cleared after it ran, and every run reads
  the record first, so a run that stopped after a change (a failed task, a lost controller)
  leaves the next run on that host to run it, even when that run changes nothing.
- A task with ``ha_peers`` (a restart of one replica of an HA pair) never takes its service down
  while no peer answers its readiness URL (that would leave no replica serving); nor is a change
  made whose notified handler would then do so. ``allow_ha_degraded`` lifts this.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployer import owed
from deployer.connection import CommandFailed, CommandResult
from deployer.errors import HostUnreachable
from deployer.hostsession import (
    Connector,
    HostState,
    PlayReads,
    Prefetched,
    ReadSession,
    WriteSession,
    batch_read,
    batch_run,
    first_read_scripts,
)
from deployer.modules.base import ContentDiff, Observation, q, run_checked
from deployer.modules.wait_for import tls_client_opts
from deployer.plan import HostPlan, HostPlay, PlannedTask
from deployer.results import RunReport, Status, TaskResult
from deployer.roles import Play
from deployer.secrets import MASK, mask_text

DEFAULT_FORKS = 50
# Reads that fail (non-zero exit or unparsable output) are tried this often, this far apart.
READ_ATTEMPTS = 3
READ_RETRY_DELAY_S = 1.0
# After a write outdated the reads taken before it, the next task without a read is read together
# with up to this many tasks after it (a cold run changes most tasks: a bigger batch would mostly
# be read again after the next write).
REREAD_BATCH = 8
# At most this many lines of a composed failure message (a unit's state and journal lines).
FAILURE_LINES = 40


class Events(Protocol):
    """Progress callbacks (the console reporter implements them; the engine never prints)."""

    def host_started(self, host: str) -> None: ...
    def task_started(self, host: str, task: PlannedTask) -> None: ...
    def task_done(self, result: TaskResult) -> None: ...
    def host_done(self, host: str, status: str) -> None: ...


class NoEvents:
    def host_started(self, host: str) -> None:
        pass

    def task_started(self, host: str, task: PlannedTask) -> None:
        pass

    def task_done(self, result: TaskResult) -> None:
        pass

    def host_done(self, host: str, status: str) -> None:
        pass


@dataclass
class Executor:
    connector: Connector
    check: bool = False
    diff: bool = False
    forks: int = DEFAULT_FORKS
    events: Events = NoEvents()  # noqa: RUF009 - stateless default
    # Where each host keeps its owed handlers (None: deployer/owed.py's OWED_DIR).
    owed_dir: str | None = None
    # Take a service with HA peers down even when a peer does not serve (--allow-ha-degraded).
    allow_ha_degraded: bool = False
    # Hosts' first batched reads already taken (with their facts): hostsession.Prefetched.
    prefetched: dict[str, Prefetched] = field(default_factory=dict)
    # The connections are the caller's (a session's pool that serves later steps: the
    # rollout's): leave them open at the end of the run instead of closing them.
    keep_connections: bool = False

    def __post_init__(self) -> None:
        self._hosts: dict[str, HostState] = {}
        self._lock = threading.Lock()
        self._owed_dir: str = self.owed_dir or owed.OWED_DIR
        # Hosts whose prefetched read was not this executor's first read (read again: one
        # round trip more each); bench and tests look here, nothing else does.
        self.prefetch_unused: list[str] = []

    def run(
        self,
        plans: list[HostPlan],
        plays: tuple[Play, ...],
        unreachable: dict[str, str] | None = None,
        unread: dict[str, str] | None = None,
    ) -> RunReport:
        """Converge ``plans``; hosts in ``unreachable`` (found so while gathering facts) are
        reported unreachable without another attempt, those in ``unread`` (their facts script
        did not finish) failed by a task ``facts`` saying why, before any of their tasks."""
        report = RunReport(check_mode=self.check)
        for plan in plans:
            hreport = report.host(plan.host)
            self._hosts[plan.host] = HostState(plan.host, self.connector)
            if unreachable and plan.host in unreachable:
                hreport.unreachable = mask_text(unreachable[plan.host])
                hreport.tasks.append(
                    TaskResult(
                        plan.host, "", "connect", "", Status.UNREACHABLE, error=hreport.unreachable
                    )
                )
            elif unread and plan.host in unread:
                hreport.failed = True
                failed = TaskResult(
                    plan.host, "", "facts", "", Status.FAILED, error=mask_text(unread[plan.host])
                )
                hreport.tasks.append(failed)
                self.events.task_done(failed)
        try:
            for play in plays:
                todo = [
                    (p.host, hp)
                    for p in plans
                    for hp in p.plays
                    if hp.play is play and not report.host(p.host).unreachable
                ]
                batch = play.serial or len(todo) or 1
                for start in range(0, len(todo), batch):
                    group = todo[start : start + batch]
                    if play.serial and any(report.host(h).failed for h, _ in todo):
                        # A serial play (an HA pair, say) stops at the first failure.
                        break
                    with ThreadPoolExecutor(
                        max_workers=max(1, min(self.forks, len(group)))
                    ) as pool:
                        list(pool.map(lambda job: self._run_host_play(*job, report), group))
        finally:
            if not self.keep_connections:
                for h in self._hosts.values():
                    h.close()
            report.finished = time.time()
        return report

    # ---- one host, one play --------------------------------------------------------------
    def _run_host_play(self, host: str, hp: HostPlay, report: RunReport) -> None:
        hreport = report.host(host)
        if hreport.failed or hreport.unreachable:
            return
        state = self._hosts[host]
        self.events.host_started(host)
        try:
            self._converge(state, hp, hreport)
            status = "failed" if hreport.failed else "done"
        except HostUnreachable as exc:
            hreport.unreachable = mask_text(str(exc))
            hreport.tasks.append(
                TaskResult(host, "", "connect", "", Status.UNREACHABLE, error=hreport.unreachable)
            )
            status = "unreachable"
            state.close()
        self.events.host_done(host, status)

    def _converge(self, state: HostState, hp: HostPlay, hreport: Any) -> None:
        # state.conn() every time, never kept: a task (a reboot) may replace the connection.
        # Reads no write has outdated yet: all of the play's, in one round trip first (with the
        # host's owed handlers, the first time this run reads the host). After a write, the
        # read that verifies it also reads the next task; a task with no current read gets one
        # batched with the tasks after it (see REREAD_BATCH).
        reads = PlayReads(hp.tasks)
        positions, scripts = first_read_scripts(hp, self._owed_dir)
        first_on_host = state.owed is None
        if not first_on_host:
            scripts.pop(0)  # the owed handlers are read once per run
        # The same first read taken with the host's facts (one round trip fewer; the session's
        # converge), used once and only when it read exactly these scripts.
        pre = self.prefetched.pop(state.name, None) if first_on_host else None
        if pre is not None and pre.scripts == tuple(scripts):
            results = list(pre.results)
        else:
            if pre is not None:
                with self._lock:
                    self.prefetch_unused.append(state.name)
            results = batch_run(state.conn(), scripts)
        if first_on_host:
            raw = results.pop(0) or state.conn().run(owed.read_script(self._owed_dir))
            state.owed = owed.parse(raw.stdout) if raw.rc == 0 else {}
            state.owed_at_start = dict(state.owed)
        reads.replace(positions, results)
        changed_before = False
        # Handlers an earlier run owes this play's roles run as if notified now.
        notified: set[str] = {
            name for name, h in hp.handlers.items() if owed.key(h.role, name) in (state.owed or {})
        }
        for pos, task in enumerate(hp.tasks):
            if task.flush_handlers:
                ran = bool(notified)
                if not self._run_handlers(state, hp, notified, hreport):
                    return
                notified.clear()
                changed_before = True  # handlers may have moved any later task's state
                if ran:
                    reads.clear()
                continue
            if pos not in reads:
                reads.read(state.conn(), reads.upcoming(pos, REREAD_BATCH))
            result = self._run_task(
                state,
                task,
                reads[pos],
                changed_before,
                reads=reads,
                ahead=reads.upcoming(pos + 1, 1),
                notifies=[(n, hp.handlers[n]) for n in task.notify],
            )
            hreport.tasks.append(result)
            self.events.task_done(result)
            if result.status == Status.FAILED:
                hreport.failed = True
                return
            if result.status == Status.CHANGED:
                changed_before = True
                notified.update(task.notify)
        self._run_handlers(state, hp, notified, hreport)

    def _run_handlers(
        self, state: HostState, hp: HostPlay, notified: set[str], hreport: Any
    ) -> bool:
        """Run the notified handlers in handler-file order, then clear those that succeeded
        from the host's owed handlers; False when one failed (it stays owed)."""
        names = [n for n in hp.handler_order if n in notified]
        if not names:
            return True
        keys = {n: owed.key(hp.handlers[n].role, n) for n in names}
        if not self.check and any(_has_baseline(hp.handlers[n]) for n in names):
            # The baselines recorded before this run's changes (an owed restart needs its own).
            raw = state.conn().run(owed.read_script(self._owed_dir))
            if raw.rc == 0:
                state.owed = owed.parse(raw.stdout)
        entries = state.owed or {}
        done: list[str] = []
        ok = True
        for name in names:
            handler, entry = hp.handlers[name], entries.get(keys[name])
            result = self._run_task(
                state,
                handler,
                None,
                True,
                forced=not _has_baseline(handler),
                baseline=entry.baseline if entry is not None else None,
            )
            earlier = state.owed_at_start.get(keys[name])
            if earlier is not None:
                result.owed_since = earlier.since
            hreport.tasks.append(result)
            self.events.task_done(result)
            if result.status == Status.FAILED:
                hreport.failed = True
                ok = False
                break
            done.append(keys[name])
        cleared = [k for k in done if k in entries]
        if cleared and not self.check:
            state.conn().run(owed.clear_script(cleared, self._owed_dir))
            for k in cleared:
                entries.pop(k, None)
                state.owed_at_start.pop(k, None)
        return ok

    def _run_task(
        self,
        state: HostState,
        task: PlannedTask,
        pre_read: CommandResult | None,
        after_change: bool,
        *,
        forced: bool = False,
        baseline: str | None = None,
        reads: PlayReads | None = None,
        ahead: list[int] | None = None,
        notifies: list[tuple[str, PlannedTask]] | None = None,
    ) -> TaskResult:
        """One task on one host. After a write, ``reads`` (the play's) holds only the reads
        taken with the proving read: those of the tasks at ``ahead``."""
        self.events.task_started(state.name, task)
        started = time.monotonic()
        result = TaskResult(
            host=state.name,
            role=task.role,
            task=task.name,
            module=task.module.name,
            status=Status.OK,
            handler=task.handler,
            source=task.where,
            tags=task.tags,
        )
        module, args = task.module, task.args
        # Check mode predicts what the real run would report: a task whose module never reports
        # a change (a wait, an assertion, a changed_when: false command) predicts none.
        predicted = Status.CHANGED if module.reports_change else Status.OK
        read_session = ReadSession(state)
        try:
            raw = pre_read
            if raw is None or raw.rc != 0:
                # Batched reads drop stderr; read again alone to have the error to report.
                raw = read_session.run(module.read_script(args))
            obs, read_error = _try_observe(task, raw, baseline=baseline)
            if obs is None and not (self.check and after_change):
                # A read can fail for a moment (systemd busy right after a daemon-reload):
                # reading has no side effects, so read again, a bounded number of times.
                for _ in range(READ_ATTEMPTS - 1):
                    time.sleep(READ_RETRY_DELAY_S)
                    raw = read_session.run(module.read_script(args))
                    obs, read_error = _try_observe(task, raw, baseline=baseline)
                    if obs is not None:
                        break
            if obs is None or raw.rc != 0:
                if self.check and after_change:
                    result.status, result.predicted = predicted, module.reports_change
                    result.error = None
                    return self._finish(result, started)
                raise CommandFailed(raw) if read_error is None else ValueError(read_error)
            if obs.in_desired_state and not forced:
                if module.judged_by_read:
                    result.note = module.note(args, obs)
                return self._finish(result, started)
            if module.judged_by_read:
                # An assertion: no write side. Its read is the verdict, unless check mode could
                # not make the change an earlier task predicted (then it can only predict).
                if self.check and after_change:
                    result.predicted = True
                    return self._finish(result, started)
                result.status = Status.FAILED
                result.error = mask_text(module.explain(args, read_session, obs))
                return self._finish(result, started)
            refusal = self._ha_refusal(state, task, obs, notifies or [])
            if refusal is not None:
                result.status, result.error = Status.FAILED, mask_text(refusal)
                return self._finish(result, started)
            if module.reports_change:
                result.differences = self._masked_differences(task, obs)
                if self.diff:
                    result.content_diff = self._masked_content(
                        task, module.content_diff(args, read_session, obs)
                    )
            if self.check:
                result.status, result.predicted = predicted, module.reports_change
                return self._finish(result, started)
            result.wrote = True
            if reads is not None:
                reads.clear()  # whatever the write does, the reads taken before it are outdated
            self._write(state, task, obs, reads, ahead or [], notifies or [])
            result.status = predicted
        except HostUnreachable:
            raise
        except CommandFailed as exc:
            result.status = Status.FAILED
            result.error = mask_text(_describe_failure(exc))
        except Exception as exc:  # a module bug or bad state must fail this host, not the run
            result.status = Status.FAILED
            result.error = mask_text(f"{type(exc).__name__}: {exc}")
        return self._finish(result, started)

    # ---- the HA invariant ----------------------------------------------------------------
    def _ha_refusal(
        self,
        state: HostState,
        task: PlannedTask,
        obs: Observation,
        notifies: list[tuple[str, PlannedTask]],
    ) -> str | None:
        """Why this write must not happen now: it would take down (or its notified handler
        would then take down) a service whose HA peers do not all serve; None when it may."""
        if self.allow_ha_degraded:
            return None
        outages: list[tuple[str, PlannedTask]] = []
        if task.ha_peers:
            what = task.module.takes_down(task.args, obs)
            if what is not None:
                outages.append((what, task))
        guarded = [(n, h) for n, h in notifies if h.ha_peers]
        if guarded:
            # What each such handler would do if it ran now (its baseline would be now).
            reads = batch_read(state.conn(), [h for _, h in guarded])
            for (name, handler), raw in zip(guarded, reads, strict=True):
                hobs, _ = _try_observe(handler, raw) if raw is not None else (None, None)
                what = (
                    handler.module.takes_down(handler.args, hobs)
                    if hobs is not None
                    else f"handler {name!r} (its state could not be read)"
                )
                if what is not None:
                    outages.append((f"{what}, by handler {name!r}", handler))
        if not outages:
            return None
        peers = dict(p for _, t in outages for p in t.ha_peers)
        unready = self._unready_peers(state, peers)
        if len(unready) < len(peers):
            return None  # another replica serves: this one may go down for a moment
        names = ", ".join(sorted(unready))
        why = "; ".join(f"{peer} ({peers[peer]}: {reason})" for peer, reason in unready.items())
        what = " and ".join(w for w, _ in outages)
        return (
            f"refused on {state.name}: this would mean the {what}, while no other replica "
            f"serves: {why}. Taking {state.name} down now would leave none of {state.name}, "
            f"{names} serving; nothing was changed on {state.name}. Bring {names} back first, "
            "or run again with --allow-ha-degraded."
        )

    def _unready_peers(self, state: HostState, peers: dict[str, str]) -> dict[str, str]:
        """Peers whose readiness URL does not answer 2xx (probed from this host), and why."""
        lines = [_readiness_probe(peer, url) for peer, url in peers.items()]
        result = state.conn().run("\n".join(lines))
        answers = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                answers[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "000")
        unready: dict[str, str] = {}
        for peer in peers:
            rc, code = answers.get(peer, ("?", "000"))
            if code.isdigit() and 200 <= int(code) < 300:
                continue
            if code not in ("", "000"):
                unready[peer] = f"HTTP {code}"
            else:
                unready[peer] = _CURL_ERRORS.get(rc, f"no answer (curl exit {rc})")
        return unready

    # ---- the write side ------------------------------------------------------------------
    def _write(
        self,
        state: HostState,
        task: PlannedTask,
        obs: Observation,
        reads: PlayReads | None,
        ahead: list[int],
        notifies: list[tuple[str, PlannedTask]],
    ) -> None:
        """Write, then read again to prove it; that read also reads the tasks at ``ahead`` (the
        next ones, whose reads the write outdated) into ``reads``. The handlers the task
        notifies are recorded as owed on the host before the write changes anything."""
        assert not self.check, "the write side must never run in check mode"
        module, args = task.module, task.args
        lookahead = [reads.tasks[i] for i in ahead] if reads is not None else []
        record = None
        owed_now = set(state.owed or {})
        # Handlers already owed need no new record, unless their baseline must be taken again
        # (a restart owed since an earlier change: the unit may have been restarted since).
        entries = [
            (h.role, n, task.name, h.module.baseline_script(h.args))
            for n, h in notifies
            if owed.key(h.role, n) not in owed_now or _has_baseline(h)
        ]
        if entries and module.reports_change:
            record = owed.before_write(owed.record_script(entries, self._owed_dir), self._owed_dir)
        session = WriteSession(
            state, [task, *lookahead] if module.write_then_read else None, first=record
        )
        try:
            module.write(session, args, obs)
            if record is not None and not session.first_ran:
                # A write that ran no command of its own: the record still goes out before
                # the task is reported changed (and its handlers notified).
                run_checked(session, "true")
        except Exception:
            if session.first_ran:
                new = [owed.key(r, n) for r, n, _, _ in entries if owed.key(r, n) not in owed_now]
                self._withdraw_if_unchanged(state, task, obs, new)
            raise
        if record is not None and state.owed is not None:
            for role, name, by, _ in entries:
                state.owed[owed.key(role, name)] = owed.OwedHandler(role, name, "", by, None)
        after, error = None, None
        for attempt in range(READ_ATTEMPTS):
            if attempt:
                time.sleep(READ_RETRY_DELAY_S)
            raw: CommandResult | None = None
            if attempt == 0 and (session.reads is not None or lookahead):
                reads_now = session.reads
                if reads_now is None:
                    reads_now = batch_read(state.conn(), [task, *lookahead])
                verify, *after = reads_now
                if reads is not None:
                    reads.replace(ahead, after)
                raw = verify if verify is not None and verify.rc == 0 else None
            if raw is None:
                raw = state.conn().run(module.read_script(args))
            after, error = _try_observe(task, raw, before=obs)
            if after is not None:
                break
        if after is None:
            raise CommandFailed(raw) if error is None else ValueError(error)
        if not after.in_desired_state:
            still = ", ".join(
                f"{k}: {_show(task, k, v[0])} (want {_show(task, k, v[1])})"
                for k, v in self._masked_differences(task, after).items()
            )
            message = f"state still differs after apply: {still}"
            try:
                found = module.diagnose(args, ReadSession(state))
            except HostUnreachable:
                raise
            except Exception:  # the diagnosis is a courtesy; the failure stands without it
                found = None
            if found:
                message += f"\n{found}"
            raise CommandFailed(CommandResult("", 1, "", message))

    def _withdraw_if_unchanged(
        self, state: HostState, task: PlannedTask, obs: Observation, keys: list[str]
    ) -> None:
        """After a failed write: when the task's state is still what it was before, the handlers
        this write newly recorded as owed are not owed after all (nothing changed)."""
        if not keys or not task.module.state_tells_writes(task.args):
            return
        try:
            raw = state.conn().run(task.module.read_script(task.args))
            after, _ = _try_observe(task, raw)
            if after is not None and after.actual == obs.actual:
                state.conn().run(owed.clear_script(keys, self._owed_dir))
                return
        except HostUnreachable:
            raise
        except Exception:  # keep the record: a handler run once too often is the safe side
            return

    def _masked_differences(self, task: PlannedTask, obs: Observation) -> dict[str, Any]:
        return {
            k: [MASK, MASK] if k in task.secret_args else [before, after]
            for k, (before, after) in obs.differences.items()
        }

    def _masked_content(self, task: PlannedTask, diff: ContentDiff | None) -> ContentDiff | None:
        if diff is None:
            return None
        if task.secret_args:
            return ContentDiff(diff.path, MASK if diff.before is not None else None, MASK)
        return ContentDiff(
            diff.path,
            mask_text(diff.before) if diff.before is not None else None,
            mask_text(diff.after) if diff.after is not None else None,
        )

    @staticmethod
    def _finish(result: TaskResult, started: float) -> TaskResult:
        result.duration_s = time.monotonic() - started
        return result


def _try_observe(
    task: PlannedTask,
    raw: CommandResult,
    *,
    before: Observation | None = None,
    baseline: str | None = None,
) -> tuple[Observation | None, str | None]:
    """The observation from a read, or None and why not (a failed read or unparsable output)."""
    if raw.rc != 0:
        return None, None
    try:
        return task.module.observe(task.args, raw, before=before, baseline=baseline), None
    except (ValueError, KeyError) as exc:
        return None, f"cannot read state: {exc}"


def _has_baseline(task: PlannedTask) -> bool:
    """Whether a handler's module judges an owed action by its state (a restart since)."""
    return task.module.baseline_script(task.args) is not None


def _readiness_probe(peer: str, url: str) -> str:
    """Shell printing ``peer curl-exit http-code`` for ``url``. While the tier's TLS is switched on
    or off (gpumon_tls), a peer not yet converged still speaks the other scheme: when ``url`` does
    not answer 2xx, the same address is tried with the other scheme, so the pair's invariant is
    judged by whether the peer serves, not by which scheme it serves today."""
    scheme, sep, rest = url.partition("://")
    other = f"{'http' if scheme == 'https' else 'https'}{sep}{rest}" if sep else ""

    def curl(u: str) -> str:
        return (
            f"curl -s -o /dev/null --max-time 5 {tls_client_opts(u)}"
            f"-w '%{{http_code}}' -- {q(u)} 2>/dev/null"
        )

    line = f"hc=$({curl(url)}); rc=$?; "
    if other:
        line += (
            f'case "$hc" in 2??) ;; *) hc2=$({curl(other)}) && '
            f'case "$hc2" in 2??) hc=$hc2; rc=0 ;; esac ;; esac; '
        )
    return line + f'printf \'%s %s %s\\n\' {q(peer)} "$rc" "$hc"'


# curl's exit statuses a readiness probe meets (curl(1), EXIT CODES).
_CURL_ERRORS = {
    "6": "cannot resolve the host",
    "7": "connection refused or host unreachable",
    "28": "timed out",
    "35": "TLS handshake failed",
    "52": "empty reply",
    "56": "connection reset",
}


def _show(task: PlannedTask, key: str, value: Any) -> str:
    return MASK if key in task.secret_args else repr(value)


def _describe_failure(exc: CommandFailed) -> str:
    r = exc.result
    text = (r.stderr.strip() or r.stdout.strip()).splitlines()
    if not r.command:
        # A message a module or the engine composed (a unit's journal lines, say): all of it.
        return "\n".join(text[-FAILURE_LINES:])
    return f"rc={r.rc}: " + "\n".join(text[-5:])
