"""Capacity of the Prometheus tier (pure: data in, figures out; no I/O).

What one replica of a pair and the long-term store must hold for an inventory: active series,
samples per second, disk per day and for the retention, head memory; and how many shards (HA
pairs) the fleet needs. Every figure's formula and source is in the README ("Capacity
planning"); the constants below cite theirs.

Series per scrape target, by job:

- ``dcgm``: from the collectors CSV the dcgm_exporter role renders for the host (its exporter
  version; the MIG variant on a host with a ``gpu_mig`` layout): one series per ``gauge``/
  ``counter`` line per GPU (``label`` lines are labels, not series), less the fields the GPU
  leaves blank (:class:`GpuTraits`: its architecture and sensor from compat.yml, NVLink, MIG;
  the constants below cite why). A GPU in MIG mode is reported per GPU instance (``-d f``, the
  role's default: NVIDIA/dcgm-exporter ``pkg/cmd/app.go:42,161`` @ 691c927), every field it
  reports once per instance (the real 8xA800 scrape, gpu_reality_fixtures
  ``dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics``: GPU 0, 3 instances, 3 series of
  each field; GPU 1 one of each, utilisation and row remapping included).
- ``node``: measured, not derived: node_exporter's default collectors on the lab's hosts
  (:data:`NODE_SERIES_MEASURED`); a site sets ``capacity_node_series`` (group or host) to what
  its own hosts export (``scrape_samples_post_metric_relabeling{job="node"}``).
- ``prometheus``, ``alertmanager``, ``victoriametrics``, ``thanos-sidecar``: the daemons' own
  metrics, measured on the lab (:data:`SELF_SERIES_MEASURED`), overridable by
  ``capacity_self_series`` ({job: series}).
- Every target adds the 5 series Prometheus writes per scrape (``up``,
  ``scrape_duration_seconds``, ``scrape_samples_scraped``, ``scrape_samples_post_metric_relabeling``,
  ``scrape_series_added``: prometheus/docs ``docs/concepts/jobs_instances.md``,
  "Automatically generated labels and time series").
- Recording rules (roles/prometheus/templates/rules/gpu-recording.yml.j2): 5 per GPU
  (``gpu:*``), 6 per GPU host (``node:*``), 6 per cluster (``cluster:*``), less the memory
  temperature records of boards without the sensor; each evaluated once per
  ``prometheus_evaluation_interval``.

Samples per second: each target's series divided by its scrape interval (its ``scrape_tier``'s
``interval``, else ``prometheus_scrape_interval``), plus the recorded series divided by the
evaluation interval.
"""

from __future__ import annotations

import functools
import math
import re
from collections import ChainMap
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from deployer.errors import InputError
from deployer.memory import collector_paused
from deployer.monitoring import host_values

# Prometheus' documented on-disk cost: "an average of only 1-2 bytes per sample"
# (prometheus/prometheus docs/storage.md, "Operational aspects" @ d15adb9; ../shared/reference/
# capacity.md [K1]). The planning figure is the upper end, 2 (a plan should not be optimistic);
# ``capacity_bytes_per_sample`` sets another.
BYTES_PER_SAMPLE = 2.0
# Head memory per active series, "about 3kB per series" for Prometheus >= 2.20 including the
# head's chunks at a usual scrape interval (Robust Perception, "Why does Prometheus use so much
# RAM?"; ../shared/reference/capacity.md [K2]). ``capacity_bytes_per_series`` sets another.
BYTES_PER_SERIES = 3000
# Design targets per replica (../shared/reference/capacity.md §2 summary [D]): 2 M active series
# (PromLabs: "several million"; practitioners 1-2 M), 10 M a hard ceiling; ingestion: a large
# server "can ingest up to 1 million samples per second" (PromLabs [K4]), planned at half.
SERIES_PER_REPLICA = 2_000_000
SAMPLES_PER_REPLICA = 500_000
SERIES_CEILING = 10_000_000
# The series Prometheus adds per target on each scrape (prometheus/docs docs/concepts/jobs_instances.md).
SCRAPE_SERIES_PER_TARGET = 5
# Measured on the lab (Debian 12 nspawn hosts, 2 vCPUs; `gpumon-deploy up`, then
# scrape_samples_post_metric_relabeling per target): node_exporter 1.9.1's default collectors
# (role node_exporter's flags), per host. A bigger host exports more (per CPU, disk, NIC).
NODE_SERIES_MEASURED = 800
# Measured on the lab the same way: each daemon's own /metrics (Prometheus 2.42.0, Alertmanager of
# the lab's mirror, VictoriaMetrics 1.79, Thanos sidecar unmeasured: not runnable here).
SELF_SERIES_MEASURED: dict[str, int] = {
    "prometheus": 640,
    "alertmanager": 385,
    "victoriametrics": 655,
    "thanos-sidecar": 640,  # not measured: docs/unverified.md#capacity-thanos-sidecar-series
}
# Recording rules of the rule pack (gpu-recording.yml.j2): records per GPU (gpu:*), per GPU host
# (node:*), per cluster (cluster:*); the memory temperature record keeps only readings > 0, so a
# board without the sensor has none (gpu: and node: levels).
RECORDS_PER_GPU = 5
RECORDS_PER_GPU_HOST = 6
RECORDS_PER_CLUSTER = 6
# Fields a GPU does not report (DCGM blank values, which dcgm-exporter skips: gpu_collector.go:303
# @ 691c927), by dcgm_fields key. XID: blank until the GPU's first XID (only NVML's event thread
# writes it: NVIDIA/DCGM DcgmCacheManager.cpp:12195-12197 @ v4.4.2; the L40S capture has no
# XID_ERRORS series), so a healthy fleet has none. Page retirement is Volta/Turing's; Ampere and
# later remap rows instead and print "Retired Pages ... N/A" (nvidia-smi -q of H100/H200/L40S in
# gpu_reality_fixtures), while row remapping is Ampere's and later's. In MIG mode NVML has no
# utilisation, no remapped rows and no NVLink (the A800 MIG capture has no GPU_UTIL or row-remap
# series for its MIG GPU; H100/H200 MIG nvidia-smi captures print [N/A]). A board without a
# memory temperature sensor (compat.yml memory_temp_sensor: false) has no memory max operating
# temperature. NVLink by architecture: docs/unverified.md#capacity-nvlink-by-architecture.
ALWAYS_BLANK = frozenset({"xid_last"})
RETIREMENT = frozenset({"retired_sbe", "retired_dbe", "retired_pending"})
ROW_REMAP = frozenset(
    {"uncorrectable_remapped_rows", "correctable_remapped_rows", "row_remap_failure",
     "row_remap_pending"}
)  # fmt: skip
NVLINK = frozenset(
    {"nvlink_bandwidth_total", "nvlink_crc_flit_errors", "nvlink_crc_data_errors",
     "nvlink_replay_errors", "nvlink_recovery_errors"}
)  # fmt: skip
MIG_BLANK = frozenset({"gpu_util", "mem_copy_util", "enc_util", "dec_util"}) | ROW_REMAP | NVLINK
SENSORLESS_BLANK = frozenset({"memory_max_op_temp"})
ROW_REMAP_ARCHITECTURES = frozenset({"ampere", "ada", "hopper", "blackwell"})
NO_NVLINK_ARCHITECTURES = frozenset({"ada"})

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_s(text: Any, key: str) -> float:
    """A Prometheus duration (``15s``, ``1m30s``, ``15d``) in seconds; InputError naming ``key``."""
    s = str(text).strip()
    parts = _DURATION.findall(s)
    if not parts or "".join(n + u for n, u in parts) != s:
        raise InputError(f"not a Prometheus duration: {text!r}", key=key)
    return float(sum(int(n) * _UNIT_S[u] for n, u in parts))


def csv_series_fields(csv_text: str) -> list[str]:
    """The field names of a collectors CSV that become series (``gauge`` and ``counter`` lines)."""
    names = []
    for line in csv_text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[1] in ("gauge", "counter"):
            names.append(cells[0])
    return names


def mig_instances(value: Any, gpus: int, host: str) -> list[int]:
    """GPU instances per GPU in MIG mode from a host's ``gpu_mig`` (a mapping GPU index ->
    profiles, as the lab writes it; or one list of profiles: every GPU so laid out)."""
    if value in (None, "", {}, []):
        return []
    if isinstance(value, Mapping):
        out = []
        for index, profiles in value.items():
            if not isinstance(profiles, (list, tuple)):
                raise InputError(
                    f"host {host}: gpu_mig[{index}] must be a list of GPU instance profiles",
                    key="gpu_mig",
                )
            out.append(len(profiles))
        return out
    if isinstance(value, (list, tuple)):
        return [len(value)] * gpus
    raise InputError(f"host {host}: gpu_mig must be a mapping or a list", key="gpu_mig")


@dataclass(frozen=True)
class GpuTraits:
    """What decides which fields a GPU reports: its architecture (compat.yml), whether it has a
    memory temperature sensor, and NVLink."""

    architecture: str | None = None
    memory_temp_sensor: bool | None = None
    nvlink: bool | None = None

    def blank(self, mig: bool) -> frozenset[str]:
        out = set(ALWAYS_BLANK)
        if self.architecture in ROW_REMAP_ARCHITECTURES:
            out |= RETIREMENT
        elif self.architecture is not None:
            out |= ROW_REMAP
        nvlink = self.nvlink
        if nvlink is None:
            nvlink = self.architecture not in NO_NVLINK_ARCHITECTURES
        if not nvlink:
            out |= NVLINK
        if self.memory_temp_sensor is False:
            out |= SENSORLESS_BLANK
        if mig:
            out |= MIG_BLANK
        return frozenset(out)


def traits_of(model: Any, nvlink: Any = None) -> GpuTraits:
    """A GPU model's traits from the compatibility matrix (unknown model: every field counted)."""
    return _traits_of(
        None if model in (None, "") else str(model), None if nvlink is None else bool(nvlink)
    )


@functools.lru_cache(maxsize=256)
def _traits_of(model: str | None, nvlink: bool | None) -> GpuTraits:
    from deployer.gpu import matrix

    found = matrix.matrix().model(model) if model is not None else None
    return GpuTraits(
        architecture=found.architecture if found else None,
        memory_temp_sensor=found.memory_temp_sensor if found else None,
        nvlink=nvlink,
    )


@functools.lru_cache(maxsize=4096)
def _key_of(name: str) -> str:
    from deployer import dcgm_fields

    for f in dcgm_fields.FIELDS_BY_KEY.values():
        if any(n.name == name for n in f.all_names()):
            return f.key
    return name


@functools.lru_cache(maxsize=256)
def _per_entity(csv_text: str, traits: GpuTraits) -> tuple[int, int]:
    """Series per full GPU and per GPU instance of a GPU in MIG mode, for one CSV."""
    keys = [_key_of(n) for n in csv_series_fields(csv_text)]
    full_blank = traits.blank(mig=False)
    mig_blank = traits.blank(mig=True)
    return sum(1 for k in keys if k not in full_blank), sum(1 for k in keys if k not in mig_blank)


def dcgm_series(csv_text: str, gpus: int, mig: list[int], traits: GpuTraits = GpuTraits()) -> int:
    """dcgm-exporter's series on a host: the CSV's fields the GPU reports, once per full GPU and
    once per GPU instance of a GPU in MIG mode."""
    per_gpu, per_instance = _per_entity(csv_text, traits)
    full = max(gpus - len(mig), 0)
    return full * per_gpu + sum(n * per_instance for n in mig)


@dataclass(frozen=True)
class TargetLoad:
    """One scrape target: its job, host, series (its own plus Prometheus' per-scrape ones) and
    scrape interval."""

    job: str
    host: str
    series: int
    interval_s: float

    @property
    def samples_per_s(self) -> float:
        return self.series / self.interval_s


@dataclass(frozen=True)
class Settings:
    """The tier's settings the figures depend on (from a replica's variables)."""

    scrape_interval_s: float = 15.0
    evaluation_interval_s: float = 15.0
    retention_s: float = 15 * 86400.0
    store_retention_s: float | None = None
    replicas_per_shard: int = 2
    shards: int = 1
    bytes_per_sample: float = BYTES_PER_SAMPLE
    bytes_per_series: float = BYTES_PER_SERIES
    series_per_replica: int = SERIES_PER_REPLICA
    samples_per_replica: int = SAMPLES_PER_REPLICA


@dataclass
class Figures:
    """Series, samples per second, disk and memory of one store of samples."""

    series: int = 0
    samples_per_s: float = 0.0
    disk_per_day_bytes: float = 0.0
    disk_retention_bytes: float = 0.0
    head_memory_bytes: float = 0.0


@dataclass
class Capacity:
    settings: Settings
    gpus: int
    gpu_hosts: int
    targets: int
    by_job: dict[str, dict[str, float]]  # job -> {targets, series, samples_per_s}
    recorded_series: int
    per_replica: Figures  # one replica of a pair that scrapes everything (one shard)
    store: Figures  # the deduplicated global view: the replica label dropped
    recommended_shards: int
    why: str
    warnings: list[str] = field(default_factory=list)
    # a sharded tier (prometheus_shard): one replica of each shard, from the real assignment
    per_shard: dict[str, Figures] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _figures(series: int, samples: float, s: Settings, retention_s: float | None) -> Figures:
    per_day = samples * 86400 * s.bytes_per_sample
    return Figures(
        series=series,
        samples_per_s=round(samples, 3),
        disk_per_day_bytes=per_day,
        disk_retention_bytes=per_day * (retention_s or 0) / 86400,
        head_memory_bytes=series * s.bytes_per_series,
    )


def recorded_series(gpus: int, sensorless_gpus: int, gpu_hosts: int, sensorless_hosts: int,
                    clusters: int) -> int:  # fmt: skip
    """The series the rule pack's recording rules write (gpu-recording.yml.j2)."""
    if not gpu_hosts:
        return 0
    return (
        gpus * RECORDS_PER_GPU
        - sensorless_gpus
        + gpu_hosts * RECORDS_PER_GPU_HOST
        - sensorless_hosts
        + clusters * RECORDS_PER_CLUSTER
    )


def compute(
    targets: Iterable[TargetLoad], gpus: int, gpu_hosts: int, recorded: int, s: Settings
) -> Capacity:
    """The figures for ``targets`` (every scrape target of the inventory, one shard's worth)."""
    by_job: dict[str, dict[str, float]] = {}
    series = 0
    samples = 0.0
    n = 0
    for t in targets:
        n += 1
        row = by_job.setdefault(t.job, {"targets": 0, "series": 0, "samples_per_s": 0.0})
        row["targets"] += 1
        row["series"] += t.series
        row["samples_per_s"] += t.samples_per_s
        series += t.series
        samples += t.samples_per_s
    series += recorded
    samples += recorded / s.evaluation_interval_s
    for row in by_job.values():
        row["samples_per_s"] = round(row["samples_per_s"], 3)
    one = _figures(series, samples, s, s.retention_s)
    by_series = math.ceil(series / s.series_per_replica)
    by_samples = math.ceil(samples / s.samples_per_replica)
    shards = max(1, by_series, by_samples)
    if shards == 1:
        why = (
            f"one pair holds it: {series:,} series per replica (target {s.series_per_replica:,}) "
            f"and {samples:,.0f} samples/s (target {s.samples_per_replica:,})"
        )
    elif by_series >= by_samples:
        why = (
            f"{series:,} active series per replica exceed the target of "
            f"{s.series_per_replica:,} per replica: ceil({series:,} / {s.series_per_replica:,})"
        )
    else:
        why = (
            f"{samples:,.0f} samples/s per replica exceed the target of "
            f"{s.samples_per_replica:,}/s: ceil({samples:,.0f} / {s.samples_per_replica:,})"
        )
    store = _figures(series, samples, s, s.store_retention_s)
    return Capacity(
        settings=s,
        gpus=gpus,
        gpu_hosts=gpu_hosts,
        targets=n,
        by_job=by_job,
        recorded_series=recorded,
        per_replica=one,
        store=store,
        recommended_shards=shards,
        why=why,
    )


# ---------------------------------------------------------------- from a replica's variables


@dataclass(frozen=True)
class GpuExporter:
    """What a GPU host's exporter collects: the role's two CSVs (``gpu_plan.exporter_csv`` and
    ``exporter_csv_mig``) and its GPU count."""

    csv: str
    csv_mig: str
    gpus: int


def _positive_int(value: Any, key: str, host: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"host {host}: expected a whole number, got {value!r}", key=key) from None
    if n < 0:
        raise InputError(f"host {host}: expected a number >= 0, got {n}", key=key)
    return n


def settings_from_vars(v: Mapping[str, Any], shards: int = 1) -> Settings:
    """The tier's settings from a replica's resolved variables (``capacity_*`` overrides)."""
    store_retention = v.get("victoriametrics_retention_period")
    store_s = None
    if store_retention not in (None, ""):
        text = str(store_retention)
        # VictoriaMetrics: a bare number is months (-retentionPeriod)
        store_s = (
            float(text) * 31 * 86400
            if text.isdigit()
            else duration_s(text, "victoriametrics_retention_period")
        )
    peers = v.get("groups", {}).get(v.get("prometheus_group", "prometheus"), [])
    return Settings(
        scrape_interval_s=duration_s(v["prometheus_scrape_interval"], "prometheus_scrape_interval"),
        evaluation_interval_s=duration_s(
            v["prometheus_evaluation_interval"], "prometheus_evaluation_interval"
        ),
        retention_s=duration_s(v["prometheus_retention_time"], "prometheus_retention_time"),
        store_retention_s=store_s,
        replicas_per_shard=max(1, len(peers) // max(1, shards)),
        shards=shards,
        bytes_per_sample=float(v.get("capacity_bytes_per_sample", BYTES_PER_SAMPLE)),
        bytes_per_series=float(v.get("capacity_bytes_per_series", BYTES_PER_SERIES)),
        series_per_replica=int(v.get("capacity_series_per_replica", SERIES_PER_REPLICA)),
        samples_per_replica=int(v.get("capacity_samples_per_replica", SAMPLES_PER_REPLICA)),
    )


@dataclass(frozen=True, slots=True)
class _GpuHost:
    """What one GPU host adds to the recording rules' series."""

    gpus: int
    sensorless: bool
    cluster: str


@dataclass
class _TierLoads:
    """Every target of the tier, each host's variables read once: per job, host -> its load
    (in the order the job scrapes them), and each GPU host's part of the recorded series."""

    jobs: dict[str, dict[str, TargetLoad]]
    gpu_hosts: dict[str, _GpuHost]
    dcgm_members: list[str]

    def totals(
        self, loads: list[TargetLoad], dcgm_members: Iterable[str]
    ) -> tuple[list[TargetLoad], int, int, int]:
        """``target_loads``' answer for ``loads`` and the GPU hosts ``dcgm_members``."""
        members = list(dcgm_members)
        found = [g for h in members if (g := self.gpu_hosts.get(h)) is not None]
        gpus = sum(g.gpus for g in found)
        sensorless = [g for g in found if g.sensorless]
        recorded = recorded_series(
            gpus,
            sum(g.gpus for g in sensorless),
            len(members),
            len(sensorless),
            len({g.cluster for g in found}),
        )
        return loads, gpus, len(members), recorded

    def whole(self) -> tuple[list[TargetLoad], int, int, int]:
        """``target_loads``' answer for every target of the tier."""
        loads = [t for by_host in self.jobs.values() for t in by_host.values()]
        return self.totals(loads, self.dcgm_members)


def target_loads(
    v: Mapping[str, Any], exporters: Mapping[str, GpuExporter]
) -> tuple[list[TargetLoad], int, int, int]:
    """Every scrape target of a replica's variables with its series and interval; the GPUs,
    GPU hosts and recorded series. ``exporters``: each GPU host's exporter (the role's CSVs)."""
    return _tier_loads(v, exporters).whole()


# What the capacity reads of each GPU and node target's host, in this order.
_HOST_READS = (
    "scrape_tier",
    "gpu_mig",
    "gpu_model",
    "capacity_gpu_nvlink",
    "cluster",
    "capacity_node_series",
)


def _tier_loads(v: Mapping[str, Any], exporters: Mapping[str, GpuExporter]) -> _TierLoads:
    from deployer.monitoring import file_sd

    read = host_values.per_host(v["hostvars"], _HOST_READS)
    default_s = duration_s(v["prometheus_scrape_interval"], "prometheus_scrape_interval")
    tiers = {
        str(name): duration_s(t["interval"], f"prometheus_scrape_tiers.{name}.interval")
        for name, t in (v.get("prometheus_scrape_tiers") or {}).items()
    }
    self_series = {**SELF_SERIES_MEASURED, **(v.get("capacity_self_series") or {})}
    jobs = list(v.get("prometheus_scrape_jobs") or file_sd.JOBS)
    out = _TierLoads({}, {}, file_sd.job_members(v, "dcgm") if "dcgm" in jobs else [])
    for job in jobs:
        by_host = out.jobs.setdefault(job, {})
        for h in file_sd.job_members(v, job):
            interval = default_s
            if job in ("dcgm", "node"):
                tier, mig_of, model, nvlink, cluster, node_series = read(h)
                interval = tiers.get(str(tier), default_s)
            if job == "dcgm":
                exp = exporters.get(h)
                if exp is None:
                    continue
                mig = mig_instances(mig_of, exp.gpus, h)
                traits = traits_of(model, nvlink)
                own = dcgm_series(exp.csv_mig if mig else exp.csv, exp.gpus, mig, traits)
                out.gpu_hosts[h] = _GpuHost(
                    exp.gpus,
                    traits.memory_temp_sensor is False,
                    "" if cluster is None else str(cluster),
                )
            elif job == "node":
                own = _positive_int(
                    NODE_SERIES_MEASURED if node_series is None else node_series,
                    "capacity_node_series",
                    h,
                )
            else:
                own = int(self_series.get(job, 0))
            by_host[h] = TargetLoad(job, h, own + SCRAPE_SERIES_PER_TARGET, interval)
    return out


def _shard_loads(
    v: Mapping[str, Any], tier: _TierLoads, shard: str
) -> tuple[list[TargetLoad], int, int, int]:
    """``target_loads`` of one shard's replica, from the whole tier's loads: the sharded jobs'
    targets of the hosts that shard scrapes, the stack's own targets as every shard scrapes them."""
    from deployer.monitoring import file_sd, shards

    own = _as_shard(v, shard)
    loads: list[TargetLoad] = []
    dcgm: list[str] = []
    for job, by_host in tier.jobs.items():
        if job not in shards.SHARDED_JOBS:
            loads.extend(by_host.values())
            continue
        members = file_sd.job_members(own, job)
        loads.extend(t for h in members if (t := by_host.get(h)) is not None)
        if job == "dcgm":
            dcgm = members
    return tier.totals(loads, dcgm)


def from_vars(v: Mapping[str, Any], exporters: Mapping[str, GpuExporter]) -> Capacity:
    """The capacity of the tier a replica's variables describe: every target as one pair would
    scrape it, and, for a sharded tier, one replica of each shard (deployer/monitoring/shards.py
    assigns the targets as the shards' file_sd do)."""

    with collector_paused():  # every host's variables stay alive (file_sd.job_targets)
        return _from_vars(v, exporters)


def _as_shard(v: Mapping[str, Any], shard: str) -> Mapping[str, Any]:
    """A replica's variables as one of shard ``shard`` (``""``: the whole tier) would have them,
    read through, nothing copied: a copy (``{**v}``) rendered every variable of the replica, its
    ``prometheus_cluster`` among them, which reads the cluster of every host it scrapes (at
    100,000 hosts a tenth of the capacity's time, for a figure the capacity does not use)."""
    from deployer.monitoring import shards

    return ChainMap({shards.SHARD_VAR: shard}, v)  # type: ignore[arg-type]


def _from_vars(v: Mapping[str, Any], exporters: Mapping[str, GpuExporter]) -> Capacity:
    from deployer.monitoring import shards

    replica_shards, _ = shards.layout(v)
    names = sorted(set(replica_shards.values()))
    settings = settings_from_vars(v, max(1, len(names)))
    # Every host's variables read once: each shard's targets are the whole tier's, split.
    tier = _tier_loads(_as_shard(v, ""), exporters)
    loads, gpus, hosts, recorded = tier.whole()
    result = compute(loads, gpus, hosts, recorded, settings)
    for name in names:
        loads, gpus, hosts, recorded = _shard_loads(v, tier, name)
        one = compute(loads, gpus, hosts, recorded, settings).per_replica
        result.per_shard[name] = one
        if one.series > SERIES_CEILING:
            result.warnings.append(
                f"shard {name}: {one.series:,} series per replica, over the "
                f"{SERIES_CEILING:,} ceiling"
            )
    if names and len(names) < result.recommended_shards:
        result.warnings.append(
            f"{len(names)} shards configured, {result.recommended_shards} recommended"
        )
    return result
