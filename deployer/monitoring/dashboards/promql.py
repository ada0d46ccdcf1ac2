"""The PromQL of the panels: selectors from the dashboard variables, per-GPU aggregation as the
rule pack does it, metric names from the field registry (``deployer/dcgm_fields.py``).

Series keep the file_sd target labels (``cluster``, ``node``, ``instance``, ``gpu_model``...): a
legend names the host by ``node``, never by the exporter's host-name label, which per-GPU
aggregation drops with the MIG labels exactly as the alert rules do.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployer import dcgm_fields
from deployer.monitoring.dashboards.scope import Scope

# The recording rules of roles/prometheus/templates/rules/gpu-recording.yml.j2 the panels read.
GPU_UTIL = "gpu:gpu_utilization:percent"
GPU_POWER = "gpu:gpu_power_usage_watts:max"
GPU_MEMORY_TEMP = "gpu:gpu_memory_temperature_celsius:max"
GPU_MEMORY_USED = "gpu:gpu_memory_used_mib:sum"
GPU_MEMORY_FREE = "gpu:gpu_memory_free_mib:sum"
CLUSTER_UTIL = "cluster:gpu_utilization:avg"
CLUSTER_POWER = "cluster:gpu_power_usage_watts:sum"
CLUSTER_MEMORY_RATIO = "cluster:gpu_memory_used_per_usable:ratio"

GPU_LEGEND = "{{node}} GPU {{gpu}}"


def m(key: str) -> str:
    """The stored metric name of a registry field."""
    return dcgm_fields.metric(key)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True)
class Queries:
    """PromQL fragments for one scope (job names, label lists, thresholds)."""

    scope: Scope

    # ---- selectors ---------------------------------------------------------------------
    @property
    def model(self) -> str:
        return self.scope.fleet.model_label

    def gpu(self, *extra: str, node_var: str = "node") -> str:
        """Matchers of a GPU series under the dashboard's variables."""
        parts = [
            f'job="{self.scope.rules.job_dcgm}"',
            'cluster=~"$cluster"',
            f'node=~"${node_var}"',
            f'{self.model}=~"$gpu_model"',
        ]
        if self.scope.fleet.slurm:
            parts.append(f'{self.scope.job_label}=~"$hpc_job"')
        return ", ".join([*parts, *extra])

    def targets(self, job: str, *extra: str) -> str:
        return ", ".join([f'job="{job}"', 'cluster=~"$cluster"', 'node=~"$node"', *extra])

    @property
    def drop(self) -> str:
        """The labels per-GPU aggregation removes (MIG instance and exporter host name)."""
        r = self.scope.rules
        return ", ".join([*r.mig_labels, *r.exporter_host_labels])

    def per_gpu(self, key: str, *extra: str, agg: str = "max", node_var: str = "node") -> str:
        """One series per physical GPU of a registry field, blank sentinels cut."""
        ceiling = _num(self.scope.rules.ceiling)
        return (
            f"{agg} without ({self.drop}) "
            f"({m(key)}{{{self.gpu(*extra, node_var=node_var)}}} < {ceiling})"
        )

    def recorded(self, record: str, *extra: str, node_var: str = "node") -> str:
        return f"{record}{{{self.gpu(*extra, node_var=node_var)}}}"

    def rate(self, key: str, window: str = "$__rate_interval", *, node_var: str = "node") -> str:
        return (
            f"max without ({self.drop}) (rate({m(key)}{{{self.gpu(node_var=node_var)}}}[{window}]))"
        )

    def bit_set(self, bits: tuple[int, ...], node_var: str = "node") -> str:
        """1 for a GPU whose clock-event reasons have one of ``bits`` set (the throttling rules'
        decoding of field 112, gpu-alerts.yml.j2)."""
        clocks = (
            f"max without ({self.drop}) "
            f"({m('clocks_event_reasons')}{{{self.gpu(node_var=node_var)}}} < 4294967296)"
        )
        tests = " or ".join(f"floor({clocks} / {2**b}) % 2 == 1" for b in bits)
        return f"({tests})"

    # ---- alerts and silences -----------------------------------------------------------
    def firing(self, *extra: str) -> str:
        return ", ".join(['alertstate="firing"', 'cluster=~"$cluster"', *extra])

    def silences_active(self) -> str:
        return f'alertmanager_silences{{job="{self.scope.rules.job_alertmanager}", state="active"}}'

    # ---- the PCIe replay threshold of each host's model --------------------------------
    def pcie_threshold_series(self, node_var: str = "node") -> str:
        """The GPUPCIeReplayRateHigh threshold of every GPU host selected, as one series per
        node: the per-model figure where the rule pack has one, else the default."""
        r = self.scope.rules
        base = f"max by (cluster, node) ({m('pcie_replay')}{{{self.gpu(node_var=node_var)}}})"
        models = [name for name, _ in r.pcie_replays_by_model]
        parts = [
            f"(max by (cluster, node) ({m('pcie_replay')}{{{self.gpu(f'gpu_model={chr(34)}{name}{chr(34)}', node_var=node_var)}}}) * 0 + {_num(limit)})"
            for name, limit in r.pcie_replays_by_model
        ]
        others = f'gpu_model!~"{"|".join(models)}"' if models else None
        rest = (
            f"(max by (cluster, node) ({m('pcie_replay')}{{{self.gpu(others, node_var=node_var)}}}) * 0 + {_num(r.pcie_replays_per_minute)})"
            if others
            else f"({base} * 0 + {_num(r.pcie_replays_per_minute)})"
        )
        return " or ".join([*parts, rest])
