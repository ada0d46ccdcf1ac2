"""What the lab integration tests share: the CLI as a user runs it, the lab a module runs on, an
OpenSSH config for testinfra, polling with a bound, and an Alertmanager webhook receiver."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import testinfra

from deployer.lab import Lab

CLI = [sys.executable, "-m", "deployer.cli"]


def run_cli(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``gpumon-deploy ARGS`` as a user runs it, output captured, never raising on failure."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env} if env else None,
    )


def lab_named_by(env_var: str, request: pytest.FixtureRequest) -> Lab:
    """The lab named by ``env_var`` (already up; for development), else the session's lab."""
    name = os.environ.get(env_var)
    if name:
        lab = Lab(name)
        if lab.topology is None:
            pytest.skip(f"lab {name!r} is not up")
        return lab
    return request.getfixturevalue("lab")


def lab_needed_after(request: pytest.FixtureRequest) -> bool:
    """Whether the session's lab is still needed once this module's tests are done: a lab test
    collected after them, or a lab kept after the session (``GPUMON_LAB_KEEP=1``). A module that
    leaves the lab changed (TLS turned on) puts it back only then: at a session's end the lab is
    taken down, and putting a lab back that nothing reads again was CI's longest teardown
    (test_tls: one whole-lab ``up``, 292 s on 2026-12-03)."""
    if os.environ.get("GPUMON_LAB_KEEP") == "1":
        return True
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.path == request.path]
    after = items[max(mine) + 1 :] if mine else []
    return any(item.get_closest_marker("lab") is not None for item in after)


class WallClock:
    """How far the wall clock moved against the monotonic clock since this was made: a step of
    the machine's clock (or a pause of the whole VM) that every daemon of the lab saw at once.
    Prometheus stamps samples with the wall clock, so a test that judges gaps in a window of
    wall-clock time cannot judge one across such a step (seen once in CI, 2026-12-03: a 14 s
    step made one 30 s window of the global view empty)."""

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()

    def stepped(self) -> float:
        return time.time() - time.monotonic() - self._offset


def invocation(lab: Lab, host: str, unit: str) -> str:
    """``unit``'s systemd InvocationID on ``host``: new on every start, kept by a reload. How a
    test tells a restart; not ``process_start_time_seconds``, which client_golang computes from
    /proc/stat's whole-second ``btime`` and which moved by exactly 1.00 s on four replicas at once
    in a CI run with no restart (prometheus/client_golang#289)."""
    r = lab.ssh(host, f"systemctl show -p InvocationID --value {unit}.service")
    assert r.returncode == 0 and r.stdout.strip(), (host, unit, r.stderr)
    return r.stdout.strip()


def write_ssh_config(lab: Lab, path: Path) -> Path:
    """An OpenSSH client config for testinfra: the lab's key and known_hosts, strict checking."""
    lines = []
    for h in lab.hosts:
        lines += [
            f"Host {h.name}",
            f"  HostName {h.address}",
            "  User root",
            f"  IdentityFile {lab.private_key_path}",
            f"  UserKnownHostsFile {lab.known_hosts_path}",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def infra(ssh_config: Path, host: str) -> Any:
    return testinfra.get_host(f"ssh://{host}", ssh_config=str(ssh_config))


def wait_until(
    what: str,
    probe: Callable[[], Any],
    timeout: float,
    every: float = 2,
    seen: Callable[[], str] | None = None,
) -> Any:
    """Poll ``probe`` until it returns something truthy (returned); bounded in time. ``seen``
    says, when it times out, what the last probe saw (a probe that returns None cannot)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f}s (last: {seen() if seen else repr(last)})")


def alerting_vars(url: str, *, send_resolved: bool, group_interval: str) -> dict[str, Any]:
    """Extra vars routing every alert to the test's receiver, with a short ``for`` on the GPU
    memory temperature rule the tests fire."""
    return {
        "alertmanager_receivers": [
            {"name": "test", "webhook_configs": [{"url": url, "send_resolved": send_resolved}]}
        ],
        "alertmanager_route": {
            "receiver": "test",
            "group_by": ["alertname", "node", "gpu"],
            "group_wait": "5s",
            "group_interval": group_interval,
            "repeat_interval": "4h",
        },
        "prometheus_rules_memory_temp_for": "15s",
    }


class WebhookReceiver:
    """An Alertmanager webhook receiver on the lab bridge: records every notification."""

    def __init__(self, address: str) -> None:
        self.opened = time.time()  # alerts started before this belong to an earlier run
        self.notifications: list[dict[str, Any]] = []
        lock = threading.Lock()
        received = self.notifications

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def notifications_with(self, alertname: str, status: str, **labels: str) -> list[dict]:
        """The notifications carrying an alert named ``alertname`` in ``status`` whose labels
        include ``labels``."""
        return [
            n
            for n in list(self.notifications)
            if any(
                a["labels"].get("alertname") == alertname
                and a["status"] == status
                and all(a["labels"].get(k) == v for k, v in labels.items())
                for a in n.get("alerts", [])
            )
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
