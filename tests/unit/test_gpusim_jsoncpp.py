"""The simulated dcgmi prints its JSON as jsoncpp's ``toStyledString`` does, byte for byte: the
values of tests/fixtures/jsoncpp/styled.cpp, printed by real jsoncpp into styled.out (its
README says how), printed again by ``jsoncpp_styled``."""

from __future__ import annotations

from pathlib import Path

from deployer.lab.gpusim.standins.common import jsoncpp_styled

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "jsoncpp" / "styled.out"

# the values styled.cpp builds, in the same order
HEALTH = {
    "header": ["Health Monitor Report"],
    "body": {
        "Overall Health": {"value": "Failure"},
        "GPU": {"children": {"2": {
            "children": {"Errors": {"children": {"Memory system": {
                "value": "Failure",
                "overflow": [
                    "Detected 2 volatile double-bit ECC error(s) in GPU 2.",
                    'second piece, with "quotes", a/slash, a tab\tand café',
                ],
            }}}},
            "value": "Failure",
        }}},
    },
}  # fmt: skip
RESULT = {
    "entity_group_id": 1, "entity_group": "GPU", "entity_id": 2, "status": "Fail",
    "warnings": [{"warning": "Detected 1 volatile double-bit ECC error(s) in GPU 2.",
                  "error_id": 4, "error_category": 10, "error_severity": 2}],
}  # fmt: skip
DIAG = {
    "DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [RESULT], "test_summary": {"status": "Fail"}},
    ]}]},
    "metadata": {"version": "4.4.2"},
    "empty_object": {},
    "empty_array": [],
    "numbers": [0, -21],
    "flag": True,
}  # fmt: skip


def test_the_writer_prints_what_real_jsoncpp_printed():
    assert jsoncpp_styled(HEALTH) + jsoncpp_styled(DIAG) == CAPTURE.read_text()


def test_the_capture_opens_a_nested_value_on_its_own_line_after_a_trailing_space():
    lines = CAPTURE.read_text().splitlines()
    assert lines[:3] == ["{", '\t"body" : ', "\t{"]
