"""GPUs per node in the exporters' metrics, counted by GPU UUID.

A series is not a GPU: with MIG, dcgm-exporter reports most fields once per GPU instance (labels
``GPU_I_ID``, ``GPU_I_PROFILE``; default ``-d f``, NVIDIA/dcgm-exporter
``internal/pkg/devicemonitoring/device_monitoring.go:97-120`` at 691c927), so a node with 2 GPUs,
one split into 3 instances, has 4 series of ``DCGM_FI_DEV_GPU_TEMP``
(``gpu_reality_fixtures/dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics``). A GPU is
its ``UUID`` label, which every real scrape in the fixtures carries on every series.

The node is the ``node`` label the file_sd targets set (``deployer/monitoring/file_sd.py``), never the
exporter's ``Hostname``: dcgm-exporter 4.x run with ``-r localhost:5555`` sets
``Hostname="localhost"`` on every host and newer versions rename it ``hostname``
(NVIDIA/dcgm-exporter ``internal/pkg/rendermetrics/render_metrics.go:47``, 691c927 vs d5e5f51).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deployer import dcgm_fields

NODE_LABEL = "node"  # set by the product's file_sd targets
GPU_LABEL = "UUID"  # dcgm-exporter's per-GPU label, the same on every GPU instance of one GPU


def presence_metric() -> str:
    """The one DCGM field status counts GPUs on (its only use of a field name): GPU temperature,
    in dcgm-exporter's default counters at every version in the fixtures, and emitted for every
    GPU, MIG instances and boards without a memory sensor included (L40S, A800 captures)."""
    return dcgm_fields.metric("gpu_temp")


def gpu_query(metric: str, since: float | None = None, job: str = "dcgm") -> str:
    """One series per (node, GPU): bounded by the number of GPUs, whatever the MIG layout.

    ``since`` (the replica's start, epoch seconds) keeps only series sampled since then: a replica
    that was stopped wrote no staleness markers, so for five minutes after its restart the WAL it
    replayed still answers with series that its first scrapes no longer return (a GPU that fell
    off the bus while it was down would still count)."""
    selector = f'{metric}{{job="{job}"}}'
    if since is not None:
        selector = f"timestamp({selector}) >= {since:.3f}"
    return f"group by ({NODE_LABEL}, {GPU_LABEL}) ({selector})"


def gpus_by_node(series: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """Distinct GPU UUIDs per node in an instant vector (the answer to ``gpu_query`` or to the bare
    selector: both carry ``node`` and ``UUID``), and per node the number of series with no UUID
    (an exporter that does not identify its GPUs: counted as problems, never as GPUs)."""
    uuids: dict[str, set[str]] = {}
    no_uuid: dict[str, int] = {}
    for s in series:
        labels = s.get("metric") or {}
        node = str(labels.get(NODE_LABEL, ""))
        uuid = labels.get(GPU_LABEL)
        if uuid:
            uuids.setdefault(node, set()).add(str(uuid))
        else:
            no_uuid[node] = no_uuid.get(node, 0) + 1
    return {n: len(u) for n, u in uuids.items()}, no_uuid


RECORD_METRIC = "gpumon_expected_gpus"


def record_command(path: str) -> str:
    """Read-only: the record ``up`` left on a GPU host (nothing printed when there is none)."""
    return f"cat {path} 2>/dev/null || true"


def parse_record(text: str) -> int | None:
    """The count in the node_exporter textfile ``up`` wrote (``gpumon_expected_gpus N``), or
    None when the file is absent or holds no such sample."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == RECORD_METRIC:
            try:
                return int(float(parts[1]))
            except ValueError:
                return None
    return None


def expected_counts(
    declared: Mapping[str, int],
    undeclared: Iterable[str],
    recorded: Mapping[str, int | None],
    facts_counts: Mapping[str, tuple[int, str] | None],
    scraped: Mapping[str, int] | None = None,
) -> dict[str, tuple[int | None, str]]:
    """Per GPU node the number of GPUs status holds it to, and where the number comes from.

    The rule of the plan (deployer/gpu/gpu_plan.py, rule ``gpu-count-facts``): a declared
    ``gpu_count`` is the number (``up``'s preflight refuses facts that contradict it). Without one,
    the count ``up`` planned from the facts and recorded on the host: a GPU that fell off the bus
    since then lowers what the facts show now, and must not lower what the node is held to. A
    node ``up`` never recorded is held to what its facts show now (``facts_counts``: count and
    source, nvidia-smi or the PCI bus); without host access, to the record as the replicas
    scraped it (``scraped``). None: nothing gives a number (the row fails and says why)."""
    out: dict[str, tuple[int | None, str]] = {n: (c, "gpu_count") for n, c in declared.items()}
    for node in undeclared:
        if node in out:
            continue
        record = recorded.get(node)
        found = facts_counts.get(node)
        if record is not None:
            note = "recorded by up"
            if found is not None and found[0] != record:
                note += f"; facts now show {found[0]} ({found[1]})"
            out[node] = (record, note)
        elif found is not None and found[0] > 0:
            out[node] = (found[0], f"facts, {found[1]}; no record of up on the host")
        elif scraped and node in scraped:
            out[node] = (scraped[node], f"{RECORD_METRIC} as scraped")
        else:
            out[node] = (None, "no gpu_count declared, no record of up and no facts to count")
    return out
