"""``gpumon-deploy capacity``: the capacity of the inventory's Prometheus tier, from the variables
``up`` resolves (the first replica's, as ``status`` reads them) and each GPU host's collectors CSV
as the dcgm_exporter role renders it (``exporter_csv`` / ``exporter_csv_mig`` of its
``gpu_plan``, for the exporter version the host's plan resolves; ``gpu_plan.exporter_plans``
plans each distinct combination of the variables they depend on once). Touches no host: the facts are stand-ins, so a GPU
count the inventory does not declare is one GPU (said in the output's warnings).

The figures and their sources: deployer/monitoring/capacity.py and README "Capacity planning".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from deployer.errors import InputError
from deployer.monitoring import capacity

if TYPE_CHECKING:
    from deployer.session import DeploySession


def load(inventory: Path, extra_vars: list[str] | None = None) -> capacity.Capacity:
    """The inventory's capacity figures (``InputError`` on bad input, naming the key)."""
    from deployer.session import DeploySession, RunOptions

    session = DeploySession.load(
        RunOptions(inventory=inventory, extra_vars=list(extra_vars or [])), plan=False
    )
    return of_session(session)


def of_session(session: DeploySession) -> capacity.Capacity:
    """The capacity figures of a loaded session's inventory (as :func:`load`)."""
    from deployer.gpu import gpu_plan
    from deployer.hostpattern import NoHostsMatched, select
    from deployer.session import validation_facts

    inventory = session.options.inventory
    planner = session.load_content()
    play = next((p for p in session.site_plays if "prometheus" in p.roles), None)
    if play is None:
        raise InputError("the site has no play with the prometheus role", key="prometheus")
    try:
        replicas = [h.name for h in select(session.inventory, play.hosts, play=True)]
    except NoHostsMatched:
        replicas = []
    if not replicas:
        raise InputError(
            f"no host of the inventory is in the Prometheus play ({play.hosts})",
            source=str(inventory),
        )
    first = replicas[0]
    v = planner.host_vars(first, play, {"facts": validation_facts(first).to_json()})
    from deployer.monitoring import file_sd

    warnings: list[str] = []
    gpu_hosts = file_sd.every_gpu_host(v)  # every shard's: the tier is sized whole and per shard
    plans = gpu_plan.exporter_plans((h, session.driver_choice(h).variables) for h in gpu_hosts)
    exporters: dict[str, capacity.GpuExporter] = {}
    # one exporter per distinct plan (exporter_plans shares them), not one per host
    of_plan: dict[int, capacity.GpuExporter] = {}
    hosts = session.inventory.hosts
    for h in gpu_hosts:
        plan = plans[h]
        if hosts[h].vars.get("gpu_count") is None:
            warnings.append(f"{h}: no gpu_count in the inventory; counted as {plan.gpu_count}")
        exporter = of_plan.get(id(plan))
        if exporter is None:
            exporter = of_plan[id(plan)] = capacity.GpuExporter(
                plan.csv, plan.csv_mig, plan.gpu_count
            )
        exporters[h] = exporter
    from deployer.monitoring import handoff

    # Sized as the layout will run once converged: a shard layout record ``up`` would refuse
    # (another tier's) is said, not the end of a command that only reads.
    with handoff.diagnosing() as record_problems:
        result = capacity.from_vars(v, exporters)
    warnings += [f"{said} (up refuses it; sized as if there were none)" for said in record_problems]
    result.warnings[:0] = warnings
    return result
