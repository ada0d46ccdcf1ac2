"""Alertmanager silences (API v2): the payload, which peer gets it, finding the run's own
silence again on resume, and expiring (an already expired silence is fine)."""

from __future__ import annotations

import json

import pytest

from deployer.monitoring.http import Response
from deployer.monitoring.silences import (
    SilenceError,
    Silences,
    host_matchers,
    rfc3339,
    silence_payload,
)


class FakeAM:
    """Peers by URL: ``down`` ones refuse connections; silences kept in one dict (gossip)."""

    def __init__(self, down: tuple[str, ...] = ()) -> None:
        self.down = set(down)
        self.silences: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []

    def __call__(self, method: str, url: str, body: bytes | None) -> Response:
        self.calls.append((method, url))
        peer = url.split("/api/")[0]
        if peer in self.down:
            return Response(0, error="connection refused")
        if method == "POST":
            sid = f"s{len(self.silences) + 1}"
            self.silences[sid] = {**json.loads(body), "id": sid, "status": {"state": "active"}}
            return Response(200, json.dumps({"silenceID": sid}))
        if method == "GET" and url.endswith("/api/v2/silences"):
            return Response(200, json.dumps(list(self.silences.values())))
        sid = url.rsplit("/", 1)[1]
        if sid not in self.silences:
            return Response(404, "not found")
        if method == "GET":
            return Response(200, json.dumps(self.silences[sid]))
        if self.silences[sid]["status"]["state"] == "expired":
            return Response(500, "silence already expired")
        self.silences[sid]["status"]["state"] = "expired"
        return Response(200, "")


PEERS = ["http://am1:9093", "http://am2:9093", "http://am3:9093"]


def test_a_host_is_silenced_by_node_and_by_instance():
    node, instance = host_matchers("gpu01", "10.0.0.11")
    assert node == [{"name": "node", "value": "gpu01", "isRegex": False, "isEqual": True}]
    assert instance == [
        {"name": "instance", "value": r"10\.0\.0\.11(:[0-9]+)?", "isRegex": True, "isEqual": True}
    ]


def test_the_payload_has_an_expiry_and_a_comment_naming_the_run():
    m = host_matchers("gpu01", "10.0.0.11")[0]
    p = silence_payload(m, start=1_800_000_000.25, minutes=90, comment="run R1")
    assert p == {
        "matchers": m,
        "startsAt": "2027-01-15T08:00:00.250Z",
        "endsAt": "2027-01-15T09:30:00.250Z",
        "createdBy": "gpumon-deploy",
        "comment": "run R1",
    }
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


def test_create_posts_to_the_first_peer_that_answers():
    am = FakeAM(down=("http://am1:9093",))
    sid, peer = Silences(PEERS, am).create({"matchers": [], "comment": "c"})
    assert (sid, peer) == ("s1", "http://am2:9093")
    assert [c for c in am.calls if c[0] == "POST"] == [
        ("POST", "http://am1:9093/api/v2/silences"),
        ("POST", "http://am2:9093/api/v2/silences"),
    ]


def test_no_peer_answering_is_an_error_naming_every_peer():
    with pytest.raises(SilenceError) as exc:
        Silences(PEERS, FakeAM(down=tuple(PEERS))).create({"matchers": []})
    assert all(p in str(exc.value) for p in PEERS)


def test_a_resumed_run_finds_its_own_active_silence():
    am = FakeAM()
    s = Silences(PEERS, am)
    m = host_matchers("gpu01", "10.0.0.11")[0]
    sid, _ = s.create(silence_payload(m, start=0, minutes=5, comment="run R1"))
    assert s.find("run R1", m) == sid
    assert s.find("run R2", m) is None
    assert s.find("run R1", host_matchers("gpu02", "10.0.0.12")[0]) is None
    s.expire(sid)
    assert s.find("run R1", m) is None  # expired ones are not reused


def test_expire_deletes_on_the_preferred_peer_and_tolerates_a_repeat():
    am = FakeAM()
    s = Silences(PEERS, am)
    sid, peer = s.create({"matchers": []}, prefer="http://am3:9093")
    assert peer == "http://am3:9093"
    assert s.expire(sid, prefer=peer) == peer
    assert ("DELETE", f"http://am3:9093/api/v2/silence/{sid}") in am.calls
    assert am.silences[sid]["status"]["state"] == "expired"
    assert s.expire(sid) == "http://am1:9093"  # already expired: done, not an error


def test_expiring_an_unknown_silence_on_a_down_cluster_fails():
    with pytest.raises(SilenceError):
        Silences(PEERS, FakeAM(down=tuple(PEERS))).expire("s9")
