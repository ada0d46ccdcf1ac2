"""dcgmi's text as NVIDIA/DCGM's own source prints it, for the outputs that no real capture in
../shared shows yet (``dcgmi health -c`` on an unhealthy GPU, ``dcgmi diag`` with a failed test on
DCGM 4). A port of the printing code, at v4.6.0 (51b65ccebf9d61e6593713a7d6b68e594d9d7975):

- health: ``Health::GenerateOutputFromResponse``, ``HandleOneEntity``, ``AppendSystemIncidents``,
  ``AddErrorMessage`` (``dcgmi/Health.cpp:186-347``) into a ``DcgmiOutputTree(28, 60)``
  (``Health.cpp:356``; ``DcgmiOutputTree::str``, ``levelStr``, ``rowStr``,
  ``dcgmi/DcgmiOutput.cpp:265-375``), or its JSON with ``-j`` (the boxer's ``value``,
  ``children``, ``overflow``, ``DcgmiOutput.cpp:79,206,222``, ``DcgmiOutput.h:266-280``);
- diag: ``Diag::HelperDisplayAsCli`` and the helpers it calls (``dcgmi/Diag.cpp:58-84,
  661-1048``): the ``DIAG_DATA`` stencil ``| <name:25> | <info:46> |``.

tests/contract/test_dcgm_render.py holds the port to NVIDIA's own test expectations
(``dcgmi/tests/HealthTests.cpp:224-234``) and, when it is in ../shared, to the real diag capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deployer.lab.gpusim.standins.common import jsoncpp_styled

# dcgmHealthWatchResults_t (dcgmlib/dcgm_structs.h): PASS 0, WARN 10, FAIL 20
_HEALTH_RANK = {"Healthy": 0, "Warning": 10, "Failure": 20}
_MAX_SIZE_OF_HEALTH_INFO = 54  # Health.cpp:60


@dataclass(frozen=True)
class Incident:
    entity: int
    system: str  # as Health::HelperSystemToString names it: "Memory system", "PCIe system", ...
    health: str  # Warning | Failure
    message: str
    group: str = "GPU"  # DcgmFieldsGetEntityGroupString


class _Box:
    def __init__(self) -> None:
        self.value: str | None = None
        self.overflow: list[str] = []
        self.children: dict[str, _Box] = {}

    def child(self, name: str) -> _Box:
        return self.children.setdefault(name, _Box())

    def to_json(self) -> dict:
        out: dict = {}
        if self.children:
            out["children"] = {k: v.to_json() for k, v in self.children.items()}
        if self.overflow:
            out["overflow"] = list(self.overflow)
        if self.value is not None:
            out["value"] = self.value
        return out


def _split_message(msg: str) -> list[str]:
    """Health::AddErrorMessage: pieces of at most 54 characters, cut at the last word."""
    msg = msg.replace("\n", " ")
    if len(msg) <= _MAX_SIZE_OF_HEALTH_INFO:
        return [msg]
    out, p, start = [], 0, 0
    while start < len(msg):
        p += _MAX_SIZE_OF_HEALTH_INFO
        if p >= len(msg):
            p = len(msg) - 1
        elif p != len(msg) - 1:
            while msg[p] != " ":
                if msg[p + 1] in " .,/":
                    break
                p -= 1
            while msg[p] == " ":
                p -= 1
        while start < len(msg) and msg[start] == " ":
            start += 1
        if start >= len(msg):
            break
        out.append(msg[start : p + 1])
        start = p + 2
    return out


def _report(incidents: list[Incident]) -> tuple[str, dict[str, _Box]]:
    sections: dict[str, _Box] = {"Overall Health": _Box()}
    overall = "Healthy"
    i = 0
    while i < len(incidents):
        first = incidents[i]
        entity_box = sections.setdefault(first.group, _Box()).child(str(first.entity))
        errors = entity_box.child("Errors")
        entity_health = first.health
        while i < len(incidents) and (incidents[i].group, incidents[i].entity) == (
            first.group,
            first.entity,
        ):
            system, health, msgs = incidents[i].system, incidents[i].health, [incidents[i].message]
            i += 1
            while i < len(incidents) and (incidents[i].group, incidents[i].entity) == (
                first.group,
                first.entity,
            ) and incidents[i].system == system:  # fmt: skip
                msgs.append(incidents[i].message)
                health = max(health, incidents[i].health, key=_HEALTH_RANK.__getitem__)
                i += 1
            entity_health = max(entity_health, health, key=_HEALTH_RANK.__getitem__)
            box = errors.child(system)
            box.value = health
            box.overflow.extend(_split_message(", ".join(msgs)))
        entity_box.value = entity_health
        overall = max(overall, entity_health, key=_HEALTH_RANK.__getitem__)
    sections["Overall Health"].value = overall
    return overall, sections


def _row(level: int, prefix: str, label: str, value: str) -> str:
    left = " " * max(level * 3 - len(prefix), 0) + prefix + label
    return f"| {left:<25} | {value:<56} |\n"


def _level(level: int, label: str, box: _Box) -> str:
    out = _row(level, "-> " if level else "", label, box.value or "")
    for piece in box.overflow:
        out += _row(level, "", "", piece)
    for name, child in box.children.items():
        out += _level(level + 1, name, child)
    return out


def health_tree(incidents: list[Incident]) -> str:
    """``dcgmi health -c`` as DCGM 3.x/4.x prints it for these incidents (none: healthy)."""
    _, sections = _report(incidents)
    hline = "+" + "-" * 27 + "+" + "-" * 58 + "+\n"
    out = hline + f"| {'Health Monitor Report':<85}|\n" + "+" + "=" * 27 + "+" + "=" * 58 + "+\n"
    for name, box in sections.items():
        out += _level(0, name, box)
    return out + hline


def health_json(incidents: list[Incident]) -> str:
    """``dcgmi health -c -j``: the boxes as JSON, printed by jsoncpp's ``toStyledString``
    (``jsoncpp_styled``, held to real jsoncpp's output by tests/unit/test_gpusim_jsoncpp.py)."""
    _, sections = _report(incidents)
    data = {"body": {k: v.to_json() for k, v in sections.items()},
            "header": ["Health Monitor Report"]}  # fmt: skip
    return jsoncpp_styled(data)


# --- diag ---------------------------------------------------------------------------------

_DIAG_HEADER = (
    "+---------------------------+------------------------------------------------+\n"
    "| Diagnostic                | Result                                         |\n"
    "+===========================+================================================+\n"
)
_DIAG_INFO = "|-----  Metadata  ----------+------------------------------------------------|\n"
_DIAG_FOOTER = "+---------------------------+------------------------------------------------+\n"
CATEGORIES = {
    "Deployment": "|-----  Deployment  --------+------------------------------------------------|\n",
    "Hardware": "+-----  Hardware  ----------+------------------------------------------------+\n",
    "Integration": "+-----  Integration  -------+------------------------------------------------+\n",
    "Stress": "+-----  Stress  ------------+------------------------------------------------+\n",
}


@dataclass(frozen=True)
class EntityResult:
    entity: str  # "GPU0"
    result: str  # Pass | Skip | Fail | Not Run (a warning shows as Fail, Diag.cpp:854-859)
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Test:
    name: str  # the plugin's test name: "software", "memory", "pcie", "diagnostic", ...
    category: str  # Deployment | Hardware | Integration | Stress
    result: str  # Pass | Skip | Warn | Fail | Not Run
    entities: tuple[EntityResult, ...] = field(default=())


def _data(name: str, info: str) -> str:
    return f"| {name:<25} | {info:<46} |\n"


def _verbose(name: str, msg: str) -> str:
    """Diag::DisplayVerboseInfo: the message in 45-character pieces, the name on the first."""
    msg = msg.strip()
    return "".join(_data(name if i == 0 else "", msg[i : i + 45]) for i in range(0, len(msg), 45))


def diag_table(dcgm: str, driver: str, device_ids: list[str], tests: list[Test]) -> str:
    """``dcgmi diag -r N`` as DCGM 4.x prints it (Diag::HelperDisplayAsCli)."""
    out = "Successfully ran diagnostic for group.\n" + _DIAG_HEADER + _DIAG_INFO
    out += _data("DCGM Version", dcgm) + _data("Driver Version Detected", driver)
    out += _data("GPU Device IDs Detected", ", ".join(device_ids))
    for category, heading in CATEGORIES.items():
        chosen = [t for t in tests if t.category == category]
        if chosen:
            out += heading
        for t in chosen:
            out += _data(t.name, t.result)
            for e in t.entities:
                out += _data("", f"{e.entity}: {e.result}")
                for err in e.errors:
                    out += _verbose(f"Warning: {e.entity}", err)
    return out + _DIAG_FOOTER
