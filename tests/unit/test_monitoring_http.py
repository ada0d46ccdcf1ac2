"""The one HTTP client of the monitoring side (deployer/monitoring/http.py), for real on loopback:
what status, the store checks, the rollout's silences and the dashboards' proof send and what
they get back, never an exception, never a secret in an error."""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from deployer import secrets
from deployer.monitoring.dashboards import proof
from deployer.monitoring.http import Response, basic_auth, http_fetch
from deployer.monitoring.silences import Silences

SECRET = "s3cret-in-the-way"


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers by path; records each request (method, path, headers, body) on the server."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append((self.command, self.path, dict(self.headers), body))  # type: ignore[attr-defined]
        code, out = 200, b"ready"
        if self.path.startswith("/other"):
            code, out = 503, b"not ready"
        elif self.path.startswith("/echo-secret"):
            code, out = 401, f"bad password {SECRET}".encode()
        elif self.path == "/api/v2/silences" and self.command == "POST":
            out = json.dumps({"silenceID": "sil-1"}).encode()
        elif self.path.startswith("/api/v1/query"):
            code = 400 if "bad" in self.path else 200
            answer = {"status": "success", "data": {"resultType": "vector", "result": []}}
            out = json.dumps(answer if code == 200 else {"status": "error"}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    srv = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    srv.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def base(srv: http.server.HTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "REGISTERED", secrets.SecretValues([SECRET]))


def test_a_get_returns_the_status_and_body_whatever_the_status(server):
    assert http_fetch(f"{base(server)}/-/ready") == Response(200, "ready")
    assert http_fetch(f"{base(server)}/other") == Response(503, "not ready")


def test_no_answer_is_status_0_with_an_error_naming_the_url_without_its_query():
    url = f"http://127.0.0.1:{closed_port()}/api/v1/query?query=up"
    r = http_fetch(url, timeout=2)
    assert r.status == 0 and r.error is not None
    assert (
        r.error.startswith(f"no answer from {url.partition('?')[0]}: ")
        and "query=up" not in r.error
    )


class NotHttp(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.wfile.write(b"garbage\r\n\r\n")


def test_an_answer_that_is_not_http_is_an_error_not_an_exception():
    with socketserver.TCPServer(("127.0.0.1", 0), NotHttp) as tcp:
        threading.Thread(target=tcp.handle_request, daemon=True).start()
        r = http_fetch(f"http://127.0.0.1:{tcp.server_address[1]}/", timeout=5)
    assert r.status == 0 and r.error is not None and r.error.startswith("no HTTP answer from ")


def test_post_and_delete_carry_method_headers_and_body(server):
    r = http_fetch(
        f"{base(server)}/api/v2/silences",
        {"Content-Type": "application/json", **basic_auth("gpumon", "pw")},
        method="POST",
        body=b'{"a": 1}',
    )
    assert r.status == 200 and r.json() == {"silenceID": "sil-1"}
    assert http_fetch(f"{base(server)}/api/v2/silence/sil-1", method="DELETE").status == 200
    (m1, p1, h1, b1), (m2, p2, _, b2) = server.seen
    assert (m1, p1, b1) == ("POST", "/api/v2/silences", b'{"a": 1}')
    assert h1["Content-Type"] == "application/json" and h1["Authorization"].startswith("Basic ")
    assert (m2, p2, b2) == ("DELETE", "/api/v2/silence/sil-1", b"")


def test_basic_auth_is_rfc_7617s_header():
    # RFC 7617 section 2's example
    assert basic_auth("Aladdin", "open sesame") == {
        "Authorization": "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
    }


def test_an_error_never_shows_a_registered_secret(registered):
    r = http_fetch(f"http://127.0.0.1:{closed_port()}/{SECRET}/x", timeout=2)
    assert r.status == 0 and SECRET not in (r.error or "") and secrets.MASK in (r.error or "")


def test_why_names_the_status_and_body_with_secrets_masked(server, registered):
    r = http_fetch(f"{base(server)}/echo-secret")
    assert r.status == 401 and SECRET in r.body  # the data as it came
    assert r.why() == f"HTTP 401: bad password {secrets.MASK}"


def test_silences_default_client_posts_json_and_deletes_through_the_one_client(server):
    sil = Silences([base(server)])
    assert sil.create({"matchers": []}) == ("sil-1", base(server))
    assert sil.expire("sil-1") == base(server)
    (m1, _, h1, b1), (m2, p2, _, _) = server.seen
    assert (
        m1 == "POST"
        and h1["Content-Type"] == "application/json"
        and json.loads(b1) == {"matchers": []}
    )
    assert (m2, p2) == ("DELETE", "/api/v2/silence/sil-1")


def test_the_proofs_prometheus_queries_through_the_one_client(server, registered):
    prom = proof.Prometheus(base(server))
    assert prom.instant("up") == []
    with pytest.raises(proof.QueryError, match="HTTP 400"):
        prom.instant("bad")
    with pytest.raises(proof.QueryError, match=r"^no answer from http://127\.0\.0\.1:"):
        proof.Prometheus(f"http://127.0.0.1:{closed_port()}", timeout=2).instant("up")
