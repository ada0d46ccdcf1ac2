"""The monitoring tier's cost per GPU (issue 20, item 6), measured on a converged lab:

- per field list (the product's rendered CSV, dcgm-exporter's ``default-counters.csv``, its
  profiling set ``dcp-metrics-included.csv``): the bytes of one scrape and the series per GPU, from
  a second exporter instance started beside the product's on each GPU host with that list (the
  GPU layer is the lab's SIMULATED one; the same figures from the real L40S capture in
  ../shared stand beside them as the reality check of what a series costs on the wire);
- per Prometheus replica: CPU and resident memory per 1,000 active series and per 1,000 samples/s,
  from the replica's own /metrics read twice ``--window`` seconds apart.

    .venv/bin/gpumon-deploy lab up --name tier
    .venv/bin/gpumon-deploy up -i /var/lib/gpumon-lab/tier/inventory.yml
    .venv/bin/python -m bench.tiercost --lab tier
    .venv/bin/gpumon-deploy lab down --name tier

Prints two tables and writes ``bench/results/tiercost-<date>.json``. No timing here is a test: the
CPU figure is CPU seconds (not wall), the least load-sensitive figure a shared machine gives.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import re
import shlex
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.measure import table, write_result

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "gpu_reality_fixtures"
REAL_SCRAPE = SHARED / "dcgm-exporter-metrics" / "l40s_595.58.03_default-counters.metrics"

#: The field lists compared, by name -> path on a GPU host (the first is the product's, as the
#: dcgm_exporter role renders it: roles/dcgm_exporter/defaults/main.yml
#: dcgm_exporter_collectors_file; the others ship with the exporter package, byte for byte
#: upstream's etc/ files).
FIELD_LISTS = {
    "gpumon (rendered)": "/etc/dcgm-exporter/gpumon-counters.csv",
    "upstream default-counters.csv": "/etc/dcgm-exporter/default-counters.csv",
    "upstream dcp-metrics-included.csv": "/etc/dcgm-exporter/dcp-metrics-included.csv",
}
#: The product's list with its ``profiling`` group added (dcgm_exporter_field_groups + profiling).
#: (Upstream's dcp-metrics-included.csv holds the same fields as its default-counters.csv at
#: 4.4.2-4.7.1 and 4.5.3-4.8.2: both collect the five DCP gauges; they differ in comments only.)
PROFILING_LIST = "gpumon + profiling group"
BENCH_PORT = 19400
BENCH_UNIT = "gpumon-bench-exporter"

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_GPU_LABEL = re.compile(r'[{,]gpu="(\d+)"')


@dataclass(frozen=True)
class ScrapeCost:
    """What one scrape of one exporter costs: on the wire and in series."""

    field_list: str
    host: str
    gpus: int
    bytes: int
    series: int
    gpu_series: int

    @property
    def series_per_gpu(self) -> float:
        return self.gpu_series / self.gpus if self.gpus else 0.0

    @property
    def bytes_per_gpu(self) -> float:
        return self.bytes / self.gpus if self.gpus else 0.0

    @property
    def bytes_per_series(self) -> float:
        return self.bytes / self.series if self.series else 0.0


def scrape_cost(text: str, *, field_list: str, host: str) -> ScrapeCost:
    """Count a Prometheus text exposition: every sample line is a series; those with a ``gpu``
    label are the GPUs' (a MIG instance's series carry its GPU's index, so they count to it)."""
    series = gpu_series = 0
    gpus: set[str] = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        series += 1
        g = _GPU_LABEL.search(m.group(2) or "")
        if g:
            gpu_series += 1
            gpus.add(g.group(1))
    return ScrapeCost(field_list, host, len(gpus), len(text.encode()), series, gpu_series)


def own_metrics(text: str, names: Sequence[str]) -> dict[str, float]:
    """The unlabelled values (or the sum over labels) of ``names`` in a /metrics text."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


REPLICA_METRICS = (
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "prometheus_tsdb_head_series",
    "prometheus_tsdb_head_samples_appended_total",
)


@dataclass(frozen=True)
class ReplicaCost:
    host: str
    window_s: float
    head_series: float
    samples_per_s: float
    cpu_cores: float
    rss_mib: float

    @property
    def cpu_millicores_per_1k_series(self) -> float:
        return 1000 * self.cpu_cores / self.head_series * 1000 if self.head_series else 0.0

    @property
    def rss_mib_per_1k_series(self) -> float:
        return self.rss_mib / self.head_series * 1000 if self.head_series else 0.0

    @property
    def cpu_millicores_per_1k_samples_s(self) -> float:
        return 1000 * self.cpu_cores / self.samples_per_s * 1000 if self.samples_per_s else 0.0


def replica_cost(
    host: str, before: Mapping[str, float], after: Mapping[str, float], window_s: float
) -> ReplicaCost:
    cpu = after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]
    appended = (
        after["prometheus_tsdb_head_samples_appended_total"]
        - before["prometheus_tsdb_head_samples_appended_total"]
    )
    return ReplicaCost(
        host=host,
        window_s=window_s,
        head_series=after["prometheus_tsdb_head_series"],
        samples_per_s=appended / window_s,
        cpu_cores=cpu / window_s,
        rss_mib=after["process_resident_memory_bytes"] / (1 << 20),
    )


# ---------------------------------------------------------------- on the lab


def _exporter_scrape(lab: Any, host: str, csv: str) -> str:
    """Run a second exporter with ``csv`` beside the product's (same binary, same nv-hostengine),
    as a transient unit with no privileges; one scrape after its first collection; stopped."""
    argv = ["/usr/bin/dcgm-exporter", "-f", csv, "-a", f"127.0.0.1:{BENCH_PORT}"]
    argv += ["-c", "1000", "-r", "localhost:5555"]
    script = f"""
set -e
systemctl stop {BENCH_UNIT} 2>/dev/null || true
systemctl reset-failed {BENCH_UNIT} 2>/dev/null || true
systemd-run --quiet --unit={BENCH_UNIT} -p DynamicUser=yes {shlex.join(argv)}
trap 'systemctl stop {BENCH_UNIT} 2>/dev/null || true' EXIT
python3 - <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while True:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:{BENCH_PORT}/metrics", timeout=5).read()
        if b"gpu=" in text:
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the bench exporter served no GPU series in 60 s")
    time.sleep(0.5)
time.sleep(2)  # a collection after the first: every field has its value
sys.stdout.buffer.write(urllib.request.urlopen("http://127.0.0.1:{BENCH_PORT}/metrics", timeout=5).read())
PY
"""
    proc = lab.ssh(host, script, timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"{host}: bench exporter with {csv}: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def _write_profiling_csv(lab: Any, host: str) -> str:
    """The product's rendered CSV plus its ``profiling`` field group (every DCGM_FI_PROF_* field,
    named as the host's exporter version names them), written on the host; returns its path."""
    from deployer import dcgm_fields

    proc = lab.ssh(host, "dcgm-exporter --version", timeout=30)
    m = re.search(r"version (\S+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"{host}: dcgm-exporter --version: {proc.stderr.strip()[-300:]}")
    rows = dcgm_fields.render_csv(["profiling"], exporter_tag=m.group(1))
    payload = base64.b64encode(rows.encode()).decode()
    path = "/run/gpumon-bench-profiling.csv"  # not /tmp: DynamicUser= gives the unit a private /tmp
    script = f"{{ cat {FIELD_LISTS['gpumon (rendered)']}; echo {payload} | base64 -d; }} > {path}"
    proc = lab.ssh(host, f"{script} && chmod 0644 {path}", timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{host}: writing {path}: {proc.stderr.strip()[-300:]}")
    return path


def _replica_metrics(address: str) -> dict[str, float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address}:9090/metrics", timeout=10) as r:
        return own_metrics(r.read().decode(), REPLICA_METRICS)


def measure(lab_name: str, window_s: float) -> dict[str, Any]:
    from deployer.lab import Lab

    lab = Lab(lab_name)
    topo = lab.require_topology()
    costs: list[ScrapeCost] = []
    for h in topo.group("gpu"):
        lists = {**FIELD_LISTS, PROFILING_LIST: _write_profiling_csv(lab, h.name)}
        for name, csv in lists.items():
            costs.append(
                scrape_cost(_exporter_scrape(lab, h.name, csv), field_list=name, host=h.name)
            )
    real = scrape_cost(
        REAL_SCRAPE.read_text(),
        field_list="upstream default-counters.csv",
        host="REAL L40S capture",
    )
    replicas = topo.group("prometheus")
    before = {h.name: _replica_metrics(h.address) for h in replicas}
    started = time.monotonic()
    time.sleep(window_s)
    after = {h.name: _replica_metrics(h.address) for h in replicas}
    elapsed = time.monotonic() - started
    tier = [replica_cost(h.name, before[h.name], after[h.name], elapsed) for h in replicas]
    return {"scrapes": costs, "real": real, "replicas": tier}


def _scrape_rows(costs: Sequence[ScrapeCost]) -> list[list[str]]:
    rows = [
        ["field list", "host", "GPUs", "series/GPU", "bytes/GPU", "bytes/series", "scrape bytes"]
    ]
    for c in costs:
        rows.append([c.field_list, c.host, str(c.gpus), f"{c.series_per_gpu:.1f}",
                     f"{c.bytes_per_gpu:,.0f}", f"{c.bytes_per_series:.0f}", f"{c.bytes:,}"])  # fmt: skip
    return rows


def _replica_rows(tier: Sequence[ReplicaCost]) -> list[list[str]]:
    rows = [["replica", "head series", "samples/s", "CPU cores", "RSS MiB",
             "mcores/1k series", "MiB/1k series", "mcores/1k samples/s"]]  # fmt: skip
    for r in tier:
        rows.append([r.host, f"{r.head_series:,.0f}", f"{r.samples_per_s:,.1f}", f"{r.cpu_cores:.3f}",
                     f"{r.rss_mib:.0f}", f"{r.cpu_millicores_per_1k_series:.1f}",
                     f"{r.rss_mib_per_1k_series:.1f}", f"{r.cpu_millicores_per_1k_samples_s:.1f}"])  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="tier", help="a converged lab's name")
    parser.add_argument(
        "--window", type=float, default=120.0, help="seconds between the replicas' reads"
    )
    parser.add_argument(
        "--out", default=None, help="result file (default bench/results/tiercost-<date>.json)"
    )
    args = parser.parse_args(argv)
    got = measure(args.lab, args.window)
    print("exporter scrapes (GPU layer SIMULATED on the lab; the last row a REAL capture):")
    print(table(_scrape_rows([*got["scrapes"], got["real"]])))
    print(f"\nPrometheus replicas over {args.window:.0f} s:")
    print(table(_replica_rows(got["replicas"])))

    def dump(x: Any) -> dict[str, Any]:
        props = ("series_per_gpu", "bytes_per_gpu", "bytes_per_series", "cpu_millicores_per_1k_series",
                 "rss_mib_per_1k_series", "cpu_millicores_per_1k_samples_s")  # fmt: skip
        return {**asdict(x), **{p: getattr(x, p) for p in props if hasattr(x, p)}}

    write_result(
        {
            "date": datetime.date.today().isoformat(),
            "lab": args.lab,
            "scrapes": [dump(c) for c in got["scrapes"]],
            "real_capture": {
                "file": str(REAL_SCRAPE.relative_to(REPO.parent)),
                **dump(got["real"]),
            },
            "replicas": [dump(r) for r in got["replicas"]],
        },
        "tiercost",
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
