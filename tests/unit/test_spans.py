"""Time spans for the benches: nothing recorded (one shared no-op) unless switched on."""

from __future__ import annotations

import json

from deployer import spans


def test_spans_off_by_default_are_one_shared_no_op():
    spans.stop()
    assert spans.span("remote", "h1") is spans.OFF
    fn = lambda: 1  # noqa: E731
    assert spans.timed("http", fn) is fn
    assert spans.recorded() == []


def test_spans_on_record_kind_host_and_times_and_write_json_lines(tmp_path):
    spans.stop()
    spans.start(str(tmp_path / "never-written-by-this-test"))
    try:
        with spans.span("remote", "h1"):
            pass
        spans.timed("http", lambda: None)()
        got = spans.recorded()
        out = tmp_path / "spans.jsonl"
        spans.write(str(out))
    finally:
        spans.stop()
    assert [(g["kind"], g["host"]) for g in got] == [("remote", "h1"), ("http", "")]
    assert all(g["end"] >= g["start"] for g in got)
    assert [json.loads(line)["kind"] for line in out.read_text().splitlines()] == ["remote", "http"]
