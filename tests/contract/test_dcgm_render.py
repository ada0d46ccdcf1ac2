"""The port of dcgmi's printing code (tests/contract/dcgm_render.py) against NVIDIA's own
expectations, so that the verdict rows fed by it read what real dcgmi prints."""

from __future__ import annotations

import json

from tests.contract import dcgm_render as r
from tests.contract.captures import proposed_capture

# NVIDIA/DCGM dcgmi/tests/HealthTests.cpp:207-234 at v4.6.0: three incidents, and the lines the
# output must contain
SCENARIO = [
    r.Incident(0, "Memory system", "Warning",
               "The car is red? Are you sure because that doesn't seem like the color I ordered."),
    r.Incident(1, "Memory system", "Failure", "Green can be emerald and beautiful, but there are "
               "shades of green which are sure to disappoint."),
    r.Incident(1, "SM system", "Warning",
               "The guards wear Kholin blue because otherwise they'd be lame."),
]  # fmt: skip
EXPECTED = [
    "| Overall Health            | Failure",
    "| -> 0                      | Warning",
    "| The car is red? Are you sure because that doesn't seem   |",
    " | like the color I ordered.                                |",
    "| -> 1                      | Failure",
    "|       -> Memory system    | Failure",
    "| Green can be emerald and beautiful, but there are        |",
    "| shades of green which are sure to disappoint.            |",
    "|       -> SM system        | Warning",
    "| The guards wear Kholin blue because otherwise they'd be  |",
    "| lame.                                                    |",
]


def test_the_health_tree_has_every_line_nvidia_s_own_test_expects():
    text = r.health_tree(SCENARIO)
    missing = [line for line in EXPECTED if line not in text]
    assert missing == [], text


def test_a_healthy_report_has_only_the_overall_line():
    rows = [ln for ln in r.health_tree([]).splitlines() if ln.startswith("| ")]
    assert rows == [
        f"| {'Health Monitor Report':<85}|",
        f"| {'Overall Health':<25} | {'Healthy':<56} |",
    ]


def test_the_health_json_nests_entities_errors_and_systems():
    body = json.loads(r.health_json(SCENARIO))["body"]
    assert body["Overall Health"] == {"value": "Failure"}
    gpu1 = body["GPU"]["children"]["1"]
    assert gpu1["value"] == "Failure"
    assert gpu1["children"]["Errors"]["children"]["SM system"]["value"] == "Warning"


def test_the_diag_table_is_the_real_dcgm_4_4_2_output_of_the_same_run():
    real = proposed_capture("dcgmi/diag-r2__dcgm-4.4.2__a10g.txt").read_text()
    tests = [
        r.Test("software", "Deployment", "Pass", (r.EntityResult("GPU0", "Pass"),)),
        r.Test("memory", "Hardware", "Pass", (r.EntityResult("GPU0", "Pass"),)),
        r.Test("pcie", "Integration", "Pass", (r.EntityResult("GPU0", "Pass"),)),
    ]
    assert r.diag_table("4.4.2", "580.105.08", ["2237"], tests) == real
