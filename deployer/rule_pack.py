"""What the GPU rule pack needs to know about GPU models and the exporter's shape, as computed values.

Owns the model facts the rules apply (which boards have no memory-temperature sensor, read from
the compatibility matrix; how many compute slices a MIG GPU has), the PromQL fragments built from
them and from the field registry (``deployer/dcgm_fields.py``), and the identity every alert of
the pack carries. The rule templates (``roles/prometheus/templates/rules/``) read them through
the template global ``gpumon_rule_pack``; nothing here is text to be matched.

Public API
----------
``sensorless_models() -> tuple``
    The compat models (``deployer/data/compat.yml`` keys) whose ``memory_temp_sensor`` is false:
    boards whose memory has no temperature sensor NVML reports (nvidia-smi "Memory Current
    Temp: N/A", dcgm-exporter DCGM_FI_DEV_MEMORY_TEMP 0). The matrix is the one place that fact
    lives, with its evidence (a capture) or its unverified mark (docs/unverified.md, generated
    from the matrix); a model whose sensor is not known (null) is not exempted.
``template_values() -> dict``
    The ``gpumon_rule_pack`` global: ``sensorless_models`` (exporter ``modelName`` values),
    ``mig_labels``, ``exporter_host_labels``, ``scope`` (field key -> "gpu"/"instance"/...),
    ``mig_compute_slices`` ({modelName: slices} where not the default) and
    ``mig_compute_slices_default``.
``job_values() -> dict``
    The job-aware part of the global (``job_label``, ``job_sources``): see "Jobs" below.
``promql_names_regex(names) -> str``
    An RE2 alternation matching those ``modelName`` values exactly (also with blanks replaced by
    dashes, as ``--replace-blanks-in-model-name`` writes them), escaped for a PromQL string.
``ALERT_SCOPES``, ``IDENTITY_LABELS``, ``identity_labels(alertname) -> tuple``
    Per alert: whether it is about one GPU, one host (target) or the whole cluster, and the labels
    that identify it (cluster, node, instance; gpu and UUID for a GPU).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from deployer import dcgm_fields
from deployer.gpu import matrix

# Compute slices of a GPU in MIG mode ("<n>g.<mem>" profiles use n of them). 7 on the A100/H100
# family: the H100 MIG capture's instances 3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb fill its 7
# (nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt:1187-1190); the A30 has 4
# (NVIDIA MIG User Guide, supported profiles): docs/unverified.md#mig-compute-slices.
MIG_COMPUTE_SLICES_DEFAULT = 7
MIG_COMPUTE_SLICES: dict[str, int] = {"A30": 4}

# What each alert is about, hence which labels identify it (issue 12 item 5): a GPU alert carries
# cluster, node, instance (the dcgm-exporter target), gpu and UUID; a host alert cluster, node and
# the target's instance; a cluster alert (about the monitoring pair itself, with no target of its
# own) cluster, from the replica's external label.
IDENTITY_LABELS: dict[str, tuple[str, ...]] = {
    "gpu": ("cluster", "node", "instance", "gpu", "UUID"),
    "host": ("cluster", "node", "instance"),
    "cluster": ("cluster",),
}
ALERT_SCOPES: dict[str, str] = {
    "GPUXidCritical": "gpu",
    "GPUXidWarning": "gpu",
    "GPUTemperatureHigh": "gpu",
    "GPUTemperatureCritical": "gpu",
    "GPUMemoryTemperatureHigh": "gpu",
    "GPUMemoryTemperatureMissing": "gpu",
    "GPUThermalThrottling": "gpu",
    "GPUPowerThrottling": "gpu",
    "GPUHardwareSlowdown": "gpu",
    "GPUDoubleBitECCError": "gpu",
    "GPURowRemapFailure": "gpu",
    "GPUUncorrectableRemappedRowsHigh": "gpu",
    "GPURetiredPagesHigh": "gpu",
    "GPUPCIeReplayRateHigh": "gpu",
    "GPUNVLinkReplayErrors": "gpu",
    "GPUNVLinkRecoveryErrors": "gpu",
    "GPUNVLinkCRCErrorFlood": "gpu",
    "GPUMissing": "host",
    "GPUExpectedCountMissing": "host",
    "DCGMExporterDown": "host",
    "DCGMExporterStale": "host",
    "PrometheusReplicaDown": "host",
    "PrometheusConfigReloadFailed": "host",
    "PrometheusRuleEvaluationFailures": "host",
    "PrometheusAlertmanagersNotDiscovered": "host",
    "AlertmanagerClusterMembersMismatch": "host",
    "AlertmanagerConfigReloadFailed": "host",
    "TargetDown": "host",
    "DCGMTargetMissing": "host",
    "AlertmanagerConfigInconsistent": "cluster",
    "ScrapeJobAbsent": "cluster",
    # the federation tier's global pair (global-federation.yml.j2): a shard replica it federates,
    # a whole shard (its label shard beside the pair's cluster)
    "PrometheusShardReplicaUnreachable": "host",
    "PrometheusShardUnreachable": "cluster",
}


def identity_labels(alertname: str) -> tuple[str, ...]:
    """The labels every firing ``alertname`` of the pack carries (``KeyError`` for others)."""
    return IDENTITY_LABELS[ALERT_SCOPES[alertname]]


def _exporter_names(model: str) -> list[str]:
    """The NVML names of a compat model (the exporter's ``modelName``), without lspci's names."""
    found = matrix.matrix().models.get(model)
    return [n for n in (found.names if found else ()) if "[" not in n]


def sensorless_models() -> tuple[str, ...]:
    """The compat models without a memory temperature sensor (see the module docstring)."""
    return tuple(
        sorted(key for key, m in matrix.matrix().models.items() if m.memory_temp_sensor is False)
    )


# --- Jobs ---------------------------------------------------------------------------------
# With --hpc-job-mapping-dir dcgm-exporter repeats every series of a GPU once per job on it with
# the label hpc_job (NVIDIA/dcgm-exporter internal/pkg/transformation/const.go:27,
# hpc.go:105-121 @691c927). The rules keep that name: a job id in an alert then selects the same
# series in a query ({hpc_job="4711"}), and the name is the exporter's, not Slurm's (any
# scheduler's Prolog may write the files). Every per-GPU aggregation drops it (a GPU with two
# jobs counts and alerts once); GPU alerts put the jobs back as one label, the GPU's job ids
# sorted and comma-joined, looked up when the alert is evaluated; the job records read it.
JOB_LABEL = "hpc_job"
# The GPU-level fields (scope "gpu": on every MIG instance series too) whose series say which jobs
# a GPU or GPU instance runs; any one present suffices (the default CSV has all three).
JOB_SOURCE_FIELDS = ("gpu_temp", "power_usage", "total_energy")


def job_values() -> dict[str, Any]:
    """The job part of ``template_values``: the label and the field keys its lookups read."""
    return {"job_label": JOB_LABEL, "job_sources": list(JOB_SOURCE_FIELDS)}


@cache
def template_values() -> dict[str, Any]:
    """The ``gpumon_rule_pack`` template global (see the module docstring)."""
    return {
        "sensorless_models": sorted({n for m in sensorless_models() for n in _exporter_names(m)}),
        "mig_labels": list(dcgm_fields.MIG_LABELS),
        "exporter_host_labels": list(dcgm_fields.EXPORTER_HOST_LABELS),
        "scope": {f.key: f.scope for f in dcgm_fields.FIELDS_BY_KEY.values()},
        "mig_compute_slices_default": MIG_COMPUTE_SLICES_DEFAULT,
        "mig_compute_slices": {
            name: slices
            for model, slices in MIG_COMPUTE_SLICES.items()
            for name in _exporter_names(model)
        },
        **job_values(),
    }


_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def promql_names_regex(names: Iterable[str]) -> str:
    """``a|b`` matching each name exactly, a blank also matching ``-``; every backslash doubled
    for a PromQL double-quoted string."""
    parts = []
    for name in sorted(set(names)):
        escaped = _RE2_SPECIAL.sub(r"\\\1", name).replace(" ", "[ -]")
        parts.append(escaped.replace("\\", "\\\\"))
    return "|".join(parts)
