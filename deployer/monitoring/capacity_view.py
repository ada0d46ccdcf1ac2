"""The human table of ``gpumon-deploy capacity`` (``--output json`` prints the data itself)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from deployer.monitoring.capacity import Capacity, Figures

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size(n: float) -> str:
    i = 0
    while n >= 1024 and i < len(_UNITS) - 1:
        n /= 1024
        i += 1
    return f"{n:,.1f} {_UNITS[i]}"


def _row(name: str, f: Figures, retention: str) -> list[str]:
    return [
        name,
        f"{f.series:,}",
        f"{f.samples_per_s:,.0f}",
        size(f.disk_per_day_bytes),
        f"{size(f.disk_retention_bytes)} ({retention})",
        size(f.head_memory_bytes),
    ]


def _days(seconds: float | None) -> str:
    return "no retention set" if not seconds else f"{seconds / 86400:g} d"


def render_text(c: Capacity, console: Console | None = None) -> None:
    console = console or Console()
    s = c.settings
    jobs = Table(
        title=f"Scrape targets: {c.gpu_hosts} GPU hosts, {c.gpus} GPUs, {c.targets} targets"
    )
    for col in ("job", "targets", "series", "samples/s"):
        jobs.add_column(col, justify="left" if col == "job" else "right")
    for job, row in sorted(c.by_job.items()):
        jobs.add_row(
            job, f"{row['targets']:,.0f}", f"{row['series']:,.0f}", f"{row['samples_per_s']:,.1f}"
        )
    jobs.add_row(
        "recording rules",
        "",
        f"{c.recorded_series:,}",
        f"{c.recorded_series / s.evaluation_interval_s:,.1f}",
    )
    console.print(jobs)
    t = Table(title="Capacity")
    for col in (
        "where",
        "active series",
        "samples/s",
        "disk/day",
        "disk for retention",
        "head memory",
    ):
        t.add_column(col, justify="left" if col == "where" else "right")
    t.add_row(*_row("one replica (one pair, every target)", c.per_replica, _days(s.retention_s)))
    for name, figures in sorted(c.per_shard.items()):
        t.add_row(*_row(f"one replica of shard {name}", figures, _days(s.retention_s)))
    t.add_row(*_row("long-term store (deduplicated)", c.store, _days(s.store_retention_s)))
    console.print(t)
    console.print(
        f"recommended shards (HA pairs): [bold]{c.recommended_shards}[/bold]: {c.why}\n"
        f"assumed: {s.bytes_per_sample:g} bytes/sample on disk, {s.bytes_per_series:g} bytes/series "
        "in the head (README, Capacity planning)"
    )
    for w in c.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
