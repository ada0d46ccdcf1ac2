"""A small SVG line chart the benches write themselves (no plotting library): one panel per
measure, hosts on a log x axis, one line per tool, each point a median; bench.scale draws each
tool's no-op cost from 1 to 1,000 hosts with it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

Series = Mapping[str, Sequence[tuple[float, float]]]  # tool -> [(hosts, value)]

COLOURS = {
    "gpumon": "#1f77b4",
    "ansible": "#d62728",
    "mitogen": "#ff7f0e",
    "pyinfra": "#2ca02c",
    "floor": "#7f7f7f",
}
PANEL_W, PANEL_H, MARGIN = 300, 240, 52


def _ticks(lo: float, hi: float) -> list[float]:
    """1, 10, 100, ... (and 2, 5 between) covering [lo, hi] on a log axis."""
    out = []
    e = math.floor(math.log10(lo))
    while 10**e <= hi * 1.0001:
        out += [m * 10**e for m in (1, 2, 5) if lo / 1.0001 <= m * 10**e <= hi * 1.0001]
        e += 1
    return out


def _fmt(v: float) -> str:
    return f"{v:g}" if v >= 1 else f"{v:.2g}"


def panel(series: Series, title: str, unit: str, x0: float) -> list[str]:
    points = [p for pts in series.values() for p in pts if p[1] > 0]
    if not points:
        return []
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    xlo, xhi = min(xs), max(xs)
    ylo = 10 ** math.floor(math.log10(min(ys)))
    yhi = 10 ** math.ceil(math.log10(max(ys)))
    if xhi == xlo:
        xhi = xlo * 10
    left, top = x0 + MARGIN, 30
    w, h = PANEL_W - MARGIN - 10, PANEL_H - 30 - 40

    def sx(x: float) -> float:
        return left + w * (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo))

    def sy(y: float) -> float:
        return top + h - h * (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))

    out = [
        f'<text x="{left + w / 2:.0f}" y="18" text-anchor="middle" font-weight="bold">'
        f"{escape(title)}</text>",
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
        f'<text x="{left + w / 2:.0f}" y="{top + h + 34}" text-anchor="middle">hosts</text>',
        f'<text x="{x0 + 12}" y="{top + h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 {x0 + 12} {top + h / 2:.0f})">{escape(unit)}</text>',
    ]
    for t in _ticks(xlo, xhi):
        out.append(
            f'<text x="{sx(t):.1f}" y="{top + h + 16}" text-anchor="middle">{_fmt(t)}</text>'
        )
    for t in _ticks(ylo, yhi):
        out += [
            f'<line x1="{left}" x2="{left + w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>',
            f'<text x="{left - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>',
        ]
    for tool, pts in series.items():
        pts = sorted(p for p in pts if p[1] > 0)
        if not pts:
            continue
        colour = COLOURS.get(tool, "#000")
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts
        ]
    return out


def chart(panels: Sequence[tuple[str, str, Series]], caption: str) -> str:
    """An SVG document: ``panels`` of (title, unit, series) side by side, a legend, a caption."""
    body: list[str] = []
    for i, (title, unit, series) in enumerate(panels):
        body += panel(series, title, unit, i * PANEL_W)
    tools = list(dict.fromkeys(t for _, _, s in panels for t in s))
    width = PANEL_W * max(1, len(panels))
    for i, tool in enumerate(tools):
        x = MARGIN + i * 110
        body += [
            f'<rect x="{x}" y="{PANEL_H + 2}" width="14" height="4" '
            f'fill="{COLOURS.get(tool, "#000")}"/>',
            f'<text x="{x + 18}" y="{PANEL_H + 8}">{escape(tool)}</text>',
        ]
    body.append(f'<text x="{MARGIN}" y="{PANEL_H + 28}" font-size="10">{escape(caption)}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H + 36}" '
        f'font-family="sans-serif" font-size="11">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )
