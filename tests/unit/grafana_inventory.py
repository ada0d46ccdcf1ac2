"""A test inventory with every group the grafana role and the dashboards read, and planning it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deployer.facts import HostFacts
from deployer.plan import PlannedTask
from deployer.session import DeploySession, RunOptions

INVENTORY: dict[str, Any] = {
    "all": {
        "hosts": {
            "gpu01": {"ansible_host": "192.0.2.11", "gpu_model": "H100", "gpu_count": 8,
                      "cluster": "c1", "slurm_partition": "train"},
            "gpu02": {"ansible_host": "192.0.2.12", "gpu_model": "A100", "gpu_count": 4,
                      "cluster": "c1", "slurm_partition": "infer"},
            "gpu03": {"ansible_host": "192.0.2.13", "gpu_model": "H100", "gpu_count": 2,
                      "cluster": "c2", "gpu_mig": {0: ["3g.40gb", "2g.20gb"]}},
            "prom01": {"ansible_host": "192.0.2.21"},
            "prom02": {"ansible_host": "192.0.2.22"},
            "graf01": {"ansible_host": "192.0.2.31"},
        },
        "children": {
            "gpu": {"hosts": {"gpu01": {}, "gpu02": {}, "gpu03": {}}},
            "monitoring": {
                "children": {
                    "prometheus": {"hosts": {"prom01": {}, "prom02": {}}},
                    "grafana": {"hosts": {"graf01": {}}},
                }
            },
        },
    }
}  # fmt: skip

GRAFANA_PLAY = "- name: Grafana\n  hosts: grafana\n  roles: [grafana]\n"


def write_inventory(tmp_path: Path, data: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data or INVENTORY))
    return path


def plan_grafana(
    tmp_path: Path,
    *extra_vars: str,
    data: dict[str, Any] | None = None,
    os_family: str = "debian",
) -> dict[str, PlannedTask]:
    """graf01's planned tasks and handlers of role grafana, by task name."""
    inv = write_inventory(tmp_path, data)
    site = tmp_path / "site.yml"
    site.write_text(GRAFANA_PLAY)
    session = DeploySession.load(
        RunOptions(inventory=inv, site=site, extra_vars=list(extra_vars)), plan=False
    )
    session.build_plan({"graf01": HostFacts(host="graf01", os_family=os_family, arch="x86_64")})
    out: dict[str, PlannedTask] = {}
    for hp in session.plans:
        for play in hp.plays:
            for t in [*play.tasks, *play.handlers.values()]:
                out[t.name] = t
    return out
