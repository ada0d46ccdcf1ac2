"""The ``status`` rows of Thanos (sidecars and Query), and the ``/-/ready`` probe they share with
the Prometheus replicas' rows. Thanos cannot be had on these machines: its rows are unit-tested
on the answers' shapes, never run against a Thanos here.
"""

from __future__ import annotations

from deployer.monitoring.check import FAILED, OK, PENDING, Check
from deployer.monitoring.expect import Endpoint, StackExpectation
from deployer.monitoring.http import Fetch, get_json


def ready(fetch: Fetch, url: str) -> tuple[str, str]:
    """A daemon's ``/-/ready`` (Prometheus, Thanos): ok, pending while it starts
    (HTTP 503), else failed; with what to show."""
    r = fetch(f"{url}/-/ready")
    if r.error is not None:
        return FAILED, r.error
    if r.status == 200:
        return OK, f"{url}/-/ready"
    if r.status == 503:
        return PENDING, f"starting: {url}/-/ready answered HTTP 503 ({r.body.strip()[:80]})"
    return FAILED, f"/-/ready answered HTTP {r.status}"


def thanos_checks(exp: StackExpectation, fetch: Fetch) -> list[Check]:
    """Each sidecar and Query ready, and every sidecar a store of each Query; one row saying
    Thanos is not deployed when it is not."""
    if not exp.thanos_active:
        return [
            Check(
                "thanos",
                "-",
                "deployed",
                OK,
                "not deployed (thanos_enabled false, or auto with no Thanos archive configured)",
            )
        ]
    checks = []
    for kind, endpoints in (("thanos sidecar", exp.thanos_sidecars), ("thanos query", exp.thanos_queries)):  # fmt: skip
        for e in endpoints:
            state, why = ready(fetch, e.url)
            checks.append(Check(kind, e.host, "ready", state, why))
            if state == OK and kind == "thanos query":
                checks.append(query_stores_check(exp, e, fetch))
    return checks


def query_stores_check(exp: StackExpectation, query_ep: Endpoint, fetch: Fetch) -> Check:
    """Every sidecar is a healthy store of this Query (``/api/v1/stores``, the API behind the
    Query UI's Stores page: ``{"data": {"<type>": [{"name": "host:port", "lastError": ...}]}}``;
    the shape is from Thanos' UI code, not checked against a running Thanos here)."""
    data, err = get_json(fetch, f"{query_ep.url}/api/v1/stores")
    if err is not None:
        return Check("thanos query", query_ep.host, "every sidecar a store", FAILED, err)
    healthy = {
        s.get("name")
        for stores in (data.get("data") or {}).values()
        for s in stores or []
        if not s.get("lastError")
    }
    missing = [a for a in exp.thanos_stores if a not in healthy]
    return Check.of(
        "thanos query",
        query_ep.host,
        "every sidecar a store",
        not missing,
        f"not healthy stores: {', '.join(missing)}"
        if missing
        else f"{len(exp.thanos_stores)}/{len(exp.thanos_stores)} sidecars",
    )
