"""One invocation's work: load and validate everything once, then converge (every command builds
one ``DeploySession``).

Loading (inventory, site, roles, the full per-host plan) happens before any connection, so bad
input fails with exit 2 and nothing touched. What was loaded serves the whole command:
``converge_hosts`` converges any set of hosts and plays with a run's overrides (typed variables
above ``-e``) on it -- a rolling upgrade's batches are calls of it, as Ansible's
``restrict_to_hosts(batch)`` around one executor -- with facts read again for those hosts and
the same kept connections (``pool``; ``open_connection`` opens one more, for a drain host).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer import inventory as inv
from deployer import memory, owed
from deployer.connection import CommandResult, ConnectionPool, SSHConnection, SSHTarget
from deployer.errors import FactsUnread, HostUnreachable, InputError
from deployer.executor import DEFAULT_FORKS, Events, Executor, NoEvents
from deployer.facts import FACTS_SCRIPT, HostFacts, gather, parse_facts, unfinished
from deployer.gpu import driver_record, gpu_plan, preflight, rules
from deployer.hostpattern import NoHostsMatched, select, split_patterns
from deployer.hostsession import Prefetched, first_read_scripts, run_then_read
from deployer.inventory.model import LayeredVars
from deployer.plan import EMPTY, HostPlan, Planner
from deployer.report import ConsoleReporter, write_json
from deployer.results import RunReport
from deployer.roles import (  # noqa: F401  (the session's defaults, read from here too)
    DEFAULT_ROLES,
    DEFAULT_SITE,
    PRODUCT_ROOT,
    SHARED_TEMPLATES,
    Play,
    load_site,
)
from deployer.spans import span
from deployer.tls import continuity, material

# The rule of a refusal for a host trusting a CA its controller directory does not hold.
TLS_DIR_UNKNOWN = "tls-dir-unknown"

# Where a loaded inventory's warnings are said (a group_vars/ file that names no group, a host
# that is also a group, an SSH alias the monitoring tier does not read): every command of the CLI
# says them on stderr (deployer/cli.py); a caller that sets nothing reads ``inventory.warnings``.
INVENTORY_WARNINGS: ContextVar[Callable[[str], None] | None] = ContextVar(
    "inventory_warnings", default=None
)


@dataclass
class RunOptions:
    inventory: Path
    limit: str | None = None
    extra_vars: list[str] = field(default_factory=list)
    tags: frozenset[str] = frozenset()
    skip_tags: frozenset[str] = frozenset()
    site: Path | None = None
    roles_path: list[Path] = field(default_factory=list)


def ssh_target(spec: Any) -> SSHTarget:
    """The connection layer's view of an inventory host's connection variables."""
    return SSHTarget(
        name=spec.name,
        address=spec.address,
        port=spec.port,
        user=spec.user,
        private_key_file=spec.private_key_file,
        become=spec.become,
        become_user=spec.become_user or "root",
        known_hosts_file=spec.known_hosts_file,
        host_key_policy=spec.host_key_policy,
    )


def gather_with_reads(
    conn: Any, scripts: list[str]
) -> tuple[HostFacts, list[CommandResult | None]]:
    """The host's facts and the results of read-only ``scripts``, in one round trip."""
    result, out = run_then_read(conn, FACTS_SCRIPT, scripts)
    if unfinished(result) is not None:  # read again alone; the reads after it are not trusted
        return gather(conn), [None] * len(scripts)
    return parse_facts(conn.name, result), out


def play_hosts(inventory: inv.Inventory, play: Play) -> list[str]:
    """The inventory hosts a play applies to (none when its pattern matches no host)."""
    try:
        return [h.name for h in select(inventory, play.hosts, play=True)]
    except NoHostsMatched:
        return []  # a site play for a group this inventory lacks applies to no host
    except InputError as exc:
        raise InputError(exc.message, source=play.source, line=play.line, key="hosts") from exc


def role_hosts(inventory: inv.Inventory, plays: Sequence[Play], role: str) -> dict[str, Play]:
    """Every host of every play with ``role``, and the first such play that has it (the
    prometheus role runs in two plays: the shard replicas' and the global pair's)."""
    out: dict[str, Play] = {}
    for play in plays:
        if role in play.roles:
            for h in play_hosts(inventory, play):
                out.setdefault(h, play)
    return out


def role_variables(
    inventory: inv.Inventory, plays: Sequence[Play], planner: Planner, role: str
) -> dict[str, Mapping[str, Any]]:
    """Each host of ``role_hosts``, as its play sees its variables (before any connection:
    stand-in facts). Empty when no play has the role."""
    return {
        h: planner.host_vars(h, play, {"facts": validation_facts(h).to_json()})
        for h, play in role_hosts(inventory, plays, role).items()
    }


def validation_facts(host: str) -> HostFacts:
    """Stand-in facts for checking templates before any connection; the plan that runs is built
    again from the host's real facts."""
    return HostFacts(host=host, os_id="debian", os_family="debian", os_version="12", arch="x86_64")


class DeploySession:
    """One command's inventory, site, roles and compiled templates (loaded once), its hosts'
    plans and facts, and the connections it keeps open (``pool``)."""

    def __init__(
        self,
        options: RunOptions,
        inventory: Any,
        hosts: list[str],
        plays: Callable[[Play], bool] | None = None,
    ) -> None:
        self.options = options
        self.inventory = inventory
        self.hosts = hosts
        # The site's plays (loaded once, with the roles, by the first plan) and those this
        # command runs (``load(plays=...)``; all of them by default).
        self.site_plays: tuple[Play, ...] = ()
        self.plays: tuple[Play, ...] = ()
        self._play_filter = plays
        self.plans: list[HostPlan] = []
        self.planner: Planner | None = None
        self.pool = ConnectionPool(self.open_connection)
        self.facts: dict[str, HostFacts] = {}
        # Hosts' first batched reads, taken with their facts (gather_facts), for the executor.
        self.prefetched: dict[str, Prefetched] = {}
        # Where the hosts keep their owed handlers: the one directory both the first reads sent
        # with the facts and every executor of this session read and write (were they to
        # differ, the executor would find the prefetched read not its own and read again).
        self.owed_dir: str = owed.OWED_DIR
        # what upgrade-driver recorded on each GPU host (read with the facts; None: nothing)
        self.driver_records: dict[str, driver_record.DriverRecord | None] = {}
        self.unreachable: dict[str, str] = {}
        # Hosts that answered but whose facts script did not finish (sudo refused it, say), with
        # why: planned with stand-in facts, never converged, reported failed (facts.FactsUnread).
        self.unread: dict[str, str] = {}
        # GPU hosts ``preflight(offline=True)`` could not judge (no gpu_model, no facts)
        self.not_judged: list[str] = []
        # Hosts of one rollout batch plan in parallel threads: one at a time through the planner.
        self._planning = threading.Lock()
        self._gpu_roles: tuple[str, ...] | None = None

    @classmethod
    def load(
        cls,
        options: RunOptions,
        *,
        plan: bool = True,
        plays: Callable[[Play], bool] | None = None,
    ) -> DeploySession:
        """The inventory loaded and the ``--limit`` hosts selected; with ``plan`` every selected
        host planned (templates checked) for the site's plays ``plays`` selects."""
        extra = inv.parse_extra_vars(options.extra_vars)
        with span("load"):
            # The inventory lives as long as the run: the cyclic GC need not scan it again and
            # again while every host's variables are built (see bench/README.md, "Planning").
            inventory = inv.load_inventory(options.inventory, extra_vars=extra, keep=True)
        say = INVENTORY_WARNINGS.get()
        if say is not None:
            for text in inventory.warnings:
                say(text)
        hosts = [h.name for h in select(inventory, options.limit)]
        session = cls(options, inventory, hosts, plays)
        if plan:
            session.build_plan()
            if plays is None:
                session.require_play_hosts()
        return session

    def require_play_hosts(self) -> None:
        """Refuse a run in which no selected host is in any play of the site (it would do
        nothing and say nothing), naming the site's groups and the inventory's."""
        selected = set(self.hosts)
        if any(h in selected for p in self.plays for h in self.play_hosts(p)):
            return
        wanted = sorted(
            {
                part.lstrip("!&")
                for p in self.plays
                for part in split_patterns(p.hosts)
                if not part.startswith(("!", "&"))
            }
        )
        have = sorted(g for g in self.inventory.groups if g not in ("all", "ungrouped"))
        raise InputError(
            "no selected host is in a group the site's plays apply to: nothing to do. "
            f"The site's groups: {', '.join(wanted)}; the inventory's: {', '.join(have) or 'none'}. "
            "Map them, e.g. gpumon_groups: {gpu: [your_gpu_group]} in group_vars/all, "
            "or --group gpu=your_gpu_group for one run",
            source=str(self.options.inventory),
            key="gpumon_groups",
        )

    def open_connection(self, host: str) -> SSHConnection:
        """A new connection to an inventory host (the pool keeps one per host; a drain host
        that is not converged gets its own)."""
        with span("connect", host):
            return SSHConnection(ssh_target(self.inventory.connection(host)))

    def load_content(self) -> Planner:
        """The site, its roles and their templates, loaded and checked once per session."""
        if self.planner is None:
            with span("load"):
                return self._load_content()
        return self.planner

    def _load_content(self) -> Planner:
        if self.planner is None:
            site = self.options.site or DEFAULT_SITE
            self.site_plays = load_site(site)
            wanted = self._play_filter or (lambda play: True)
            self.plays = tuple(p for p in self.site_plays if wanted(p))
            roles_path = [*self.options.roles_path, DEFAULT_ROLES]
            if self.options.site is not None:
                roles_path.insert(len(self.options.roles_path), self.options.site.parent / "roles")
            planner = Planner(
                self.inventory,
                roles_path,
                SHARED_TEMPLATES,
                tags=self.options.tags,
                skip_tags=self.options.skip_tags,
            )
            planner.load_roles(self.site_plays)
            self.planner = planner
        return self.planner

    def play_hosts(self, play: Play) -> list[str]:
        """The inventory hosts a play applies to (none when its pattern matches no host)."""
        return play_hosts(self.inventory, play)

    def role_variables(self, role: str) -> dict[str, Mapping[str, Any]]:
        """``role_variables`` of the session's site (its roles and templates loaded)."""
        planner = self.load_content()
        return role_variables(self.inventory, self.site_plays, planner, role)

    def build_plan(self, facts: dict[str, HostFacts] | None = None) -> None:
        """Plan every selected host. Without facts (before connecting) each host gets stand-in
        facts, so templates and conditions that use them are still checked for undefined names."""
        self.load_content()
        self.plans = self.plan_hosts(self.hosts, self.plays, facts)

    def plan_hosts(
        self,
        hosts: Sequence[str],
        plays: Sequence[Play],
        facts: Mapping[str, HostFacts] | None = None,
        overrides: Mapping[str, Any] = EMPTY,
    ) -> list[HostPlan]:
        """The plans of ``hosts`` for those of ``plays`` that apply to them (the site, roles and
        compiled templates loaded once serve every call)."""
        with span("plan", hosts[0] if len(hosts) == 1 else ""):
            return self._plan_hosts(hosts, plays, facts, overrides)

    def _plan_hosts(
        self,
        hosts: Sequence[str],
        plays: Sequence[Play],
        facts: Mapping[str, HostFacts] | None,
        overrides: Mapping[str, Any],
    ) -> list[HostPlan]:
        planner = self.load_content()
        wanted = set(hosts)
        per_host: dict[str, list[Play]] = {h: [] for h in hosts}
        for play in plays:
            for h in self.play_hosts(play):
                if h in wanted:
                    per_host[h].append(play)
        gpu = set(preflight.gpu_hosts(self.inventory, list(hosts)))
        # The GPUs of every GPU host whose facts this session read, as the plan counts them
        # (gpu_names: nvidia-smi, else the PCI bus): the replicas' remote_write sizing reads it
        # for a host that declares no gpu_count (monitoring/remote_write.py).
        counted = {
            h: len(f.gpu_names()[0]) for h, f in (facts or {}).items() if f and f.gpu_names()[0]
        }
        plans = []
        with self._planning:
            for h in hosts:
                if not per_host[h]:
                    continue
                found = (facts or {}).get(h)
                context: dict[str, Any] = {
                    "facts": (found or validation_facts(h)).to_json(),
                    "gpumon_gpu_counts": counted,
                }
                if h in gpu:
                    # The GPU roles read the resolved compatibility plan (deployer/gpu/gpu_plan.py),
                    # for the driver the host is to run (preflight.choose_driver).
                    context["gpu_plan"] = gpu_plan.template_plan(
                        h,
                        self.driver_choice(h, overrides).variables,
                        found,
                        self.driver_records.get(h),
                    )
                    # The roles' gpu_count: the inventory's, else what the facts counted (the
                    # preflight refused a declared count the facts contradict).
                    context["gpu_count"] = context["gpu_plan"]["gpu_count"]
                plans.append(planner.plan_host(h, per_host[h], context, overrides))
        return plans

    def gather_facts(
        self,
        hosts: list[str],
        forks: int = DEFAULT_FORKS,
        first_reads: Mapping[str, list[str]] = EMPTY,
    ) -> dict[str, HostFacts]:
        """Facts of ``hosts`` in parallel over the pooled connections; unreachable hosts noted.

        One round trip per host: the facts script, then (on GPU hosts) the upgrade record, then
        the host's ``first_reads`` (its first play's batched read, :meth:`first_reads`), kept in
        ``self.prefetched`` for the executor."""

        gpu = set(preflight.gpu_hosts(self.inventory, hosts))

        def one(host: str) -> tuple[str, HostFacts | None, str | None, str | None]:
            try:
                conn = self.pool.get(host)
                record = [driver_record.READ_COMMAND] if host in gpu else []
                reads = list(first_reads.get(host, ()))
                if not record and not reads:
                    found = gather(conn)
                else:
                    found, out = gather_with_reads(conn, record + reads)
                    if record:
                        got = out[0] or conn.run(driver_record.READ_COMMAND, timeout=60)
                        self.driver_records[host] = driver_record.parse(got.stdout)
                    if reads:
                        self.prefetched[host] = Prefetched(tuple(reads), tuple(out[len(record) :]))
                return host, found, None, None
            except HostUnreachable as exc:
                return host, None, str(exc), None
            except FactsUnread as exc:
                return host, None, None, str(exc)

        with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts) or 1))) as ex:
            for host, found, error, unread in ex.map(one, hosts):
                self.unreachable.pop(host, None)
                self.unread.pop(host, None)
                if found is not None:
                    self.facts[host] = found
                elif unread is not None:
                    self.unread[host] = unread
                else:
                    self.unreachable[host] = error or "unreachable"
        return self.facts

    def not_read(self) -> dict[str, str]:
        """Hosts without facts from this session's last read of them, with why: unreachable or
        their facts script unfinished (``unread``)."""
        return {**self.unreachable, **self.unread}

    def sizing_hosts(self) -> list[str]:
        """GPU hosts outside the selection whose GPUs a selected Prometheus replica sizes its
        remote_write for and whose inventory declares no gpu_count (their count is in facts)."""
        self.load_content()
        replicas = {
            h for p in self.plays if "prometheus" in p.roles for h in self.play_hosts(p)
        } & {p.host for p in self.plans}
        if not replicas:
            return []
        not_read = self.not_read()
        return [
            h
            for h in preflight.gpu_hosts(self.inventory, list(self.inventory.hosts))
            if h not in self.facts
            and h not in not_read
            and self.inventory.host(h).vars.get("gpu_count") is None
        ]

    def gather_sizing_facts(self, forks: int = DEFAULT_FORKS) -> None:
        """Facts (read-only) of ``sizing_hosts``, so a run limited to the replicas sizes their
        queues as a run over the whole inventory does. An unreachable one is noted, not failed
        (it is not converged by this run): its GPUs are then estimated (8)."""
        hosts = self.sizing_hosts()
        if not hosts:
            return
        self.gather_facts(hosts, forks)
        for h in hosts:
            why = self.unreachable.pop(h, None) or self.unread.pop(h, None)
            if why is not None:
                print(
                    f"NOTE {h}: its facts could not be read ({why}): the replicas' remote_write "
                    "is sized with 8 GPUs for it (declare gpu_count to size without facts)",
                    file=sys.stderr,
                )

    def driver_choice(
        self, host: str, overrides: Mapping[str, Any] = EMPTY
    ) -> preflight.DriverChoice:
        """The GPU host's variables with the driver it is to run, and where that comes from (a
        driver given with ``-e`` or by the run's ``overrides`` is an explicit wish)."""
        explicit = [
            k for k in driver_record.DRIVER_VARS if k in self.inventory.extra_vars or k in overrides
        ]
        return preflight.choose_driver(
            self.host_variables(host, overrides), self.driver_records.get(host), explicit=explicit
        )

    def driver_notes(self) -> dict[str, str]:
        """What the operator should know about the selected GPU hosts' drivers (host -> note)."""
        out = {}
        for h in preflight.gpu_hosts(self.inventory, self.hosts):
            note = self.driver_choice(h).note if self.driver_records.get(h) else None
            if note:
                out[h] = note
        return out

    def _gpu_role_hosts(self) -> set[str]:
        """Hosts whose plan runs a task of a GPU role (after --tags / --skip-tags)."""
        gpu = set(preflight.gpu_hosts(self.inventory, self.hosts))
        return {
            p.host
            for p in self.plans
            if p.host in gpu
            and any(t.role in preflight.GPU_ROLES for hp in p.plays for t in hp.tasks)
        }

    def preflight(
        self, *, offline: bool, forks: int = DEFAULT_FORKS, out_of_service: bool = False
    ) -> list[Any]:
        """Refusals (empty: all good): for every host whose facts were read, a CA of the tier
        its controller directory does not hold (:meth:`tls_refusals`); for the selected GPU
        hosts the compatibility matrix's and, with facts, a driver change on a host whose driver
        is loaded (``preflight`` module; ``out_of_service`` says the hosts run no GPU work and
        may change in place)."""
        gpu = preflight.gpu_hosts(self.inventory, self.hosts)
        if not offline:
            not_read = self.not_read()
            unread = [h for h in gpu if h not in self.facts and h not in not_read]
            if unread:
                self.gather_facts(unread, forks)
        tls = [] if offline else self.tls_refusals(forks)
        if not gpu:
            return tls
        # Every GPU host's variables and plan: alive together, all freed when the judging ends,
        # before the collector comes back (bench/README.md, "Planning").
        with memory.collector_paused():
            return tls + self._judge(gpu, offline=offline, out_of_service=out_of_service)

    def tls_refusals(self, forks: int = DEFAULT_FORKS) -> list[rules.Refusal]:
        """Hosts that trust a CA of the tier their controller's ``gpumon_tls_dir`` does not hold
        (``deployer/tls/continuity.py``): those read so far and, when a selected host's directory
        held none of the tier's credentials, every other host of that directory (their facts
        read too, read-only: a run limited to a new host would otherwise hand it a new CA, and
        the next full run every host). What this process created in such a directory is
        removed, so that the next run is refused as well."""
        variables: dict[str, Mapping[str, Any]] = {}  # each host's, read once for this check

        def tls_vars(host: str) -> Mapping[str, Any]:
            if host not in variables:
                variables[host] = self._tls_vars(host)
            return variables[host]

        def tls_dir(host: str) -> Path | None:
            v = tls_vars(host)
            return material.tls_dir(v) if material.enabled(v) else None

        fresh = {
            d
            for h in self.hosts
            if (d := tls_dir(h)) is not None and not material.held_credentials(d)
        }
        if fresh:
            not_read = self.not_read()
            others = [
                h
                for h in self.inventory.hosts
                if h not in self.facts and h not in not_read and tls_dir(h) in fresh
            ]
            if others:
                self.gather_facts(others, forks)
                for h in others:
                    why = self.unreachable.pop(h, None) or self.unread.pop(h, None)
                    if why is not None:
                        print(f"NOTE {h}: the CA it trusts could not be read ({why}); the "
                              "tier's TLS directory is judged on the other hosts",
                              file=sys.stderr)  # fmt: skip
        found = continuity.unknown_cas(
            {
                h: (tls_vars(h), f.tls_ca_pem)
                for h, f in self.facts.items()
                if f.tls_ca_pem is not None
            },
            lambda group: (
                group in self.inventory.groups and bool(self.inventory.group_hosts(group))
            ),
        )
        for d in {u.directory for u in found}:
            material.discard_created(d)
        return [rules.Refusal(u.host, TLS_DIR_UNKNOWN, u.message, u.fix) for u in found]

    def _tls_vars(self, host: str) -> Mapping[str, Any]:
        """The host's variables as the tier's TLS material reads them: a read-only view, or
        (when a TLS variable is a template) its rendered scope."""
        planner = self.load_content()
        v = planner.variables(host, ())
        if any("{{" in str(v.get(k, "")) for k in material.DIRECTORY_VARS):
            return planner.scope(host, ())
        return v

    def _judge(self, gpu: list[str], *, offline: bool, out_of_service: bool) -> list[Any]:
        choices = {h: self.driver_choice(h) for h in gpu}
        variables = {h: c.variables for h, c in choices.items()}
        # Without facts (--offline, or unreachable) a host that declares no model cannot be
        # judged: say so, judge the rest. One that declares a model but no count is judged on
        # the model: no rule of the matrix reads the count but gpu-count-facts, which compares
        # it with facts (deployer/gpu/rules.py).
        factless = [h for h in gpu if offline or h not in self.facts]
        self.not_judged = [h for h in factless if variables[h].get("gpu_model") in (None, "")]
        gpu = [h for h in gpu if h not in self.not_judged]
        for h in factless:
            if variables[h].get("gpu_count") is None:
                variables[h] = LayeredVars({"gpu_count": 1}, variables[h])
        plans = preflight.host_plans(
            self.inventory, gpu, variables, None if offline else self.facts
        )
        refused = preflight.refusals(plans)
        if not offline:
            refused += preflight.branch_downgrades(
                plans,
                self.facts,
                guarded=self._gpu_role_hosts(),
                refused={r.host for r in refused},
            )
        if not offline and not out_of_service:
            refused += preflight.live_driver_changes(
                plans,
                self.facts,
                {h: c.origin for h, c in choices.items()},
                guarded=self._gpu_role_hosts(),
                refused={r.host for r in refused},
            )
        return refused

    def gpu_roles(self) -> tuple[str, ...]:
        """The GPU roles the site applies, in site order: the scope of a GPU host's plan (every
        one of them reads ``gpu_plan``, so their defaults together feed it). Read once per
        session (the site is loaded once): every GPU host's variables ask for it."""
        if self._gpu_roles is None:
            self.load_content()
            found = [r for play in self.site_plays for r in play.roles if r in preflight.GPU_ROLES]
            self._gpu_roles = tuple(dict.fromkeys(found))
        return self._gpu_roles

    def host_variables(self, host: str, overrides: Mapping[str, Any] = EMPTY) -> Mapping[str, Any]:
        """A GPU host's variables in the scope of the GPU roles (``Planner.variables``: the one
        rule, the same a play's tasks see in the scope of the play's roles), read-only."""
        return self.load_content().variables(host, self.gpu_roles(), overrides)

    def converge(
        self,
        *,
        check: bool,
        diff: bool,
        forks: int = DEFAULT_FORKS,
        json_output: bool = False,
        out_of_service: bool = False,
        allow_ha_degraded: bool = False,
    ) -> RunReport:
        """``up``: the preflight (refused: nothing written), then every selected host converged,
        reported on the console (and as JSON)."""
        try:
            self.gather_facts([p.host for p in self.plans], forks, self.first_reads())
            self.gather_sizing_facts(forks)
            refused = self.preflight(offline=False, forks=forks, out_of_service=out_of_service)
            if refused:
                raise preflight.PreflightRefused(
                    "the run is refused:\n  " + "\n  ".join(str(r) for r in refused)
                )
            for host, note in self.driver_notes().items():
                print(f"NOTE {host}: {note}", file=sys.stderr)
            if self.facts:
                self.build_plan(self.facts)
            reporter = ConsoleReporter(diff=diff)
            executor = Executor(
                self.pool.get,
                check=check,
                diff=diff,
                forks=forks,
                events=reporter,
                allow_ha_degraded=allow_ha_degraded,
                prefetched=self.prefetched,
                owed_dir=self.owed_dir,
            )
            with reporter:
                report = executor.run(
                    self.plans, self.plays, unreachable=self.unreachable, unread=self.unread
                )
            reporter.recap(report)
            if json_output:
                write_json(report, sys.stdout)
            return report
        finally:
            self.pool.close_all()

    def first_reads(self) -> dict[str, list[str]]:
        """Each planned host's first batched read, as the executor will send it (owed handlers,
        then every read script of the host's first play), from the plan built before connecting:
        sent with the facts, and used by the executor only where the plan built with the facts
        reads exactly the same. Only for the run's first play, and not a serial one: its hosts'
        reads are taken before any host of the run changes anything, as they would be anyway."""
        if not self.plays or self.plays[0].serial:
            return {}
        first = self.plays[0]
        return {
            p.host: first_read_scripts(p.plays[0], self.owed_dir)[1]
            for p in self.plans
            if p.plays and p.plays[0].play is first
        }

    def converge_hosts(
        self,
        hosts: Sequence[str],
        plays: Sequence[Play],
        *,
        overrides: Mapping[str, Any] = EMPTY,
        events: Events | None = None,
        forks: int = DEFAULT_FORKS,
    ) -> RunReport:
        """Converge ``hosts`` with ``plays`` and the run's ``overrides`` on what this session
        loaded: their facts read again (a step before may have changed them), their plans made
        from those, run on the kept connections. No preflight: the caller judged the plan."""
        hosts = list(hosts)
        self.gather_facts(hosts, forks)
        not_read = self.not_read()
        reachable = [h for h in hosts if h not in not_read]
        plans = self.plan_hosts(reachable, plays, self.facts, overrides)
        # The rollout's next step (a reboot, validation) uses the same connection: kept open
        # (closing it cost each host two more SSH handshakes per upgrade).
        executor = Executor(
            self.pool.get,
            forks=forks,
            events=events or NoEvents(),
            owed_dir=self.owed_dir,
            keep_connections=True,
        )
        unreachable = {h: self.unreachable[h] for h in hosts if h in self.unreachable}
        unread = {h: self.unread[h] for h in hosts if h in self.unread}
        planned = {p.host for p in plans}
        # An unreachable or unread host is reported as such (a plan of no task stands in for it).
        plans += [HostPlan(h) for h in {**unreachable, **unread} if h not in planned]
        return executor.run(plans, tuple(plays), unreachable=unreachable, unread=unread)

    def inventory_view(self, host: str | None) -> dict[str, Any]:
        if host is not None and host not in self.inventory.hosts:
            raise InputError(f"no host {host!r} in the inventory", key="--host")
        data = self.inventory.to_dict(host=host, mask_secrets=True)
        json.dumps(data, default=str)
        return data
