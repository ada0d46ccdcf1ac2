"""Reading the real captures the way the product's commands would have printed them.

The nvidia_gpu_exporter captures (``nvidia_gpu_exporter/*.txt``) hold many nvidia-smi runs in one
file, each a section headed by a ``# <phase> :: <name>`` line and the command (``# $ nvidia-smi
...``) between two rules of ``#``. ``section()`` returns one run's output unchanged.

Their ``--query-gpu`` runs ask for every field with ``--format=csv`` (header, units). The product
asks for a few fields with ``noheader`` and sometimes ``nounits``; ``query()`` selects those
columns by the header's field names and, for ``nounits``, drops the unit the header names for the
column (``memory.total [MiB]``: ``81559 MiB`` -> ``81559``), as the ``--format`` help in the same
captures describes ("nounits - don't print units for numerical values"). Nothing else changes:
``[N/A]``, ``N/A`` and every other value stay as nvidia-smi printed them.

Functions take a capture's text (so that stand-in programs can use them on a path given to them);
``capture_sections(relpath)`` reads one through ``tests.reality``.
"""

from __future__ import annotations

import re

_RULE = "#" * 80
_TITLE = re.compile(r"^# (?P<phase>[\w-]+) :: (?P<name>.+?)\s*$")
# --help-query-compute-apps in the captures: '"process_name" or "name"', '"used_gpu_memory" or
# "used_memory"'
_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}


def sections(text: str) -> dict[str, str]:
    """``{"<phase> :: <name>": output}`` of one nvidia_gpu_exporter capture."""
    lines = text.splitlines()
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = _TITLE.match(lines[i])
        if m and i > 0 and lines[i - 1] == _RULE:
            j = i + 1
            while j < len(lines) and lines[j] != _RULE:
                j += 1  # the command line(s) of the header
            k = j + 1
            while k < len(lines) and lines[k] != _RULE:
                k += 1
            body = lines[j + 1 : k]
            while body and not body[-1].strip():
                body.pop()
            out[f"{m['phase']} :: {m['name']}"] = "\n".join(body) + ("\n" if body else "")
            i = k
            continue
        i += 1
    return out


def section(text: str, name: str) -> str:
    """One run's output by ``"<phase> :: <name>"``; ``"idle :: query-gpu"`` matches the title
    ``idle :: query-gpu (csv, what the exporter parses)``."""
    every = sections(text)
    found = [v for k, v in every.items() if k == name or k.startswith(name + " (")]
    if len(found) != 1:
        raise KeyError(f"no single section {name!r} (sections: {sorted(every)})")
    return found[0]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split(", ")]


def query(text: str, run: str, fields: list[str], *, header: bool, units: bool) -> str:
    """What ``nvidia-smi --query-...=FIELDS --format=csv[,noheader][,nounits]`` printed in run
    ``run`` of a capture, for the ``fields`` asked. A field the capture did not ask for raises
    KeyError: the test then says the capture cannot answer the product's question."""
    rows = [ln for ln in section(text, run).splitlines() if ln.strip()]
    head = _cells(rows[0])
    names = [re.sub(r"\s*\[.*\]$", "", h) for h in head]
    cols = []
    for f in fields:
        want = f if f in names else _ALIASES.get(f, f)
        if want not in names:
            raise KeyError(f"the capture's {run} did not query {f}")
        cols.append(names.index(want))
    out = [", ".join(head[c] for c in cols)] if header else []
    for row in rows[1:]:
        values = _cells(row)
        picked = []
        for c in cols:
            v = values[c]
            unit = re.search(r"\[(.*)\]$", head[c])
            if not units and unit and v.endswith(" " + unit.group(1)):
                v = v[: -len(unit.group(1)) - 1]
            picked.append(v)
        out.append(", ".join(picked))
    return "\n".join(out) + ("\n" if out else "")


def help_fields(helptext: str) -> set[str]:
    """The field names (each name and its alias) that ``nvidia-smi --help-query-*`` lists."""
    names = re.findall(r'^"([^"]+)"(?: or "([^"]+)")?', helptext, re.M)
    return {n for pair in names for n in pair if n}


def capture_sections(relpath: str) -> dict[str, str]:
    from tests.reality import capture_text

    return sections(capture_text(relpath))


def proposed_capture(relpath: str):
    """A capture of ``tests.reality.PROPOSED`` by its future path (skips, naming its origin,
    while it is not in ../shared)."""
    from tests.reality import PROPOSED, capture

    assert relpath in PROPOSED, relpath
    return capture(relpath)
