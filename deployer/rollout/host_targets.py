"""What an ``upgrade-driver`` target means for every selected GPU host (the run's own preflight;
``up``'s is ``deployer.gpu.preflight``).

For each host: its facts (read-only), its inventory plan retargeted to the driver of ``--to``
(``VersionPlan.retarget``) and checked against the matrix with the host's GPUs from facts --
so crossing into CUDA 13 switches the DCGM package variant (``-cuda13``, or ``-cuda12`` for
Volta), and Fabric Manager follows the driver exactly -- and the versions before and after.
A host whose plan the matrix refuses (a V100 past R580, say) is reported with the rule and the
fix; the command then refuses the whole run (exit 2, nothing touched), and the user may ``--limit``
such hosts out. A host that already runs the target (installed == loaded == nvidia-smi, and
every DCGM/exporter/Fabric Manager version as planned) is up to date and is skipped. A host that
runs a newer release of the target's branch than a branch target (``--to 580``) resolves to is
refused (``downgrades``): the branch names the newest release the matrix knows, not a downgrade.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployer.errors import InputError, PlanRefused
from deployer.facts import HostFacts
from deployer.gpu import driver_record, rules, verify, version_plan
from deployer.gpu import preflight as gpu_preflight
from deployer.session import DeploySession

GPU_ROLES = ("nvidia_driver", "dcgm", "dcgm_exporter")
# Role variables the rollout reads, rendered for the host (they may be templates).
ROLE_KEYS = (
    "nvidia_driver_check",
    "nvidia_driver_reboot_timeout",
    "dcgm_exporter_verify_url",
    "dcgm_exporter_basic_auth_users",
    "dcgm_exporter_scrape_user",
    "dcgm_exporter_scrape_password",
)


@dataclass
class HostTarget:
    """One GPU host of the run, as preflight found it."""

    host: str
    address: str
    variables: dict[str, Any]
    facts: HostFacts
    resolved: rules.ResolvedPlan
    before: dict[str, Any]
    after: dict[str, Any]
    up_to_date: bool
    mismatches: list[str] = field(default_factory=list)  # why it is not up to date
    # the driver variables the inventory gives the host (recorded with the target: driver_record)
    inventory_driver: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return int(self.resolved.gpu_count)


@dataclass
class Preflight:
    target: version_plan.DriverTarget
    session: DeploySession
    hosts: dict[str, HostTarget]
    refusals: list[rules.Refusal]
    unreachable: dict[str, str]  # hosts without facts, with why (session.not_read)


def observed(f: HostFacts) -> verify.ObservedVersions:
    return verify.ObservedVersions(
        driver_installed=f.driver_installed,
        driver_loaded=f.driver_loaded,
        driver_smi=f.driver_smi,
        module_flavour=f.kernel_module_flavour,
        dcgm_version=f.dcgm_version,
        dcgm_packages=tuple(
            p for p in f.packages if p.startswith("datacenter-gpu-manager") and "exporter" not in p
        ),
        exporter_version=f.exporter_version,
        fabricmanager_version=f.fabricmanager_version,
        gpu_names=tuple(g.name for g in f.gpus),
    )


def versions_before(f: HostFacts) -> dict[str, Any]:
    return {
        "driver_installed": f.driver_installed,
        "driver_loaded": f.driver_loaded,
        "module_flavour": f.kernel_module_flavour,
        "dcgm_version": f.dcgm_version,
        "dcgm_package": f.dcgm_package,
        "exporter_version": f.exporter_version,
        "fabricmanager_version": f.fabricmanager_version,
        "packages": dict(sorted(f.packages.items())),
        "gpus": len(f.gpus),
        "gpu_uuids": [g.uuid for g in f.gpus],
    }


def versions_after(r: rules.ResolvedPlan) -> dict[str, Any]:
    return {
        "driver_version": r.driver_version,
        "driver_branch": r.driver_branch,
        "cuda_major": r.cuda_major,
        "module_flavour": r.module_flavour,
        "dcgm_version": r.dcgm_version,
        "dcgm_packages": list(r.dcgm_packages),
        "exporter_tag": r.exporter_tag,
        "fabricmanager_version": r.fabricmanager_version,
        "install": [p.apt for p in r.install],
        "remove": list(r.remove),
        "notes": list(r.notes),
    }


def rendered_vars(session: DeploySession, host: str, facts: HostFacts) -> dict[str, Any]:
    """The host's inventory variables plus ``ROLE_KEYS`` rendered as the GPU roles see them."""
    out = dict(session.host_variables(host))
    planner = session.planner
    if planner is None:
        return out
    scope = planner.scope(host, session.gpu_roles(), {"facts": facts.to_json()})
    for key in ROLE_KEYS:
        if key in scope:
            out[key] = scope[key]
    return out


def select_gpu_hosts(session: DeploySession) -> None:
    """Narrow the session to the selected GPU hosts (the run's hosts), every one of them planned
    before any connection (templates checked). None selected is an input error."""
    gpu = gpu_preflight.gpu_hosts(session.inventory, session.hosts)
    if not gpu:
        limit = session.options.limit
        raise InputError(
            "no GPU host selected: upgrade-driver works on the hosts of the inventory group "
            f"'{gpu_preflight.GPU_GROUP}'" + (f" matching --limit {limit}" if limit else ""),
            key="--limit" if limit else "-i",
        )
    session.hosts = gpu
    session.build_plan()


def run_preflight(session: DeploySession, to: str) -> Preflight:
    """The target ``to`` for every GPU host the session selects: their facts read, each one's
    inventory plan retargeted (``HostPlan.retarget``, so that what the inventory says is still
    known) and checked against the matrix."""
    target = version_plan.resolve_target(to)
    select_gpu_hosts(session)
    session.gather_facts(list(session.hosts))
    hosts: dict[str, HostTarget] = {}
    plans = []
    not_read = session.not_read()
    for h in session.hosts:
        if h in not_read:
            continue
        f = session.facts[h]
        variables = session.host_variables(h)
        names = f.gpu_names()[0] or None
        plan = version_plan.plan_from_vars(h, variables, gpu_names=names).retarget(target)
        plans.append(plan)
    refusals = session.tls_refusals() + rules.check(plans)
    refused = {r.host for r in refusals}
    for plan in plans:
        h = plan.host
        if h in refused:
            continue
        try:
            resolved = rules.resolve(plan)
        except PlanRefused as exc:  # check() above agrees; kept for a clear message
            refusals.append(rules.Refusal(h, "refused", str(exc), "see compat check"))
            continue
        f = session.facts[h]
        mismatches = [str(m) for m in verify.verify(resolved, observed(f))]
        hosts[h] = HostTarget(
            host=h,
            address=str(session.inventory.connection(h).address),
            variables=rendered_vars(session, h, f),
            facts=f,
            resolved=resolved,
            before=versions_before(f),
            after=versions_after(resolved),
            up_to_date=not mismatches and f.driver_loaded == resolved.driver_version,
            mismatches=mismatches,
            inventory_driver=driver_record.inventory_driver(session.host_variables(h)),
        )
    refusals += downgrades(target, hosts)
    return Preflight(target, session, hosts, refusals, not_read)


def newer_than_target(target: version_plan.DriverTarget, t: HostTarget) -> str | None:
    """The host's driver (installed, else loaded) when it is a newer release of the target's
    branch than the target: moving it there is a downgrade (``version_plan.passed``)."""
    return version_plan.passed(target.version, t.facts.driver_installed, t.facts.driver_loaded)


def downgrades(
    target: version_plan.DriverTarget, hosts: dict[str, HostTarget]
) -> list[rules.Refusal]:
    """Hosts a branch target (``--to 580``) would downgrade: the branch means the newest release
    of it the matrix knows, and NVIDIA ships newer ones than the matrix lists (the real captures
    show 580.159.04 where the matrix's newest R580 is older), so a host already past it would be
    moved back, rebooted and all. Refused, naming its release; a full version (``--to
    580.126.20``) is an explicit wish and is only said (``NOTE``)."""
    if not target.by_branch:
        return []
    out = []
    for h, t in hosts.items():
        running = newer_than_target(target, t)
        if running is not None:
            out.append(
                rules.Refusal(
                    h,
                    gpu_preflight.DOWNGRADE_RULE,
                    f"runs driver {running}, newer than {target.version}, the newest "
                    f"R{target.branch} release the matrix knows: --to {target.requested} would "
                    "downgrade it",
                    f"give the release the hosts are to run (--to {running} or newer: one the "
                    "matrix does not list is checked against the hosts' package sources), or "
                    "leave it out with --limit",
                )
            )
    return out
