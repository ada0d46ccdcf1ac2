"""Preflight: every selected GPU host's version plan checked before anything is written.

Runs before anything is written: ``check`` runs only this; ``up`` runs it first and refuses the
whole run (exit 2) when any host's plan is refused. Three kinds of refusal:

- the compatibility matrix refuses a host's plan (``refusals``);
- **a branch never steps a host back** (``branch_downgrades``): a plan by branch (or the default
  branch) resolves to the newest release of it the matrix knows, and a host already running a
  newer release of that branch is refused, ``--out-of-service`` or not;
- **``up`` never changes a loaded driver** (``live_driver_changes``): a host whose NVIDIA kernel
  module is loaded (facts, read-only) and whose plan names another driver is refused, naming the
  loaded and the planned version and ``upgrade-driver`` -- the only way a live host's driver
  changes (drain, silences, canary, reboot, validation). Installing packages under a loaded
  module leaves ``Failed to initialize NVML: Driver/library version mismatch`` until a reboot, and
  breaks every CUDA job on the host (../shared/reference/nvidia-driver.md, "Mismatch detection",
  [S20][S24][S27], verified; a capture: gpu_reality_fixtures/driver-misc/nvidia-smi-mismatch.txt). ``--out-of-service`` says the selected hosts run no GPU work,
  and lifts it. A host with no driver loaded (a first install, or packages waiting for a reboot)
  is a plain ``up``.

Which driver a host is planned to run (``choose_driver``): ``-e nvidia_driver_version`` /
``nvidia_driver_branch`` when given (an explicit wish); else the driver a completed
``upgrade-driver`` run recorded on the host (``deployer.gpu.driver_record``) while the inventory
still says what it said when that run started; else the inventory's.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from deployer.errors import PlanRefused
from deployer.facts import HostFacts
from deployer.gpu import rules, version_plan
from deployer.gpu.driver_record import DRIVER_VARS, DriverRecord

GPU_GROUP = "gpu"
# Roles whose tasks follow the host's planned driver (gpu_plan): a run with none of their tasks
# for a host (--tags, --skip-tags) changes nothing of its driver.
GPU_ROLES = ("nvidia_driver", "dcgm", "dcgm_exporter")
LIVE_DRIVER_RULE = "live-driver-change"


class PreflightRefused(PlanRefused):
    """Refusals found once the hosts' facts were read (read-only): nothing was written."""

    hosts_read = True


def gpu_hosts(inventory: Any, hosts: list[str]) -> list[str]:
    members = set(inventory.group_hosts(GPU_GROUP)) if GPU_GROUP in inventory.groups else set()
    return [h for h in hosts if h in members]


@dataclass(frozen=True)
class DriverChoice:
    """The driver variables a GPU host is planned with, where they come from, and a note for the
    operator (``None`` when there is nothing to say)."""

    variables: Mapping[str, Any]  # read-only (a view over the inventory's layers)
    origin: str
    note: str | None = None


def _said(inventory: Mapping[str, str | None]) -> str:
    if inventory.get("version"):
        return f"nvidia_driver_version {inventory['version']}"
    if inventory.get("branch"):
        return f"nvidia_driver_branch {inventory['branch']}"
    return "no driver version (the matrix's default branch)"


def choose_driver(
    variables: Mapping[str, Any], record: DriverRecord | None, *, explicit: Collection[str] = ()
) -> DriverChoice:
    """The host's variables with the driver it is planned to run (see the module docstring);
    ``explicit`` names the driver variables given with ``-e``."""
    if explicit:
        return DriverChoice(variables, "-e " + ", ".join(k for k in DRIVER_VARS if k in explicit))
    if record is None:
        return DriverChoice(variables, "the inventory")
    if record.describes(variables):
        return DriverChoice(
            ChainMap(record.variables(), variables),  # type: ignore[arg-type]
            f"upgrade-driver run {record.run_id}",
            f"keeps driver {record.version} from upgrade-driver run {record.run_id}; the "
            f"inventory still says {_said(record.inventory)}: set nvidia_driver_version: "
            f"{record.version} to say what the host runs",
        )
    return DriverChoice(
        variables,
        f"the inventory, changed since upgrade-driver run {record.run_id} left {record.version}",
    )


def host_plans(
    inventory: Any,
    hosts: list[str],
    variables: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, HostFacts] | None,
) -> list[version_plan.VersionPlan]:
    """Plans from resolved variables; with facts, the GPUs seen on the host (nvidia-smi's names,
    else their PCI ids) decide the model and the count, and a declared one must agree."""
    entries = []
    for host in gpu_hosts(inventory, hosts):
        names = None
        if facts is not None and host in facts:
            names = facts[host].gpu_names()[0] or None
        entries.append((host, variables[host], names))
    return version_plan.plans_from_vars(entries)


def refusals(plans: list[version_plan.VersionPlan]) -> list[rules.Refusal]:
    return rules.check(plans)


DOWNGRADE_RULE = "driver-downgrade"


def branch_downgrades(
    plans: Iterable[version_plan.VersionPlan],
    facts: Mapping[str, HostFacts],
    *,
    guarded: Iterable[str],
    refused: Iterable[str] = (),
) -> list[rules.Refusal]:
    """Hosts of ``guarded`` whose plan names no exact driver (``nvidia_driver_branch``, or the
    matrix's default branch) and whose driver (installed, else loaded) is a newer release of
    that branch than the newest the matrix knows, which the plan resolves to: NVIDIA ships
    releases faster than the matrix is edited (the real captures show R580's 580.159.04 past
    the matrix's newest), and the branch means "its newest release", never a step back. Refused
    with or without ``--out-of-service``: the install would downgrade the host. Newer packages
    under the planned module (loaded) are a repair, not refused (``version_plan.passed``)."""
    watch = set(guarded) - set(refused)
    out = []
    for plan in plans:
        f = facts.get(plan.host)
        if plan.host not in watch or f is None or plan.driver_version:
            continue
        try:
            planned = rules.resolve(plan).driver_version
        except PlanRefused:
            continue  # the matrix refusal names it
        running = version_plan.passed(planned, f.driver_installed, f.driver_loaded)
        if running is None:
            continue
        said = (
            f"nvidia_driver_branch {plan.driver_branch}"
            if plan.driver_branch
            else "the default branch (no nvidia_driver_version or nvidia_driver_branch)"
        )
        out.append(
            rules.Refusal(
                host=plan.host,
                rule=DOWNGRADE_RULE,
                message=(
                    f"runs driver {running}, newer than {planned}, which {said} resolves to (the "
                    f"newest R{planned.split('.')[0]} release the matrix knows): the install "
                    "would downgrade it"
                ),
                fix=(
                    f"keep it with nvidia_driver_version: {running} for the host (or its "
                    "group), or set the release the hosts are to run"
                ),
            )
        )
    return out


def live_driver_changes(
    plans: Iterable[version_plan.VersionPlan],
    facts: Mapping[str, HostFacts],
    origins: Mapping[str, str],
    *,
    guarded: Iterable[str],
    refused: Iterable[str] = (),
) -> list[rules.Refusal]:
    """Hosts of ``guarded`` (those the run converges GPU roles on) whose loaded driver is not the
    planned one. Hosts already refused by the matrix are left to that refusal."""
    watch = set(guarded) - set(refused)
    out = []
    for plan in plans:
        f = facts.get(plan.host)
        if plan.host not in watch or f is None or not f.driver_loaded:
            continue
        try:
            planned = rules.resolve(plan).driver_version
        except PlanRefused:
            continue  # the matrix refusal names it
        if planned == f.driver_loaded:
            continue
        out.append(
            rules.Refusal(
                host=plan.host,
                rule=LIVE_DRIVER_RULE,
                message=(
                    f"driver {f.driver_loaded} is loaded and this run would install driver "
                    f"{planned} (from {origins.get(plan.host, 'the inventory')}): up never "
                    "changes a loaded driver (packages under a loaded module break NVML and every "
                    "CUDA job until a reboot)"
                ),
                fix=(
                    f"roll it out with `gpumon-deploy upgrade-driver --to {planned} --limit "
                    f"{plan.host}` (drain, silences, reboot, validation), or keep it with "
                    f"nvidia_driver_version: {f.driver_loaded} for the host; --out-of-service "
                    "only if the host runs no GPU work"
                ),
            )
        )
    return out
