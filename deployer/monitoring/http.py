"""The one HTTP client of the monitoring side: the Prometheus replicas, Alertmanager (its status
and the rollout's silences), the long-term store and the global view, and the dashboards' proof
all send their requests through :func:`http_fetch`, and read its JSON, query results or gauges
with the helpers below.

A request goes directly (no proxy from the environment: the stack's hosts are on the cluster's
own network), with a timeout, and never raises: an answer is a :class:`Response` (any HTTP status,
body decoded), no answer is status 0 with ``error`` set. That error names the URL without its
query and never the headers (credentials travel in them: :func:`basic_auth`), and it is masked
(``deployer.secrets.mask_text``: a URL's userinfo, registered secret values), so it can be shown
as it is.

Callers take the fetch function as an argument (``Fetch``: ``url -> Response``; the store's
``(url, headers) -> Response``; the silences' ``(method, url, body) -> Response``), so the checks
run on canned answers in the unit tests and on ``http_fetch`` for real.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from deployer.secrets import mask_text

HTTP_TIMEOUT_S = 5.0
_TLS_LOCK = threading.Lock()


@dataclass(frozen=True)
class ClientTLS:
    """The tier's TLS and basic auth as its clients see them (``gpumon_tls``): the CA that signed
    every server's certificate, and the basic-auth user and password (a secret)."""

    ca_pem: str
    username: str
    password: str = field(repr=False)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_pem)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx


# The tier's client TLS, set once per command from the inventory (``use_tls``); None: plain HTTP.
_TLS: list[ClientTLS | None] = [None]
_CONTEXT: list[ssl.SSLContext | None] = [None]


def use_tls(tls: ClientTLS | None) -> None:
    """Every ``https`` request from now on verifies the server against ``tls``'s CA and, unless
    the caller sends its own ``Authorization``, authenticates with its basic auth. Credentials are
    never sent over plain HTTP."""
    with _TLS_LOCK:
        _TLS[0] = tls
        _CONTEXT[0] = tls.context() if tls is not None else None


JSON_CONTENT = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Response:
    """One HTTP answer (status 0 and ``error`` set when there was no answer at all)."""

    status: int
    body: str = ""
    error: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)

    def why(self, limit: int = 200) -> str:
        """For an error message: why there was no answer, or the status and the body's first
        ``limit`` characters, masked."""
        return self.error or mask_text(f"HTTP {self.status}: {self.body[:limit]}")


Fetch = Callable[[str], Response]


def http_fetch(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    method: str = "GET",
    body: bytes | None = None,
    timeout: float = HTTP_TIMEOUT_S,
) -> Response:
    """``method`` ``url`` with ``headers`` and ``body``, directly (no proxy from the environment),
    never raising."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    sent = dict(headers or {})
    tls, context = _TLS[0], _CONTEXT[0]
    if tls is not None and url.startswith("https://"):
        handlers.append(urllib.request.HTTPSHandler(context=context))
        if not any(k.lower() == "authorization" for k in sent):
            sent.update(basic_auth(tls.username, tls.password))
    opener = urllib.request.build_opener(*handlers)
    try:
        request = urllib.request.Request(url, data=body, headers=sent, method=method)
        with opener.open(request, timeout=timeout) as resp:
            return Response(resp.status, resp.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Response(0, error=mask_text(f"no answer from {without_query(url)}: {reason}"))
    except (http.client.HTTPException, ValueError) as exc:  # not HTTP, or not a URL
        why = f"{type(exc).__name__}: {exc}"
        return Response(0, error=mask_text(f"no HTTP answer from {without_query(url)}: {why}"))


def without_query(url: str) -> str:
    """``url`` without its query string (what an error names)."""
    return url.partition("?")[0]


def basic_auth(username: str, password: str) -> dict[str, str]:
    """The ``Authorization`` header of HTTP basic auth (RFC 7617)."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def get_json(fetch: Fetch, url: str) -> tuple[Any, str | None]:
    """The decoded JSON of a 200 answer, or None and why not."""
    r = fetch(url)
    if r.error is not None:
        return None, r.error
    if r.status != 200:
        return None, f"HTTP {r.status} from {url}"
    try:
        return r.json(), None
    except ValueError:
        return None, f"not JSON from {url}"


def api_data(fetch: Fetch, url: str) -> tuple[Any, str | None]:
    """``data`` of a Prometheus HTTP API answer (``{"status": "success", "data": ...}``)."""
    body, err = get_json(fetch, url)
    if err is not None:
        return None, err
    if not isinstance(body, dict) or body.get("status") != "success":
        detail = body.get("error", body) if isinstance(body, dict) else body
        return None, mask_text(f"{url} failed: {detail}")
    return body.get("data"), None


def query(fetch: Fetch, base: str, promql: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    data, err = api_data(fetch, url)
    if err is not None:
        return None, err
    return list(data.get("result") or []), None


def self_gauges(
    fetch: Fetch, base: str, names: Iterable[str]
) -> tuple[dict[str, float] | None, str | None]:
    """Unlabelled samples ``names`` from a daemon's own ``/metrics`` page (those it lacks are left
    out). Only the wanted lines are handed to prometheus_client's text parser."""
    r = fetch(f"{base}/metrics")
    if r.error is not None:
        return None, r.error
    if r.status != 200:
        return None, f"HTTP {r.status} from {base}/metrics"
    wanted = set(names)
    lines = [ln for ln in r.body.splitlines() if ln.split("{", 1)[0].split(" ", 1)[0] in wanted]
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                if sample.name in wanted and not sample.labels:
                    out[sample.name] = float(sample.value)
    except ValueError as exc:
        return None, f"unreadable {base}/metrics: {exc}"
    return out, None
