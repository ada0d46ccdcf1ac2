"""deployer/gpu/dcgmi.py: the verdicts on dcgmi's output, where the contract rows
(tests/contract/test_validation.py) do not reach."""

from __future__ import annotations

from deployer.gpu import dcgmi

ROW = "| {:<25} | {:<56} |\n"


def tree(*rows: tuple[str, str]) -> str:
    return "".join(ROW.format(a, b) for a, b in rows)


def test_exit_statuses_are_named_by_their_dcgm_return_code():
    assert dcgmi.exit_status_name(226) == "DCGM_ST_NVVS_ERROR"  # -30
    assert dcgmi.exit_status_name(205) == "DCGM_ST_NVVS_ISOLATE_ERROR"  # -51
    assert dcgmi.exit_status_name(253) == "DCGM_ST_GENERIC_ERROR"  # -3
    assert dcgmi.exit_status_name(7) == "an unknown dcgmReturn_t"


def test_health_without_an_overall_line_cannot_be_judged_healthy():
    v = dcgmi.health_verdict("Health monitor systems set successfully.\n", 0)
    assert not v.ok and "no 'Overall Health'" in v.summary


def test_an_internal_error_is_not_healthy():
    assert not dcgmi.health_verdict(tree(("Overall Health", "Internal error")), 0).ok


def test_a_healthy_overall_with_an_unhealthy_system_is_not_healthy():
    text = tree(
        ("Overall Health", "Healthy"), ("GPU", ""), ("-> 0", "Warning"), ("   -> Errors", ""),
        ("      -> Thermal system", "Warning"), ("", "too hot"),
    )  # fmt: skip
    v = dcgmi.health_verdict(text, 0)
    assert not v.ok and v.problems == ("GPU 0 Thermal system: Warning (too hot)",)


def test_health_json_that_does_not_parse_is_a_failure():
    v = dcgmi.health_verdict("{ not json", 0)
    assert not v.ok and "no JSON" in v.summary


def test_nvswitch_incidents_are_named_by_their_entity_group():
    text = tree(
        ("Overall Health", "Failure"), ("Switch", ""), ("-> 2", "Failure"), ("   -> Errors", ""),
        ("      -> NVLINK system", "Failure"), ("", "link 3 down"),
    )  # fmt: skip
    assert dcgmi.health_verdict(text, 0).problems == (
        "Switch 2 NVLINK system: Failure (link 3 down)",
    )


DIAG = (
    "Successfully ran diagnostic for group.\n"
    "+---------------------------+------------------------------------------------+\n"
    "| Diagnostic                | Result                                         |\n"
    "+===========================+================================================+\n"
    "| DCGM Version              | 4.6.0                                          |\n"
    "|-----  Deployment  --------+------------------------------------------------|\n"
    "| software                  | {sw:<46} |\n"
    "|                           | GPU0: Pass                                     |\n"
    "+-----  Stress  ------------+------------------------------------------------+\n"
    "| Diagnostic                | {dg:<46} |\n"
    "+---------------------------+------------------------------------------------+\n"
)


def test_a_warned_test_with_exit_status_0_passes_naming_the_warning():
    v = dcgmi.diag_verdict(DIAG.format(sw="Warn", dg="Pass"), 0)
    assert v.ok and v.summary == "2 tests passed (software warned)"


def test_the_dcgm_3_test_named_diagnostic_is_a_test_not_the_header():
    v = dcgmi.diag_verdict(DIAG.format(sw="Pass", dg="Fail - GPU 0"), 226)
    assert not v.ok and v.problems == ("Diagnostic",)


def test_a_diag_that_prints_no_results_is_a_failure_even_with_exit_status_0():
    v = dcgmi.diag_verdict("Successfully ran diagnostic for group.\n", 0)
    assert not v.ok and "no test results" in v.summary


def test_the_verdict_reads_as_one_line():
    v = dcgmi.Verdict(False, "Overall Health: Failure", ("a", "b"))
    assert str(v) == "Overall Health: Failure; a; b"


def test_a_report_with_a_non_zero_exit_status_is_judged_by_the_report():
    # dcgmi exits 0 with a report (Health.cpp:391); an exit status beside a report is read as
    # what the report says, and a Healthy one as a failure for the status
    failure = tree(("Overall Health", "Failure"))
    assert dcgmi.health_verdict(failure, 1).summary == "Overall Health: Failure"
    v = dcgmi.health_verdict(tree(("Overall Health", "Healthy")), 1)
    assert not v.ok and "exited 1" in v.summary
