"""Helpers of the simulator-versus-reality tests (``test_gpusim_reality_*.py``).

Captures are read through :func:`tests.reality.capture_text`; nothing here keeps a copy. The
normalisers keep what a parser depends on -- line structure, column positions, keys, field order,
labels, units and the N/A forms -- and replace what differs between any two machines (UUIDs,
serials, bus ids, timestamps, temperatures, clocks, memory and power readings) by placeholders.
"""

from __future__ import annotations

import re
from pathlib import Path

from deployer.lab.gpusim import hardware_for, prepare_root
from deployer.lab.gpusim.sandbox import pick, run, unpack
from tests.reality import capture_text

RULE = "#" * 80
UUID = re.compile(r"\b(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
BUS = re.compile(r"\b[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\b")
DATE = re.compile(r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\b")
STAMP = re.compile(r"\b\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}\b")
HEX = re.compile(r"\b0x[0-9A-Fa-f]+\b")
NUMBER = re.compile(r"-?\d+(\.\d+)?")
#: -q values kept word for word: the forms a parser tells apart from a reading
LITERAL_VALUES = frozenset({"N/A", "[N/A]", "None", "Requested functionality has been deprecated"})


def section(relpath: str, title: str) -> tuple[str, str]:
    """(command, output) of one section of an nvidia_gpu_exporter capture, e.g. ``idle :: -L``
    is ``section(path, "capabilities :: list (-L)")``."""
    parts = capture_text(relpath).split("\n" + RULE + "\n")
    for n, part in enumerate(parts):
        if part.startswith("# " + title):
            command = next((ln[4:] for ln in part.splitlines() if ln.startswith("# $ ")), "")
            return command.strip(), parts[n + 1].split("\n\n\n" + RULE)[0].rstrip("\n") + "\n"
    raise KeyError(f"{relpath}: no section {title!r}")


def _values(line: str, versions: tuple[str, ...]) -> str:
    line = line.replace("Not Active", "Active")  # a clocks event reason's state, not a form
    for v in sorted(versions, key=len, reverse=True):
        line = line.replace(v, "<VERSION>")
    line = UUID.sub("<UUID>", line)
    line = BUS.sub("<BUS>", line)
    line = DATE.sub("<DATE>", line)
    line = STAMP.sub("<STAMP>", line)
    line = HEX.sub("<HEX>", line)
    return NUMBER.sub("#", line)


def table_shape(text: str, versions: tuple[str, ...] = ()) -> list[tuple]:
    """Per line of a table: its length, where its column separators are, and its tokens with
    readings replaced, each with its anchor column -- the end of a reading (nvidia-smi
    right-aligns numbers), the start of anything else -- so misplaced padding shows."""
    out = []
    for line in text.rstrip("\n").split("\n"):
        line = line.rstrip()
        # a date is several words: make it one token of the same width
        line = DATE.sub(lambda m: "<" + "_" * (len(m.group()) - 2) + ">", line)
        seps = tuple(i for i, ch in enumerate(line) if ch in "|+")
        tokens = []
        for m in re.finditer(r"\S+", line):
            tok = m.group()
            right = any(ch.isdigit() for ch in tok) and tok not in versions
            tokens.append((_values(tok, versions), m.end() if right else m.start()))
        out.append((len(line), seps, tuple(tokens)))
    return out


def q_shape(text: str, versions: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Per line of ``nvidia-smi -q``: the key exactly as printed (indentation included, padding
    to column 55 checked) and the value's shape: literal N/A forms, else readings as ``#`` with
    their units, hex as ``<HEX>``, other words as ``<WORD>``."""
    out = []
    for line in text.strip("\n").split("\n"):
        if len(line) > 56 and line[55:57] == ": " and line[:55].strip():
            key, value = line[:55].rstrip(), line[57:].strip()
            if value in LITERAL_VALUES or value.startswith("["):
                shape = value
            else:
                shape = " ".join(
                    t if t.startswith(("<", "#")) or t in UNITS else "<WORD>"
                    for t in _values(value, versions).split()
                )
            out.append((key, shape))
        else:
            out.append((_values(line.rstrip(), versions), ""))
    return out


UNITS = frozenset({"C", "W", "MiB", "MHz", "%", "KB/s", "bank(s)", "us", "#%", "#x"})


def csv_shape(value: str, versions: tuple[str, ...] = ()) -> str:
    """The shape of one --query-gpu value: N/A forms literally, readings as ``#`` + unit."""
    value = value.strip()
    if value.startswith("[") or value == "N/A":
        return value
    shape = _values(value, versions)
    if shape in ("Enabled", "Disabled", "Active", "Yes", "No"):  # states, not forms
        return "<STATE>"
    return shape


def csv_rows(text: str) -> list[list[str]]:
    return [line.split(", ") for line in text.strip("\n").split("\n")]


# --- a simulated host from the built packages --------------------------------------------------


def smi_packages(driver: str) -> tuple[str, ...]:
    return (f"libnvidia-ml1_{driver}", f"libcuda1_{driver}", f"nvidia-smi_{driver}",
            f"nvidia-kernel-open-dkms_{driver}")  # fmt: skip


def sim_host(root: Path, debs: list[Path], packages: tuple[str, ...], model: str, count: int,
             hostname: str = "gpu01", nvswitch: bool = False, mig=None) -> Path:  # fmt: skip
    unpack(pick(debs, *packages), root)
    prepare_root(root, hardware_for(model, count, hostname, nvswitch, mig))
    return root


def smi(root: Path, *args: str) -> str:
    res = run(root, ["/usr/bin/nvidia-smi", *args])
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def without_sim_note(text: str) -> str:
    """The simulator's output without the SIMULATED line it adds after the real layout."""
    lines = [
        ln for ln in text.rstrip("\n").split("\n") if "SIMULATED by the gpumon-deploy" not in ln
    ]
    return "\n".join(lines).rstrip("\n") + "\n"
