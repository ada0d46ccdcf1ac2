"""The benchmark's pure logic: what each tool's output says it changed, medians, ratios, order."""

from __future__ import annotations

import json

from bench.measure import (
    Sample,
    ansible_changed,
    gpumon_changed,
    gpumon_failures,
    pyinfra_changed,
    ratio,
    rotated,
    summarise,
)

ANSIBLE_RECAP = """
PLAY RECAP *********************************************************************
mon01                      : ok=10   changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
prom01                     : ok=10   changed=2    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
"""

PYINFRA_RESULTS = """
--> Results:
    Operation                            Hosts   Success   Error   No Change
    node_exporter apt source             3       3         -       -
    node_exporter package                3       -         -       3
    Grand total                          6       3         -       3

--> Disconnecting from hosts...
"""


def test_ansible_changed_sums_the_recap():
    assert ansible_changed(ANSIBLE_RECAP) == 2


def test_ansible_run_with_a_failed_host_counts_as_unknown():
    assert ansible_changed(ANSIBLE_RECAP.replace("failed=0", "failed=1", 1)) is None


def test_ansible_output_without_recap_is_unknown():
    assert ansible_changed("ERROR! the playbook could not be found") is None


def test_pyinfra_changed_is_the_grand_total_success_column():
    assert pyinfra_changed(PYINFRA_RESULTS) == 3


def test_pyinfra_no_change_run_counts_zero():
    text = PYINFRA_RESULTS.replace(
        "Grand total                          6       3",
        "Grand total                          6       -",
    )
    assert pyinfra_changed(text) == 0


def test_pyinfra_errors_make_the_count_unknown():
    text = PYINFRA_RESULTS.replace("6       3         -       3", "6       3         1       2")
    assert pyinfra_changed(text) is None


def _gpumon_report(changed: list[bool], failed: bool = False) -> str:
    return json.dumps(
        {
            "hosts": {
                "h1": {
                    "failed": failed,
                    "unreachable": None,
                    "tasks": [{"changed": c} for c in changed],
                }
            }
        },
        indent=2,
    )


def test_gpumon_changed_counts_changed_tasks_after_console_output():
    text = "recap\n{ not json\n" + _gpumon_report([True, False, True]) + "\nstderr tail"
    assert gpumon_changed(text) == 2


def test_gpumon_failed_host_makes_the_count_unknown():
    assert gpumon_changed(_gpumon_report([False], failed=True)) is None


def test_gpumon_failures_name_failed_and_unreachable_hosts_with_their_errors():
    report = {
        "hosts": {
            "h1": {"failed": False, "unreachable": None, "tasks": []},
            "h2": {
                "failed": True,
                "unreachable": None,
                "tasks": [{"task": "config", "status": "failed", "error": "rc=1: disk full"}],
            },
            "h3": {"failed": False, "unreachable": "cannot reach 10.0.0.3:22: timed out"},
        }
    }
    text = "recap table\n" + json.dumps(report, indent=2)
    assert gpumon_failures(text).splitlines() == [
        "h2: config: rc=1: disk full",
        "h3: unreachable: cannot reach 10.0.0.3:22: timed out",
    ]
    assert gpumon_failures(text, limit=1).splitlines()[-1] == "... and 1 more hosts"
    assert gpumon_failures("no report at all") == ""


def _sample(tool: str, wall: float, rc: int = 0) -> Sample:
    return Sample(tool, "noop", wall, 0.1, 50.0, rc, 0)


def test_summary_is_the_median_of_successful_runs():
    samples = [_sample("g", w) for w in (3.0, 1.0, 2.0)] + [_sample("g", 0.01, rc=1)]
    (summary,) = summarise(samples)
    assert (summary.runs, summary.wall_s) == (3, 2.0)


def test_summaries_keep_first_seen_tool_order():
    samples = [_sample("b", 1.0), _sample("a", 1.0), _sample("b", 1.0)]
    assert [s.tool for s in summarise(samples)] == ["b", "a"]


def test_ratio_is_none_without_both_values():
    assert ratio(None, 1.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(10.0, 2.0) == 5.0


def test_rotation_puts_each_tool_first_in_turn():
    tools = ["g", "a", "p"]
    assert [rotated(tools, n)[0] for n in range(4)] == ["g", "a", "p", "g"]


def test_write_result_writes_json_where_asked_and_says_where(tmp_path, capsys):
    from bench.measure import write_result

    path = write_result({"benchmark": "x", "n": 1}, "x", str(tmp_path / "sub" / "r.json"))
    assert json.loads(path.read_text()) == {"benchmark": "x", "n": 1}
    assert capsys.readouterr().out == f"written {path}\n"


def test_a_failed_ansible_run_is_noted_by_its_fatal_lines_not_its_warnings():
    from bench.measure import Outcome
    from bench.tools import _tail

    got = Outcome(
        rc=4,
        wall_s=1.0,
        cpu_s=0.1,
        peak_rss_mib=60.0,
        stdout='PLAY [x]\nfatal: [h1]: UNREACHABLE! => {"msg": "timed out"}\nPLAY RECAP\n',
        stderr="[DEPRECATION WARNING]: strategy plugins\n",
    )
    assert _tail(got) == 'fatal: [h1]: UNREACHABLE! => {"msg": "timed out"}'
