"""What ``dcgmi health -c`` and ``dcgmi diag -r N`` print, judged as real dcgmi prints it.

Pure: text and exit status in, a ``Verdict`` out. The rollout's validation (and anything else that
gates on DCGM) reads these, never the exit status alone.

``dcgmi health -c`` exits 0 on an unhealthy GPU: ``Health::CheckWatches`` prints the report and
returns ``DCGM_ST_OK`` whatever the health (NVIDIA/DCGM ``dcgmi/Health.cpp:391`` at v4.6.0,
51b65ccebf9d61e6593713a7d6b68e594d9d7975; same at v3.3.9), and ``main`` returns the command's
``dcgmReturn_t`` as the exit status (``dcgmi/main_dcgmi.cpp:83``). It exits non-zero only when it
cannot check (``DCGM_ST_GENERIC_ERROR``, -3, exit 253: "Error: Unable to check health watches" or
"Error: Health watches not enabled", ``Health.cpp:360-386``). The report is a
``DcgmiOutputTree(28, 60)`` (``Health.cpp:356``; rows ``"| " + left(25) + " | " + right(56) +
" |"``, ``dcgmi/DcgmiOutput.cpp:350-375``) or, with ``-j``, its JSON (``{"header": [...], "body":
{"Overall Health": {"value": ...}, "GPU": {"children": {"0": {"value": ..., "children":
{"Errors": {"children": {"<system>": {"value": ..., "overflow": [msg, ...]}}}}}}}}}``, the boxer's
``children``/``value``/``overflow`` keys, ``DcgmiOutput.cpp:79``, ``DcgmiOutput.h:271-279``)::

    | Overall Health            | Failure                                                  |
    | GPU                       |                                                          |
    | -> 0                      | Warning                                                  |
    |    -> Errors              |                                                          |
    |       -> Memory system    | Warning                                                  |
    |                           | <the incident's message, wrapped>                        |

(``Health::HandleOneEntity`` and ``GenerateOutputFromResponse``, ``Health.cpp:279-347``; the strings NVIDIA's own test expects, ``dcgmi/tests/HealthTests.cpp:
224-234``). Health is ``Healthy``, ``Warning``, ``Failure`` or ``Internal error``
(``Health::HelperHealthToString``, ``Health.cpp:395-405``).

``dcgmi diag`` does exit non-zero when a test fails: ``Diag::GetFailureResult`` returns
``DCGM_ST_NVVS_ERROR`` (-30, exit 226) for an error on a GPU or in the software tests, and
``DCGM_ST_NVVS_ISOLATE_ERROR`` (-51, exit 205) for one that needs the GPU isolated
(``dcgmi/Diag.cpp:248-329`` at v4.6.0; ``:347-384`` at v3.3.9), and a diagnostic that cannot run
prints ``Error: ...`` and returns its error (``Diag.cpp:368-518``). Its table prints each test's
result ``Pass``/``Skip``/``Warn``/``Fail``/``Not Run`` and, from DCGM 4, one row per entity
(``GPU0: Fail``), a warning on an entity as ``Fail`` (``Diag.cpp:845-866``, ``973-1048``); error
messages in rows named ``Warning``/``Warning: GPU0`` (4.x) or ``Error`` (3.x real output, e.g.
``| Persistence Mode | Fail |`` then ``| Error | Persistence mode for GPU 0 is ...``). The verdict
fails on a non-zero exit status *and* on any ``Fail`` the table prints, and names the failed tests
and their messages.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field

# dcgmReturn_t (NVIDIA/DCGM dcgmlib/dcgm_structs.h:345-410 at v4.6.0) by the exit status it gives
# (main returns it; the shell sees it modulo 256).
_RETURNS = {
    -1: "DCGM_ST_BADPARAM",
    -3: "DCGM_ST_GENERIC_ERROR",
    -5: "DCGM_ST_NOT_CONFIGURED",
    -7: "DCGM_ST_INIT_ERROR",
    -8: "DCGM_ST_NVML_ERROR",
    -11: "DCGM_ST_TIMEOUT",
    -12: "DCGM_ST_VER_MISMATCH",
    -14: "DCGM_ST_NO_DATA",
    -17: "DCGM_ST_NO_PERMISSION",
    -18: "DCGM_ST_GPU_IS_LOST",
    -19: "DCGM_ST_RESET_REQUIRED",
    -21: "DCGM_ST_CONNECTION_NOT_VALID",
    -29: "DCGM_ST_REQUIRES_ROOT",
    -30: "DCGM_ST_NVVS_ERROR",
    -39: "DCGM_ST_DIAG_ALREADY_RUNNING",
    -41: "DCGM_ST_DIAG_BAD_LAUNCH",
    -51: "DCGM_ST_NVVS_ISOLATE_ERROR",
    -52: "DCGM_ST_NVVS_BINARY_NOT_FOUND",
    -53: "DCGM_ST_NVVS_KILLED",
    -54: "DCGM_ST_PAUSED",
    -58: "DCGM_ST_NVVS_NO_AVAILABLE_TEST",
}
EXIT_STATUS_NAMES = {code & 0xFF: name for code, name in _RETURNS.items()}

HEALTHY = "Healthy"
HEALTH_VALUES = ("Healthy", "Warning", "Failure", "Internal error")

# "| left | right |" of a DcgmiOutputTree / CommandOutputController table row
_ROW = re.compile(r"^\|(?P<left>[^|]*)\|(?P<right>.*)\|\s*$")
_ENTITY_RESULT = re.compile(
    r"^(?P<entity>[A-Za-z_]+ ?\d+): (?P<result>Pass|Skip|Warn|Fail|Not Run)\b"
)
_RESULTS = ("Pass", "Skip", "Warn", "Fail", "Not Run")
_METADATA = {
    "DCGM Version",
    "Driver Version Detected",
    "Number of CPUs Detected",
    "EUD Test Version",
    "EUD Package Version",
    "CPU EUD Test Version",
    "CPU EUD Package Version",
}


@dataclass(frozen=True)
class Verdict:
    """``ok`` when the output shows nothing wrong; ``summary`` says what it shows in one line;
    ``problems`` name each incident or failed test (with its message when dcgmi printed one)."""

    ok: bool
    summary: str
    problems: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return self.summary + ("".join(f"; {p}" for p in self.problems) if self.problems else "")


def exit_status_name(rc: int) -> str:
    return EXIT_STATUS_NAMES.get(rc & 0xFF, "an unknown dcgmReturn_t")


def _first_lines(text: str, n: int = 2) -> str:
    return " ".join(x.strip() for x in text.strip().splitlines()[:n]) or "no output"


def _rows(text: str) -> list[tuple[str, str]]:
    """(left, right) of every two-cell table row: each cell without the one space after its bar
    and without trailing blanks, so left keeps its indent (the tree's depth) and right a space
    that began a wrapped piece. Rules (``+---+``, ``|-----  Metadata  ---+---|``) and one-cell
    headers have fewer bars."""
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line.rstrip())
        if m is None:
            continue
        left, right = (c[1:] if c.startswith(" ") else c for c in (m["left"], m["right"]))
        rows.append((left.rstrip(), right.rstrip()))
    return rows


# --- dcgmi health -c ------------------------------------------------------------------------


@dataclass
class _Incident:
    where: str  # "GPU 0"
    system: str  # "Memory system"
    health: str
    message: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        msg = " ".join(self.message).strip()
        return f"{self.where} {self.system}: {self.health}" + (f" ({msg})" if msg else "")


def _health_text(text: str) -> tuple[str | None, list[_Incident], list[str]]:
    """(overall, incidents, entity lines) of the tree text."""
    overall, incidents, entities = None, [], []
    group = entity = None
    current: _Incident | None = None
    for left, raw in _rows(text):
        label, right = left.strip(), raw.strip()
        if not label:
            if current is not None and right:
                current.message.append(right)
            continue
        depth = 0 if not label.startswith("->") else (len(left) - len(left.lstrip())) // 3 + 1
        name = label.removeprefix("->").strip()
        current = None
        if depth == 0:
            if name == "Overall Health":
                overall = right
            else:
                group = name
        elif depth == 1:
            entity = f"{group or 'entity'} {name}"
            entities.append(f"{entity}: {right}")
        elif depth >= 3 and right:
            current = _Incident(entity or "?", name, right)
            incidents.append(current)
    return overall, incidents, entities


def _health_json(data: dict) -> tuple[str | None, list[_Incident], list[str]]:
    body = data.get("body") or {}
    overall = (body.get("Overall Health") or {}).get("value")
    incidents, entities = [], []
    for group, section in body.items():
        if group == "Overall Health" or not isinstance(section, dict):
            continue
        for eid, ent in (section.get("children") or {}).items():
            where = f"{group} {eid}"
            entities.append(f"{where}: {ent.get('value', '')}")
            for box in (ent.get("children") or {}).values():
                for system, sysbox in (box.get("children") or {}).items():
                    msg = [str(m).strip() for m in sysbox.get("overflow") or []]
                    incidents.append(_Incident(where, system, sysbox.get("value", ""), msg))
    return overall, incidents, entities


def health_verdict(output: str, rc: int) -> Verdict:
    """Judge ``dcgmi health -c`` (text, or JSON with ``-j``) by what it prints; a non-zero exit
    status with no report is a check that could not run."""
    stripped = output.strip()
    overall: str | None = None
    incidents: list[_Incident] = []
    if stripped.startswith("{"):
        try:
            overall, incidents, _ = _health_json(json.loads(stripped))
        except ValueError:
            if rc == 0:
                return Verdict(False, f"dcgmi health -c -j printed no JSON: {_first_lines(output)}")
    else:
        overall, incidents, _ = _health_text(output)
    if overall is None:
        if rc != 0:
            return Verdict(
                False, f"dcgmi health -c could not check (exit {rc}, {exit_status_name(rc)}): "
                f"{_first_lines(output)}",
            )  # fmt: skip
        return Verdict(False, f"no 'Overall Health' in dcgmi health -c: {_first_lines(output)}")
    problems = tuple(str(i) for i in incidents if i.health != HEALTHY)
    if overall == HEALTHY and not problems:
        if rc != 0:
            return Verdict(False, f"Overall Health: Healthy, but dcgmi health -c exited {rc}")
        return Verdict(True, "Overall Health: Healthy")
    return Verdict(False, f"Overall Health: {overall}", problems)


# --- dcgmi diag -r N ------------------------------------------------------------------------


def _join_wrapped(pieces: list[str]) -> str:
    """A message dcgmi cut into 45-character pieces (``Diag::DisplayVerboseInfo``,
    ``Diag.cpp:84``, ``895-916``): a full piece continues mid-word, a shorter one ended a line."""
    out = pieces[0] if pieces else ""
    for prev, piece in itertools.pairwise(pieces):
        # a full piece goes on mid-word; a shorter one lost its trailing blank to the padding
        out += piece if len(prev) >= 45 or piece.startswith(" ") else " " + piece
    return " ".join(out.split())


def diag_verdict(output: str, rc: int) -> Verdict:
    """Judge ``dcgmi diag -r N`` by its exit status and by every result its table prints."""
    failed: list[tuple[str, str]] = []  # (test, entity or "")
    warned: list[str] = []
    messages: dict[str, list[list[str]]] = {}  # test -> its messages, each in pieces
    test: str | None = None
    pieces: list[str] | None = None  # the message being read
    results = 0
    for left, raw in _rows(output):
        label, right = left.strip(), raw.strip()
        if (
            (label, right) == ("Diagnostic", "Result")
            or label in _METADATA
            or label.endswith("Device IDs Detected")
        ):
            test, pieces = None, None
        elif label == "Error" or label.startswith("Warning"):
            pieces = [raw]
            messages.setdefault(test or "dcgmi diag", []).append(pieces)
        elif label:
            test, pieces = label, None
            result = next((r for r in _RESULTS if right.startswith(r)), None)
            if result is not None:
                results += 1
                if result == "Fail":
                    failed.append((label, ""))
                elif result == "Warn":
                    warned.append(label)
        elif (entity := _ENTITY_RESULT.match(right)) and test is not None:
            pieces = None
            if entity["result"] == "Fail":
                failed = [f for f in failed if f != (test, "")] + [(test, entity["entity"])]
        elif pieces is not None and right:
            pieces.append(raw)

    def named(t: str, entity: str) -> str:
        msgs = "; ".join(_join_wrapped(m) for m in messages.get(t, []))
        return f"{t}{f' ({entity})' if entity else ''}" + (f": {msgs}" if msgs else "")

    problems = tuple(named(t, e) for t, e in failed)
    if rc != 0:
        why = f"exit {rc}, {exit_status_name(rc)}"
        if problems:
            return Verdict(False, f"dcgmi diag failed ({why})", problems)
        return Verdict(False, f"dcgmi diag failed ({why}): {_first_lines(output)}")
    if problems:
        return Verdict(False, "dcgmi diag reports failed tests", problems)
    if results == 0:
        return Verdict(False, f"no test results in dcgmi diag: {_first_lines(output)}")
    note = f" ({', '.join(warned)} warned)" if warned else ""
    return Verdict(True, f"{results} tests passed{note}")
