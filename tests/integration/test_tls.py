"""TLS and basic auth on every endpoint of the monitoring tier (``gpumon_tls``), on the lab.

With the switch on, one ``up`` from whatever the lab runs:

- every target is ``up == 1`` on both replicas, scraped over https;
- a request without credentials to every endpoint (dcgm-exporter, node_exporter, Prometheus,
  Alertmanager) gets 401, and a client that trusts another CA fails the handshake;
- ``status`` is green over TLS, and a second ``up`` changes nothing (the bcrypt hash is kept);
- the CA key never reaches a host, and the password is in no output of the CLI, no journal and no
  file others can read;
- a renewal of every certificate (``gpumon_tls_renew_days`` above the lifetime left) restarts no
  daemon (exporter-toolkit reads the certificate per connection), the servers present the new
  certificates, and no target of either replica goes down meanwhile;
- a new basic-auth password, and a re-created CA, each rotated by one ``up`` (three passes:
  deployer/tls/rotation.py) while both replicas scrape: no target of either replica is ever
  down, no daemon restarts, the old credential and CA are refused afterwards, and the ``up``
  after it changes nothing.

At the end the lab is converged back without TLS (the other modules run on plain HTTP).
While developing, ``GPUMON_TLS_LAB=<name>`` runs it on a lab of that name that is already up.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from deployer.lab import Lab
from deployer.monitoring.http import ClientTLS, api_data, http_fetch, use_tls
from deployer.tls import ca, material, rotation
from tests.integration.labtools import lab_named_by, lab_needed_after, run_cli, wait_until

pytestmark = pytest.mark.lab

gpumon = functools.partial(run_cli, timeout=900)
PORTS = {"dcgm": 9400, "node": 9100, "prometheus": 9090, "alertmanager": 9093, "store": 8428}


@pytest.fixture(scope="module")
def tlab(request: pytest.FixtureRequest) -> Lab:
    return lab_named_by("GPUMON_TLS_LAB", request)


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = os.environ.get("GPUMON_TLS_LAB")
    if name:  # a lab kept up between runs keeps its CA and credential
        d = Path(f"/var/tmp/gpumon-tls-lab-{name}")
        d.mkdir(mode=0o700, exist_ok=True)
    else:
        d = tmp_path_factory.mktemp("tls")
    d.chmod(0o700)
    return d


@pytest.fixture(scope="module")
def tls_vars(secrets_dir: Path) -> list[str]:
    return ["-e", "gpumon_tls=true", "-e", f"gpumon_tls_dir={secrets_dir / 'ca'}"]


@pytest.fixture(scope="module")
def env(secrets_dir: Path) -> dict[str, str]:
    return {"GPUMON_SECRETS_DIR": str(secrets_dir / "secrets")}


@pytest.fixture(scope="module")
def outputs() -> list[str]:
    """Everything the CLI printed in this module (checked for secrets at the end)."""
    return []


@pytest.fixture(scope="module")
def passwords() -> list[str]:
    """Every basic-auth password this module put in force (checked for at the end)."""
    return []


@pytest.fixture(scope="module")
def deployed(
    request: pytest.FixtureRequest, tlab: Lab, tls_vars, env, outputs, secrets_dir, passwords
) -> Iterator[ClientTLS]:
    proc = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars, env=env)
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = secrets_dir / "ca"
    client = ClientTLS(
        (d / "ca.crt").read_text(), "gpumon", (d / "basic-auth-password").read_text().strip()
    )
    passwords.append(client.password)
    use_tls(client)
    yield client
    use_tls(None)
    if os.environ.get("GPUMON_TLS_LAB") or not lab_needed_after(request):
        return
    back = gpumon("up", "-i", str(tlab.inventory_path), env=env)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]


def hosts_in(lab: Lab, group: str) -> list[Any]:
    return [h for h in lab.hosts if group in h.groups]


def replicas(lab: Lab) -> dict[str, str]:
    return {h.name: f"https://{h.address}:9090" for h in hosts_in(lab, "prometheus")}


def endpoints(lab: Lab) -> list[str]:
    urls = [f"https://{h.address}:{PORTS['node']}/metrics" for h in lab.hosts]
    urls += [f"https://{h.address}:{PORTS['dcgm']}/metrics" for h in hosts_in(lab, "gpu")]
    urls += [
        f"https://{h.address}:{PORTS['prometheus']}/-/ready" for h in hosts_in(lab, "prometheus")
    ]
    urls += [
        f"https://{h.address}:{PORTS['prometheus']}/-/quit" for h in hosts_in(lab, "prometheus")
    ]
    urls += [
        f"https://{h.address}:{PORTS['alertmanager']}/-/reload"
        for h in hosts_in(lab, "alertmanager")
    ]
    # VictoriaMetrics 1.79 asks no credentials for /metrics and /health (lib/httpserver), only
    # for its APIs.
    urls += [
        f"https://{h.address}:{PORTS['store']}/api/v1/query?query=up"
        for h in hosts_in(lab, "metrics_store")
    ]
    return urls


def targets_down(url: str) -> tuple[int, list[str]]:
    """(how many targets, those not up == 1) of one replica."""
    data, err = api_data(http_fetch, f"{url}/api/v1/targets?state=active")
    assert err is None, err
    active = data["activeTargets"]
    return len(active), [
        f"{t['scrapeUrl']} {t['health']} {t.get('lastError', '')}"
        for t in active
        if t["health"] != "up"
    ]


def expected_targets(lab: Lab) -> int:
    # dcgm per GPU host, node per host, each replica, each Alertmanager peer (victoriametrics too)
    n = len(hosts_in(lab, "gpu")) + len(lab.hosts) + len(hosts_in(lab, "prometheus"))
    n += len(hosts_in(lab, "alertmanager")) + len(hosts_in(lab, "metrics_store"))
    return n


def served_serial(address: str, port: int, ca_pem: str) -> int:
    ctx = ssl.create_default_context(cadata=ca_pem)
    ctx.check_hostname = False
    import socket

    with socket.create_connection((address, port), timeout=5) as raw, ctx.wrap_socket(raw) as s:
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def exporter_tls_log(lab: Lab) -> dict[str, list[str]]:
    """Per GPU host, the exporter's last journal lines about TLS and its errors (what a scrape
    that failed at TLS left there), and its restarts: what a failure message needs to name the
    cause."""
    out = {}
    for host in hosts_in(lab, "gpu"):
        r = lab.ssh(host.name, "journalctl -u dcgm-exporter -o short-precise --no-pager"
                    " | grep -e TLS -e level=ERROR -e Started -e Stopp | tail -n 12")  # fmt: skip
        out[host.name] = r.stdout.splitlines() or [r.stderr.strip()]
    return out


def main_pids(lab: Lab) -> dict[str, str]:
    units = {"gpu": ["dcgm-exporter", "node_exporter"], "prometheus": ["prometheus"],
             "alertmanager": ["alertmanager"]}  # fmt: skip
    out = {}
    for h in lab.hosts:
        names = {"node_exporter"} | {u for g, us in units.items() if g in h.groups for u in us}
        cmd = " ".join(f"systemctl show -p MainPID --value {u}.service;" for u in sorted(names))
        r = lab.ssh(h.name, cmd)
        for u, pid in zip(sorted(names), r.stdout.split(), strict=False):
            out[f"{h.name}/{u}"] = pid
    return out


# ---------------------------------------------------------------- the tests


def every_target_up(lab: Lab) -> None:
    """Waits until both replicas scrape every target and each is up (a target not scraped yet
    is "unknown"): where the tests that watch for a target down start from."""
    want = expected_targets(lab)
    for host, url in replicas(lab).items():
        last: list[Any] = []

        def all_up(url: str = url, last: list[Any] = last) -> bool:
            total, down = targets_down(url)
            last[:] = [total, down]
            return total == want and not down

        try:
            wait_until(f"every target up on {host}", all_up, 180, every=5)
        except pytest.fail.Exception:
            pytest.fail(f"{host}: {last[0]} targets (want {want}), not up: {last[1]}")


def test_every_target_is_up_on_both_replicas_over_https(tlab, deployed):
    every_target_up(tlab)
    for url in replicas(tlab).values():
        data, err = api_data(http_fetch, f"{url}/api/v1/targets?state=active")
        assert err is None
        assert {t["scrapeUrl"].split(":")[0] for t in data["activeTargets"]} >= {"https"}
        plain = [
            t["scrapeUrl"] for t in data["activeTargets"] if t["scrapeUrl"].startswith("http:")
        ]
        assert plain == []


def test_a_request_without_credentials_gets_401_everywhere(tlab, deployed):
    ctx = ssl.create_default_context(cadata=deployed.ca_pem)
    answers = {}
    for url in endpoints(tlab):
        req = urllib.request.Request(
            url, method="POST" if url.endswith(("quit", "reload")) else "GET"
        )
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                answers[url] = resp.status
        except urllib.error.HTTPError as exc:
            answers[url] = exc.code
    assert {u: c for u, c in answers.items() if c != 401} == {}


def test_a_client_trusting_another_ca_fails_the_handshake(tlab, deployed, secrets_dir):
    foreign = ca.ensure_ca(secrets_dir / "foreign")
    ctx = ssl.create_default_context(cadata=foreign.cert_pem)
    failed = []
    for url in endpoints(tlab)[::3]:
        try:
            urllib.request.urlopen(url, timeout=10, context=ctx)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                failed.append(url)
    assert failed == endpoints(tlab)[::3]


def test_status_is_green_over_tls(tlab, deployed, tls_vars, env, outputs):
    proc = gpumon("status", "-i", str(tlab.inventory_path), *tls_vars, "--wait", "240",
                  "--output", "json", env=env, timeout=400)  # fmt: skip
    outputs += [proc.stdout, proc.stderr]
    data = json.loads(proc.stdout)
    bad = [f"{c['component']} {c['host']} {c['check']}: {c['detail']}" for c in data["checks"]
           if not c["ok"]]  # fmt: skip
    assert proc.returncode == 0 and bad == [], bad


def test_a_second_up_changes_nothing(tlab, deployed, tls_vars, env, outputs):
    proc = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars, "--output", "json", env=env)
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    changed = {h: r["counts"]["changed"] for h, r in report["hosts"].items()}
    assert set(changed.values()) == {0}, changed


def ca_on_hosts(lab: Lab) -> dict[str, str]:
    """Each host's digest of the CA bundle the tier's clients on it trust."""
    out = {}
    for h in lab.hosts:
        r = lab.ssh(h.name, f"sha256sum {material.HOST_CA_FILE} 2>/dev/null || echo none")
        out[h.name] = r.stdout.split()[0] if r.returncode == 0 else f"rc {r.returncode}"
    return out


def test_a_controller_without_the_tiers_tls_directory_is_refused_touching_nothing(
    tlab, deployed, env, outputs, tmp_path
):
    """A new controller, a lost or mistyped gpumon_tls_dir: `up`, `upgrade-driver` and `status`
    refuse rather than push (or read) a new CA and password, and leave no CA behind."""
    before = ca_on_hosts(tlab)
    lost = tmp_path / "lost" / "ca"
    elsewhere = ["-e", "gpumon_tls=true", "-e", f"gpumon_tls_dir={lost}"]
    inventory = str(tlab.inventory_path)
    gpu = hosts_in(tlab, "gpu")[0].name
    runs = tmp_path / "runs"
    for args, extra_env in [
        (["up", "-i", inventory, *elsewhere], {}),
        (["upgrade-driver", "-i", inventory, *elsewhere, "--to", "595", "--limit", gpu,
          "--drain", "none", "--check"], {"GPUMON_ROLLOUT_STATE_DIR": str(runs)}),
    ]:  # fmt: skip
        proc = gpumon(*args, env={**env, **extra_env})
        outputs += [proc.stdout, proc.stderr]
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "[tls-dir-unknown]" in proc.stderr and str(lost) in proc.stderr, proc.stderr
        assert "gpumon_tls_start_over" in proc.stderr
        assert not lost.exists(), sorted(p.name for p in lost.rglob("*"))
    assert not runs.exists() or not any(runs.iterdir())  # no rollout recorded
    status = gpumon("status", "-i", inventory, *elsewhere, env=env)
    outputs += [status.stdout, status.stderr]
    assert status.returncode == 2 and "holds no credential" in status.stderr, status.stderr
    assert not lost.exists()
    assert ca_on_hosts(tlab) == before
    every_target_up(tlab)


def test_your_own_ca_and_password_from_a_new_directory_still_need_the_stores_password(
    tlab, deployed, secrets_dir, env, outputs, tmp_path
):
    """The tier's CA and basic-auth password given as your own (``gpumon_tls_ca_cert``,
    ``gpumon_basic_auth_password``) from a new directory are what the hosts already trust, but
    this inventory has a long-term store, whose password the tier made: a new one would have the
    store refuse the replicas' writes. `up` is refused naming ``metrics_store_password``,
    touching nothing; with the store's password given as well, the run is not refused
    (``--check``)."""
    tier = secrets_dir / "ca"
    issued = ca.issue_host(
        ca.ensure_ca(tier), tmp_path / "mine", "any", ["any"], days=30, renew_days=7
    )
    (tmp_path / "host.pem").write_text(issued.cert_pem)
    (tmp_path / "host.key").write_text(issued.key_pem)
    (tmp_path / "host.key").chmod(0o600)
    new = tmp_path / "new" / "ca"
    own = ["-e", "gpumon_tls=true", "-e", f"gpumon_tls_dir={new}",
           "-e", f"gpumon_tls_ca_cert={tier / 'ca.crt'}",
           "-e", f"gpumon_tls_cert={tmp_path / 'host.pem'}",
           "-e", f"gpumon_tls_private_key={tmp_path / 'host.key'}",
           "-e", f"gpumon_basic_auth_password={deployed.password}"]  # fmt: skip
    before = ca_on_hosts(tlab)
    inventory = str(tlab.inventory_path)
    proc = gpumon("up", "-i", inventory, *own, env=env)
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "[tls-dir-unknown]" in proc.stderr and "metrics_store_password" in proc.stderr
    assert "long-term store" in proc.stderr
    assert not new.exists(), sorted(p.name for p in new.rglob("*"))
    assert ca_on_hosts(tlab) == before

    store = (tier / "metrics-store-password").read_text().strip()
    check = gpumon("up", "-i", inventory, *own, "-e", f"metrics_store_password={store}",
                   "--check", env=env)  # fmt: skip
    outputs += [check.stdout, check.stderr]
    assert "[tls-dir-unknown]" not in check.stderr, check.stderr[-3000:]
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-3000:]
    assert ca_on_hosts(tlab) == before
    every_target_up(tlab)


def test_a_renewal_of_every_certificate_restarts_nothing_and_leaves_no_gap(
    tlab, deployed, tls_vars, env, outputs
):
    every_target_up(tlab)  # from a settled tier, whichever test ran before
    before_pids = main_pids(tlab)
    prom = hosts_in(tlab, "prometheus")[0]
    gpu = hosts_in(tlab, "gpu")[0]
    before = (served_serial(prom.address, 9090, deployed.ca_pem),
              served_serial(gpu.address, 9400, deployed.ca_pem))  # fmt: skip
    gaps: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for host, url in replicas(tlab).items():
                _, down = targets_down(url)
                gaps.extend(f"{host}: {d}" for d in down)
            stop.wait(3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars,
                      "-e", "gpumon_tls_cert_days=398", "-e", "gpumon_tls_renew_days=397",
                      env=env)  # fmt: skip
        outputs += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, proc.stderr[-3000:]
        time.sleep(20)  # more than one scrape interval (15 s) after the last file changed
    finally:
        stop.set()
        watcher.join(30)
    after = (served_serial(prom.address, 9090, deployed.ca_pem),
             served_serial(gpu.address, 9400, deployed.ca_pem))  # fmt: skip
    assert after[0] != before[0] and after[1] != before[1], "the new certificates are served"
    assert main_pids(tlab) == before_pids, "no daemon restarted"
    assert gaps == []


class ScrapeWatch:
    """Both replicas' targets every 3 s while an ``up`` runs: what was ever not up, and for how
    long. Its own client sends the credential in force at each round and trusts ``cas`` and the
    CA on disk."""

    def __init__(self, lab: Lab, secrets_dir: Path, cas: str = "") -> None:
        self.lab, self.secrets_dir, self.cas = lab, secrets_dir, cas
        self.gaps: list[str] = []
        self.rounds: list[tuple[float, set[str]]] = []  # (when, "replica scrapeUrl" not up)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        while not self.stop.is_set():
            down: set[str] = set()
            try:
                use_tls(in_force(self.secrets_dir, self.cas))
                for host, url in replicas(self.lab).items():
                    _, bad = targets_down(url)
                    self.gaps.extend(f"{time.strftime('%H:%M:%S')} {host}: {d}" for d in bad)
                    down |= {f"{host} {d.split()[0]}" for d in bad}
            except (AssertionError, OSError, ValueError) as exc:
                self.gaps.append(f"the watch itself: {exc}")
                down.add("the watch itself")
            self.rounds.append((time.monotonic(), down))
            self.stop.wait(3)

    def longest_down(self) -> dict[str, float]:
        """Per target seen down: the longest time from a round that saw it down to the next
        round that saw it up."""
        out: dict[str, float] = {}
        keys = set().union(*(d for _, d in self.rounds)) if self.rounds else set()
        for key in keys:
            since = None
            for when, down in self.rounds:
                if key in down and since is None:
                    since = when
                elif key not in down and since is not None:
                    out[key] = max(out.get(key, 0.0), when - since)
                    since = None
            if since is not None:
                out[key] = float("inf")
        return out

    def __enter__(self) -> ScrapeWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(20)  # more than one scrape interval (15 s) after the last file changed
        self.stop.set()
        self.thread.join(30)


def status_of(url: str, ctx: ssl.SSLContext, user: str | None, password: str | None) -> int:
    req = urllib.request.Request(url)
    if user is not None:
        import base64

        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def in_force(secrets_dir: Path, cas: str = "") -> ClientTLS:
    """The client of the credential the controller has in force, trusting ``cas`` and the CA."""
    cred = rotation.in_force(secrets_dir / "ca")
    assert cred is not None
    try:
        bundle = cas + (secrets_dir / "ca" / "ca.crt").read_text()
    except FileNotFoundError:  # a CA being re-created
        bundle = cas
    return ClientTLS(bundle, cred["username"], cred["password"])


def test_a_password_rotation_while_scraping_leaves_no_target_down(
    tlab, deployed, tls_vars, env, outputs, secrets_dir, passwords
):
    every_target_up(tlab)  # from a settled tier, whichever test ran before
    before_pids = main_pids(tlab)
    old = in_force(secrets_dir)
    new_password = "rotated-" + os.urandom(12).hex()
    passwords.append(new_password)
    rotate = ["-e", f"gpumon_basic_auth_password={new_password}"]
    started = time.monotonic()
    with ScrapeWatch(tlab, secrets_dir) as watch:
        proc = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars, *rotate, env=env,
                      timeout=2400)  # fmt: skip
        outputs += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    took = time.monotonic() - started
    print(f"password rotation: up {took:.0f}s, {len(watch.rounds)} watch rounds, "
          f"longest down {watch.longest_down()}")  # fmt: skip
    assert "now 'settled'" in proc.stderr, proc.stderr[-2000:]
    assert watch.gaps == [], (len(watch.rounds), took, sorted(set(watch.gaps))[:20])
    assert main_pids(tlab) == before_pids, "no daemon restarted"
    new = in_force(secrets_dir)
    assert (new.username, new.password) == ("gpumon-2", new_password)
    use_tls(new)
    ctx = ssl.create_default_context(cadata=new.ca_pem)
    answers = {u: (status_of(u, ctx, new.username, new.password),
                   status_of(u, ctx, old.username, old.password))
               for u in endpoints(tlab)
               if not u.endswith(("quit", "reload")) and f":{PORTS['store']}/" not in u}  # fmt: skip
    assert {u: a for u, a in answers.items() if a != (200, 401)} == {}
    again = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars, *rotate, "--output", "json",
                   env=env)  # fmt: skip
    outputs += [again.stdout, again.stderr]
    changed = {h: r["counts"]["changed"] for h, r in json.loads(again.stdout)["hosts"].items()}
    assert set(changed.values()) == {0}, changed
    tls_vars += rotate  # the rest of the module runs with the new password


def test_a_recreated_ca_while_scraping_leaves_no_target_down(
    tlab, deployed, tls_vars, env, outputs, secrets_dir
):
    every_target_up(tlab)  # from a settled tier, whichever test ran before
    before_pids = main_pids(tlab)
    d = secrets_dir / "ca"
    old_ca = (d / "ca.crt").read_text()
    (d / "ca.key").unlink()
    (d / "ca.crt").unlink()
    with ScrapeWatch(tlab, secrets_dir, old_ca) as watch:
        proc = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars, env=env, timeout=2400)
        outputs += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Alertmanager's gossip reads its CAs at start: each peer restarts, one at a time, when the
    # trust widens and when it narrows (roles/alertmanager). Nothing else restarts, and no
    # target is down longer than one scrape interval (15 s, plus the watch's 3 s period).
    longest = watch.longest_down()
    print(f"CA rotation: {len(watch.rounds)} watch rounds, longest down {longest}")
    assert {k: v for k, v in longest.items() if ":9093/" not in k} == {}, (
        len(watch.rounds), sorted(set(watch.gaps))[:20], exporter_tls_log(tlab))  # fmt: skip
    assert {k: v for k, v in longest.items() if v > 18} == {}
    after = main_pids(tlab)
    assert {k: v for k, v in after.items() if not k.endswith("/alertmanager")} == {
        k: v for k, v in before_pids.items() if not k.endswith("/alertmanager")
    }, "nothing but the Alertmanager peers restarted"
    new_ca = (d / "ca.crt").read_text()
    assert new_ca != old_ca
    client = in_force(secrets_dir)
    use_tls(client)
    prom = hosts_in(tlab, "prometheus")[0]
    gpu = hosts_in(tlab, "gpu")[0]
    for host in (prom, gpu):
        port = 9090 if host is prom else 9400
        served_serial(host.address, port, new_ca)  # verified by the new CA alone
        with pytest.raises(ssl.SSLCertVerificationError):
            served_serial(host.address, port, old_ca)
    r = tlab.ssh(prom.name, "grep -c 'BEGIN CERTIFICATE' /etc/gpumon/tls/ca.pem")
    assert r.stdout.strip() == "1", "the old CA is no longer trusted"


def test_upgrade_driver_silences_over_https_and_expires_the_silences(
    tlab, deployed, tls_vars, env, outputs, secrets_dir, tmp_path
):
    gpu = hosts_in(tlab, "gpu")[0].name
    runs = tmp_path / "runs"
    runs.mkdir()
    # From the driver test_upgrade_driver.py starts from (the lab's default may be the target).
    base = gpumon("up", "-i", str(tlab.inventory_path), *tls_vars, "--limit", gpu,
                  "-e", "nvidia_driver_version=580.65.06", "-e", "nvidia_driver_reboot=if_required",
                  "--out-of-service", env=env)  # fmt: skip
    outputs += [base.stdout, base.stderr]
    assert base.returncode == 0, base.stderr[-3000:]
    proc = gpumon("upgrade-driver", "-i", str(tlab.inventory_path), *tls_vars, "--to", "595",
                  "--limit", gpu, "--drain", "none", "--output", "json",
                  env={**env, "GPUMON_ROLLOUT_STATE_DIR": str(runs)}, timeout=1500)  # fmt: skip
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 0, proc.stderr[-4000:]
    host = json.loads(proc.stdout)["hosts"][gpu]
    assert host["state"] == "done" and len(host["silence_ids"]) == 2, host
    client = in_force(secrets_dir)
    use_tls(client)
    am = hosts_in(tlab, "alertmanager")[0]
    matchers = []
    for sid in host["silence_ids"]:
        resp = http_fetch(f"https://{am.address}:9093/api/v2/silence/{sid}")
        assert resp.status == 200, resp.why()
        silence = json.loads(resp.body)
        assert silence["status"]["state"] == "expired", silence["status"]
        matchers.append(json.dumps(silence["matchers"]))
    # one silence by node name, one by the exporters' instance address
    assert any(gpu in m for m in matchers), matchers
    assert any(hosts_in(tlab, "gpu")[0].address.split(".")[-1] in m for m in matchers), matchers


def test_no_secret_reaches_an_output_a_journal_or_a_readable_file(
    tlab, deployed, secrets_dir, outputs, passwords
):
    ca_key = (secrets_dir / "ca" / "ca.key").read_text()
    key_line = ca_key.splitlines()[1]  # the key's first base64 line
    assert (secrets_dir / "ca" / "ca.key").stat().st_mode & 0o077 == 0
    assert [o for o in outputs if key_line in o or any(p in o for p in passwords)] == []
    found = {}
    for h in tlab.hosts:
        r = tlab.ssh(
            h.name,
            # the passwords (stdin) into a 0600 file first: in a pipeline, grep -f /dev/stdin
            # would read its patterns from the journal, and xargs gives grep /dev/null as stdin
            'p=$(mktemp); cat > "$p";'
            ' journalctl --no-pager -q 2>/dev/null | grep -cF -f "$p";'
            " find /etc /var/log /run /tmp /var/lib/gpumon -xdev -type f -perm -o=r 2>/dev/null"
            ' | xargs -r grep -lF -f "$p" 2>/dev/null; rm -f "$p"; true',
            input="".join(p + "\n" for p in passwords),
            timeout=120,
        )
        k = tlab.ssh(h.name, "grep -rlF -f /dev/stdin /etc /root /var/lib /tmp 2>/dev/null; true",
                     input=key_line + "\n", timeout=120)  # fmt: skip
        lines = [ln for ln in r.stdout.split() if ln != "0"] + k.stdout.split()
        if lines:
            found[h.name] = lines
    assert found == {}
