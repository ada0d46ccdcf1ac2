"""The monitoring tier as the rollout sees it: Alertmanager peers to silence through, and the
Prometheus replicas that must see an upgraded host's exporter up with the new driver label.

Both come from the session's inventory and the roles' variables, as ``status`` expects the stack
(``deployer.monitoring.status.expect``); an inventory without a Prometheus or Alertmanager host gives an
empty expectation, so no monitoring tier, and the rollout then neither silences nor queries.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field

from deployer import dcgm_fields
from deployer.errors import InputError
from deployer.monitoring import handoff, status
from deployer.monitoring.http import Fetch, use_tls
from deployer.session import DeploySession


@dataclass
class MonitoringTier:
    alertmanagers: list[str] = field(default_factory=list)  # peer base URLs
    replicas: list[tuple[str, str]] = field(default_factory=list)  # (host, base URL)
    gpu_metric: str = dcgm_fields.metric("gpu_temp")
    # A sharded tier (deployer/monitoring/shards.py): GPU node -> the replicas whose dcgm
    # targets list it, as ``status`` expects them: its shard's pair (:func:`load` refuses a
    # tier whose re-shard ``up`` has not finished). Empty: one pair, every replica scrapes
    # every node.
    scrapers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        return bool(self.alertmanagers or self.replicas)

    def replicas_of(self, node: str) -> list[tuple[str, str]]:
        """The replicas that must see ``node`` once it is upgraded: those that scrape it (the
        replicas of another shard never do); every replica when the tier is one pair, or when
        no replica's targets list the node (each then says it has none of its targets)."""
        mine = self.scrapers.get(node)
        if not mine:
            return list(self.replicas)
        return [(host, url) for host, url in self.replicas if host in mine]


def load(session: DeploySession) -> MonitoringTier:
    """The tier the session's inventory describes (empty when it has none). Refused
    (``InputError``) while its shard layout changes and ``up`` has not finished the re-shard:
    until then which replicas scrape a host is not what the inventory says (a moved host's new
    owner scrapes it only once ``up`` hands it over), so an upgraded host would fail validation
    after its reboot for want of a scraper that is not yet one."""
    handoff.forget()  # this inventory's records, read anew
    exp = status.expect(
        session.role_variables("prometheus"),
        session.role_variables("alertmanager"),
        session.role_variables("thanos_query"),
    )
    changing = handoff.changes()
    handoff.forget()  # nothing of this is settled: only up records a layout
    if changing:
        raise InputError(
            "the Prometheus tier's shard layout is changing ("
            + "; ".join(changing)
            + "): run a whole `gpumon-deploy up` first (no --limit or --tags); it hands the "
            "hosts over to their new shards and records the layout. Until then the replicas "
            "that must see an upgraded host are not the ones that scrape it",
            key=handoff.RECORD_VAR,
        )
    use_tls(exp.client_tls)  # the silences and queries of a rollout go over the tier's TLS
    scrapers: dict[str, list[str]] = {}
    for replica, targets in exp.replica_targets.items():  # empty unless sharded
        for t in targets:
            if t.job == "dcgm":
                scrapers.setdefault(t.node, []).append(replica)
    return MonitoringTier(
        alertmanagers=[p.url for p in exp.alertmanagers],
        replicas=[(r.host, r.url) for r in exp.replicas],
        gpu_metric=exp.gpu_metric,
        scrapers={node: tuple(found) for node, found in scrapers.items()},
    )


def _query(fetch: Fetch, base: str, promql: str) -> tuple[list[dict] | None, str | None]:
    r = fetch(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if r.error is not None:
        return None, r.error
    if r.status != 200:
        return None, f"HTTP {r.status}"
    try:
        data = json.loads(r.body)
    except ValueError:
        return None, "not JSON"
    if data.get("status") != "success":
        return None, str(data.get("error", data))
    return data["data"]["result"], None


def replica_sees(
    fetch: Fetch, base: str, node: str, metric: str, driver: str, gpus: int
) -> str | None:
    """None when this replica scrapes every target of ``node`` (up == 1) and has ``gpus`` series
    of ``metric`` labelled with the new driver; otherwise what is missing."""
    up, err = _query(fetch, base, f'up{{node="{node}"}}')
    if err is not None:
        return f"query failed: {err}"
    if not up:
        return f"no target of {node}"
    down = [s["metric"].get("job", "?") for s in up if s["value"][1] != "1"]
    if down:
        return f"target(s) of {node} down: {', '.join(sorted(down))}"
    # GPUs, not series: on a MIG GPU the exporter emits one series per GPU instance, each with
    # the parent GPU's UUID (../shared/gpu_reality_fixtures/dcgm-exporter-metrics/a800_mig_*)
    label = dcgm_fields.metric("driver_version")
    promql = f'count(count by (UUID) ({metric}{{node="{node}",{label}="{driver}"}}))'
    seen, err = _query(fetch, base, promql)
    if err is not None:
        return f"query failed: {err}"
    count = int(float(seen[0]["value"][1])) if seen else 0
    if count < gpus:
        return f"{count}/{gpus} GPUs of {node} with {label}={driver}"
    return None
