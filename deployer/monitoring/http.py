"""The one HTTP client of ``gpumon-deploy status``: GET a URL of a Prometheus or Alertmanager API,
never raising, and read its JSON, its query results or gauges from its own ``/metrics`` page.

Every request goes through a ``Fetch`` (``url -> Response``) passed in by the caller, so the checks
run on canned answers in the unit tests and on ``http_fetch`` for real.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Response:
    """One HTTP answer (status 0 and ``error`` set when there was no answer at all)."""

    status: int
    body: str = ""
    error: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)


Fetch = Callable[[str], Response]


def http_fetch(url: str, timeout: float = HTTP_TIMEOUT_S) -> Response:
    """GET ``url`` directly (no proxy from the environment), never raising."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return Response(resp.status, resp.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Response(0, error=f"no answer from {url}: {reason}")


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
        return None, f"{url} failed: {detail}"
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
