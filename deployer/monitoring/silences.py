"""Alertmanager silences for hosts under upgrade (API v2, alertmanager.md §5).

A host gets two silences, since matchers are AND-ed and not every alert carries both labels:
``node="<host>"`` (the label file_sd gives every GPU-host target) and
``instance=~"<address>(:[0-9]+)?"`` (rules that aggregate by instance). Each has an ``endsAt``
expiry (a crashed run never mutes a host for good) and a comment naming the run. Silences are
gossiped, so one POST to one peer is enough; the client tries the peers in order until one
answers. Expiring is ``DELETE /api/v2/silence/{id}``; a silence already expired or unknown to the
peer counts as expired. Every request goes through the one HTTP client
(``deployer.monitoring.http``); the fakes of the tests answer ``(method, url, body)`` instead.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from deployer.monitoring.http import JSON_CONTENT, Response, http_fetch
from deployer.secrets import mask_text

CREATED_BY = "gpumon-deploy"
HTTP_TIMEOUT_S = 10.0

Http = Callable[[str, str, bytes | None], Response]  # (method, url, body) -> answer


def alertmanager_http(method: str, url: str, body: bytes | None) -> Response:
    """One request to an Alertmanager peer through the one HTTP client (a JSON body)."""
    headers = JSON_CONTENT if body is not None else {}
    return http_fetch(url, headers, method=method, body=body, timeout=HTTP_TIMEOUT_S)


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def host_matchers(host: str, address: str) -> list[list[dict[str, Any]]]:
    """The matcher sets (one silence each) that cover every alert of ``host``."""
    return [
        [{"name": "node", "value": host, "isRegex": False, "isEqual": True}],
        [
            {
                "name": "instance",
                "value": f"{re.escape(address)}(:[0-9]+)?",
                "isRegex": True,
                "isEqual": True,
            }
        ],
    ]


def silence_payload(
    matchers: list[dict[str, Any]], *, start: float, minutes: int, comment: str
) -> dict[str, Any]:
    """A ``postableSilence`` body (alertmanager.md §5)."""
    return {
        "matchers": matchers,
        "startsAt": rfc3339(start),
        "endsAt": rfc3339(start + minutes * 60),
        "createdBy": CREATED_BY,
        "comment": comment,
    }


def _matcher_key(matchers: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (m.get("name"), m.get("value"), bool(m.get("isRegex")), m.get("isEqual", True) is not False)
        for m in matchers
    )


class SilenceError(RuntimeError):
    pass


class Silences:
    """Create and expire silences on an Alertmanager cluster given as peer base URLs."""

    def __init__(self, peers: Sequence[str], http: Http = alertmanager_http) -> None:
        self.peers = list(peers)
        self.http = http

    def create(self, payload: dict[str, Any], prefer: str | None = None) -> tuple[str, str]:
        """POST the silence to the first peer that answers; (silence id, peer URL)."""
        body = json.dumps(payload).encode()
        errors = []
        for peer in self._order(prefer):
            ans = self.http("POST", f"{peer}/api/v2/silences", body)
            if ans.status == 200:
                try:
                    return json.loads(ans.body)["silenceID"], peer
                except (ValueError, KeyError) as exc:
                    errors.append(
                        mask_text(f"{peer}: unexpected answer {ans.body[:200]!r} ({exc})")
                    )
                    continue
            errors.append(f"{peer}: {ans.why()}")
        raise SilenceError("no Alertmanager peer took the silence: " + "; ".join(errors))

    def expire(self, silence_id: str, prefer: str | None = None) -> str:
        """DELETE the silence on the first peer that answers; the peer URL."""
        errors = []
        for peer in self._order(prefer):
            ans = self.http("DELETE", f"{peer}/api/v2/silence/{silence_id}", None)
            if ans.status == 200:
                return peer
            if ans.status in (404, 500) and self._expired(peer, silence_id):
                return peer  # already expired (a resumed run repeating this step)
            errors.append(f"{peer}: {ans.why()}")
        raise SilenceError(f"silence {silence_id} not expired: " + "; ".join(errors))

    def find(self, comment: str, matchers: list[dict[str, Any]]) -> str | None:
        """The id of an active or pending silence with this comment and these matchers (so a
        resumed run never creates a second one), or None."""
        for peer in self.peers:
            ans = self.http("GET", f"{peer}/api/v2/silences", None)
            if ans.status != 200:
                continue
            try:
                listed = json.loads(ans.body)
            except ValueError:
                continue
            want = _matcher_key(matchers)
            for sil in listed:
                state = (sil.get("status") or {}).get("state")
                if (
                    state in ("active", "pending")
                    and sil.get("comment") == comment
                    and _matcher_key(sil.get("matchers") or []) == want
                ):
                    return str(sil["id"])
            return None
        return None

    def get(self, silence_id: str, prefer: str | None = None) -> dict[str, Any] | None:
        for peer in self._order(prefer):
            ans = self.http("GET", f"{peer}/api/v2/silence/{silence_id}", None)
            if ans.status == 200:
                return json.loads(ans.body)
        return None

    def _expired(self, peer: str, silence_id: str) -> bool:
        ans = self.http("GET", f"{peer}/api/v2/silence/{silence_id}", None)
        if ans.status == 404:
            return True
        if ans.status != 200:
            return False
        try:
            return json.loads(ans.body)["status"]["state"] == "expired"
        except (ValueError, KeyError):
            return False

    def _order(self, prefer: str | None) -> list[str]:
        if prefer in self.peers:
            return [prefer, *[p for p in self.peers if p != prefer]]
        return list(self.peers)
