"""``gpumon-deploy upgrade-driver`` on the lab's simulated GPU hosts gpu01-gpu04 and its monitoring
tier. The runs name their hosts (ROLLED, BASELINE_HOSTS) rather than ``gpu:!gpu04``, which also
takes the default lab's gpu05 (MIG) and gpu06 (L40S): those two are upgraded, on purpose, by
tests/integration/test_gpu_reality_lab.py, and rolling them here too would double these runs.

The module converges gpu01-gpu04 at driver 580.65.06 and the monitoring tier first, then:

- a branch past R580 is refused for the V100 host (exit 2, nothing touched, no run recorded);
- a driver the matrix lists but the lab's mirror does not carry (590.44.01) is refused after
  each host's apt was asked (exit 2, nothing drained, silenced or stopped; ``--check`` notes it);
- a host where dpkg left a package half-installed is refused, naming it (exit 2, nothing touched);
- a host made to fail validation (``upgrade-validation`` fault: ``dcgmi diag`` fails) stops the
  run at --max-failures 1; it stays drained and silenced (an alert it raises reaches nobody,
  while the same alert on a host outside the run reaches the test's webhook); the host after it
  is untouched;
- a rolling upgrade (canary 1, batches of 2, --max-unavailable 2, a command drain hook run on
  mon01 as a login node) is killed with SIGKILL mid-run and finished by ``--resume``: the state
  file, sampled all along, never shows more than 2 hosts out of service and is never torn; no
  finished host is upgraded twice; every host's silences were created before its services
  stopped and expired after its validation; nvidia-smi and both Prometheus replicas see the target;
- an upgrade across the CUDA 12 / 13 boundary (535 -> 580 on the A100 host) switches the DCGM
  package variant;
- with an inventory that pins the old driver: a run killed inside a batch wider than
  --max-unavailable (1 of 2) is finished by one ``--resume`` (never more than 1 host out of
  service, no host upgraded twice); the plain ``up`` after it keeps every upgraded driver and
  exits 0, and ``up -e nvidia_driver_version=...`` on a live host is refused with nothing
  touched.

``up`` runs that change a loaded driver on purpose (the baselines) say ``--out-of-service``.

Set ``GPUMON_ROLLOUT_LAB=<name>`` to run against another lab that is already up (development).
"""

from __future__ import annotations

import base64
import calendar
import fcntl
import functools
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from deployer.lab import Lab
from deployer.lab.gpusim import catalog
from deployer.rollout.state import OUT_OF_SERVICE
from tests.integration import labtools
from tests.integration.labtools import CLI, WebhookReceiver, alerting_vars, lab_named_by, run_cli

GRUB_CFG = Path(__file__).parents[1] / "fixtures/grub/debian12-grub.cfg"

pytestmark = pytest.mark.lab

BASELINE = "580.65.06"
MARKERS = "/var/tmp/gpumon-drain"
# A scheduler stand-in on mon01 (the "login node"): a marker file per drained node.
DRAIN = (
    f"mkdir -p {MARKERS}; case {{action}} in "
    f"is-drained) test -e {MARKERS}/{{host}};; "
    f"drain) echo {{reason}} > {MARKERS}/{{host}};; "
    "idle) true;; "
    f"resume) rm -f {MARKERS}/{{host}};; esac"
)
DRAIN_ARGS = ("--drain", "command", "--drain-command", DRAIN, "--drain-host", "mon01")
# The hosts these tests roll (canary gpu01, then gpu02 and gpu03), and those at the baseline
# (gpu04 too: the V100 the R595 plan refuses, and the host outside the validation-failure run).
ROLLED = ("gpu01", "gpu02", "gpu03")
ROLLED_LIMIT = ":".join(ROLLED)
BASELINE_HOSTS = "gpu01:gpu02:gpu03:gpu04"


gpumon = functools.partial(run_cli, timeout=1500)


@pytest.fixture(scope="module")
def ulab(request) -> Lab:
    return lab_named_by("GPUMON_ROLLOUT_LAB", request)


@pytest.fixture(scope="module")
def inventory(ulab) -> dict:
    return yaml.safe_load(ulab.inventory_path.read_text())["all"]


@pytest.fixture(scope="module")
def state_env(tmp_path_factory) -> dict:
    return {"GPUMON_ROLLOUT_STATE_DIR": str(tmp_path_factory.mktemp("runs"))}


def sh(lab: Lab, host: str, command: str) -> str:
    proc = lab.ssh(host, command, timeout=120)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr[-500:]}"
    return proc.stdout


def loaded(lab: Lab, host: str) -> str:
    return sh(lab, host, "cat /sys/module/nvidia/version 2>/dev/null || "
              "grep -m1 NVRM /proc/driver/nvidia/version | grep -oE '[0-9]+\\.[0-9]+\\.[0-9]+' | head -1").strip()  # fmt: skip


def packages(lab: Lab, host: str) -> set[str]:
    out = sh(lab, host, "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n'")
    return {line.split()[0] for line in out.splitlines() if line.split()[1:2] in (["ii"], ["hi"])}


def http_json(url: str, method: str = "GET"):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(url, method=method), timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def am_url(inventory: dict) -> str:
    peer = next(iter(inventory["children"]["monitoring"]["children"]["alertmanager"]["hosts"]))
    return f"http://{inventory['hosts'][peer]['ansible_host']}:9093"


def rfc3339_to_unix(text: str) -> float:
    main, _, frac = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{frac or 0}")


def run_dir(state_env: dict, stderr: str) -> Path:
    line = next(x for x in stderr.splitlines() if "state in " in x)
    return Path(line.split("state in ", 1)[1].strip()).parent


ALERT = "GPUMemoryTemperatureHigh"


def firing_for(webhook: WebhookReceiver, node: str) -> list[dict]:
    """Notifications carrying ``ALERT`` firing for ``node``."""
    return webhook.notifications_with(ALERT, "firing", node=node)


@pytest.fixture(scope="module")
def webhook(ulab):
    receiver = WebhookReceiver(ulab.topology.gateway)
    yield receiver
    receiver.close()


wait_until = functools.partial(labtools.wait_until, every=3.0)


def prometheus_urls(inventory: dict) -> list[str]:
    members = inventory["children"]["monitoring"]["children"]["prometheus"]["hosts"]
    return [f"http://{inventory['hosts'][h]['ansible_host']}:9090" for h in members]


def firing_in(url: str, node: str) -> bool:
    alerts = http_json(f"{url}/api/v1/alerts")["data"]["alerts"]
    return any(
        a["labels"].get("alertname") == ALERT
        and a["labels"].get("node") == node
        and a["state"] == "firing"
        for a in alerts
    )


@pytest.fixture(scope="module")
def baseline(ulab, inventory, webhook):
    """GPU hosts at 580.65.06, faults healed, the monitoring tier converged."""
    for h in BASELINE_HOSTS.split(":"):
        ulab.heal(h)
    inv = str(ulab.inventory_path)
    proc = gpumon(
        "up", "-i", inv, "--limit", BASELINE_HOSTS, "-e", f"nvidia_driver_version={BASELINE}",
        "-e", "nvidia_driver_reboot=if_required", "--out-of-service",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    sh(ulab, "mon01", f"rm -rf {MARKERS}")
    alerting = alerting_vars(webhook.url, send_resolved=False, group_interval="10s")
    proc = gpumon(
        "up", "-i", inv, "--limit", "prometheus:alertmanager:thanos_query",
        "-e", json.dumps(alerting),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return inv


# ---- preflight --------------------------------------------------------------------------------


def test_a_branch_past_r580_is_refused_for_the_v100_and_nothing_is_touched(
    ulab, baseline, state_env
):
    proc = gpumon("upgrade-driver", "-i", baseline, "--to", "595", env=state_env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "REFUSED gpu04" in proc.stderr and "arch-last-branch" in proc.stderr
    assert "--limit" in proc.stderr
    assert list(Path(state_env["GPUMON_ROLLOUT_STATE_DIR"]).iterdir()) == []
    assert loaded(ulab, "gpu04") == BASELINE


def test_check_prints_the_plan_and_changes_nothing(ulab, baseline, state_env):
    proc = gpumon(
        "upgrade-driver", "-i", baseline, "--to", "595", "--limit", ROLLED_LIMIT, "--check",
        "--batch-size", "2", "--output", "json", *DRAIN_ARGS, env=state_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    assert plan["batches"] == [["gpu01"], ["gpu02", "gpu03"]]
    gpu01 = plan["hosts"]["gpu01"]
    assert gpu01["before"]["driver_installed"] == BASELINE
    assert "nvidia-open=595.45.04-1" in gpu01["after"]["install"]
    assert "nvidia-fabricmanager=595.45.04-1" in gpu01["after"]["install"]
    assert 'node="gpu01"' in gpu01["silence"] and "drain" in gpu01["drain"]
    assert list(Path(state_env["GPUMON_ROLLOUT_STATE_DIR"]).iterdir()) == []
    assert loaded(ulab, "gpu01") == BASELINE


def test_a_driver_the_hosts_mirror_lacks_is_refused_before_any_host_is_touched(
    ulab, baseline, inventory, state_env
):
    """590.44.01 is in the matrix (R590's first release) but not on the lab's mirror, which
    carries the release of the real captures, 590.48.01: each host's apt is asked (its lists
    refreshed first), and the run is refused with nothing drained, silenced or stopped."""
    silences = [
        s for s in http_json(f"{am_url(inventory)}/api/v2/silences")
        if s["status"]["state"] == "active"
    ]  # fmt: skip
    proc = gpumon(
        "upgrade-driver", "-i", baseline, "--to", "590.44.01", "--limit", "gpu01:gpu02",
        *DRAIN_ARGS, env=state_env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    for host in ("gpu01", "gpu02"):
        said = next(ln for ln in proc.stderr.splitlines() if ln.startswith(f"REFUSED {host}:"))
        assert "its package sources do not offer nvidia-open=590.44.01-1 (offered: " in said
        assert "590.48.01-1" in said and "(after apt-get update)" in said
        assert "[package-unavailable]" in said
    assert list(Path(state_env["GPUMON_ROLLOUT_STATE_DIR"]).iterdir()) == []
    assert sh(ulab, "mon01", f"ls {MARKERS} 2>/dev/null | wc -l").strip() == "0"  # none drained
    assert [
        s for s in http_json(f"{am_url(inventory)}/api/v2/silences")
        if s["status"]["state"] == "active"
    ] == silences  # fmt: skip
    for host in ("gpu01", "gpu02"):
        assert loaded(ulab, host) == BASELINE
        assert sh(ulab, host, "systemctl is-active nvidia-dcgm.service").strip() == "active"
    # --check reads the lists as they are (refreshed above: they lack it still) and notes it
    proc = gpumon(
        "upgrade-driver", "-i", baseline, "--to", "590.44.01", "--limit", "gpu01", "--check",
        *DRAIN_ARGS, env=state_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NOTE gpu01: not in its package lists: nvidia-open=590.44.01-1" in proc.stderr


BROKEN = "gpumon-test-broken"


def gpu02_refused(ulab: Lab, baseline, state_env: dict) -> str:
    """``upgrade-driver --to 595`` on gpu01 and gpu02, refused for gpu02 alone (gpu01's mirror
    offers 595.45.04) with nothing touched: no run recorded, nothing drained, both drivers as
    they were. Its stderr."""
    proc = gpumon(
        "upgrade-driver", "-i", baseline, "--to", "595", "--limit", "gpu01:gpu02",
        *DRAIN_ARGS, env=state_env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "REFUSED gpu02" in proc.stderr and "REFUSED gpu01" not in proc.stderr
    assert list(Path(state_env["GPUMON_ROLLOUT_STATE_DIR"]).iterdir()) == []
    assert sh(ulab, "mon01", f"ls {MARKERS} 2>/dev/null | wc -l").strip() == "0"
    assert loaded(ulab, "gpu01") == BASELINE and loaded(ulab, "gpu02") == BASELINE
    return proc.stderr


def up_580_126_fails_on_gpu02(baseline) -> list[tuple[tuple[str, ...], list[dict]]]:
    """``up`` installing driver 580.126.20 on gpu02 (out of service), in a run and in check
    mode, each failing the host (exit 1): the mode and the nvidia_driver role's task results."""
    out = []
    for check in ((), ("--check",)):
        proc = gpumon(
            "up", "-i", baseline, "--limit", "gpu02", "-e", "nvidia_driver_version=580.126.20",
            "--out-of-service", "--output", "json", *check,
        )  # fmt: skip
        assert proc.returncode == 1, (check, proc.stderr[-3000:])
        tasks = json.loads(proc.stdout)["hosts"]["gpu02"]["tasks"]
        out.append((check, [t for t in tasks if t["role"] == "nvidia_driver"]))
    return out


def test_a_host_where_dpkg_left_a_package_half_installed_is_refused_before_anything(
    ulab, baseline, state_env
):
    """A package unpacked and never configured (an install interrupted) makes apt refuse every
    install: the run is refused naming it and ``dpkg --configure -a``, with nothing touched."""
    sh(ulab, "gpu02", f"mkdir -p /tmp/{BROKEN}/DEBIAN && printf 'Package: {BROKEN}\\nVersion: 1\\n"
       f"Architecture: all\\nMaintainer: t <t@example.com>\\nDescription: t\\n' "
       f"> /tmp/{BROKEN}/DEBIAN/control && dpkg-deb --build /tmp/{BROKEN} /tmp/{BROKEN}.deb "
       f"&& dpkg --unpack /tmp/{BROKEN}.deb")  # fmt: skip
    try:
        said = gpu02_refused(ulab, baseline, state_env)
        assert f"REFUSED gpu02: dpkg has not finished installing {BROKEN} (dpkg --audit: " in said
        assert "dpkg --configure -a" in said and "[dpkg-unfinished]" in said
    finally:
        sh(
            ulab,
            "gpu02",
            f"dpkg --purge {BROKEN} >/dev/null; rm -rf /tmp/{BROKEN} /tmp/{BROKEN}.deb",
        )


NO_HEADERS_PIN = "/etc/apt/preferences.d/gpumon-test-no-headers"


def test_a_host_whose_sources_lack_its_kernels_headers_is_refused_before_anything(
    ulab, baseline, state_env
):
    """The driver role installed the running kernel's headers before the driver (DKMS builds the
    module against them; the lab's mirror carries a stand-in for the lab machine's kernel). A
    host without them whose sources offer none (pinned away here: Pin-Priority -1) would get a
    driver with no module built: the run is refused naming them, with nothing touched."""
    kernel = sh(ulab, "gpu01", "uname -r").strip()
    headers = f"linux-headers-{kernel}"
    for host in ("gpu01", "gpu02"):  # `up` installed them (the baseline)
        assert headers in packages(ulab, host)
        assert sh(ulab, host, f"test -d /lib/modules/{kernel}/build/include && echo y") == "y\n"
    sh(ulab, "gpu02", f"dpkg --purge {headers} >/dev/null && printf 'Package: linux-headers-*\\n"
       f"Pin: version *\\nPin-Priority: -1\\n' > {NO_HEADERS_PIN}")  # fmt: skip
    try:
        said = " ".join(gpu02_refused(ulab, baseline, state_env).split())
        assert (
            f"REFUSED gpu02: its package sources do not offer {headers} (a kernel's headers, "
            f"which DKMS builds the driver's module against: no source offers {headers})"
            " (after apt-get update)"
        ) in said
        assert "nvidia_driver_kernel_headers: false" in said and "[package-unavailable]" in said
    finally:
        sh(ulab, "gpu02", f"rm -f {NO_HEADERS_PIN} && DEBIAN_FRONTEND=noninteractive "
           f"apt-get install -y -q {headers} >/dev/null")  # fmt: skip


def test_a_host_with_a_newer_kernel_installed_whose_headers_no_source_offers_is_refused(
    ulab, baseline, state_env
):
    """A kernel update installed and not booted yet (its /boot/config-<release> and
    /lib/modules/<release>, as its package leaves them): Debian's dkms builds the driver's module
    for it too and skips it without its headers, and the rollout's reboot may boot it. No source
    offers that kernel's headers: the run is refused naming them, with nothing touched."""
    kernel = sh(ulab, "gpu02", "uname -r").strip()
    # two on (6.18.44 -> 6.18.46): the lab's mirror offers the headers of the next one
    # (catalog.later_kernel, for the status test of a kernel installed after the driver)
    newer = catalog.later_kernel(catalog.later_kernel(kernel))
    sh(ulab, "gpu02", f"touch /boot/config-{newer} && mkdir -p /lib/modules/{newer}/kernel")
    try:
        said = " ".join(gpu02_refused(ulab, baseline, state_env).split())
        assert (
            f"REFUSED gpu02: its package sources do not offer linux-headers-{newer} (a kernel's "
            f"headers, which DKMS builds the driver's module against: no source offers "
            f"linux-headers-{newer}) (after apt-get update)"
        ) in said
    finally:
        sh(ulab, "gpu02", f"rm -rf /boot/config-{newer} /lib/modules/{newer}")


def test_a_host_whose_boot_filesystem_is_too_small_for_the_install_is_refused_before_anything(
    ulab, baseline, state_env
):
    """A /boot of its own with 64 MiB free (a real filesystem: a tmpfs mounted over gpu02's
    /boot), where the install needs 128 (the role's default, for the initramfs the packages'
    triggers rebuild): update-initramfs would fail half-way on a drained host. The run is
    refused naming the filesystem, with nothing touched; gpu01, whose /boot is on its root
    filesystem with room, is not."""
    sh(ulab, "gpu02", "mount -t tmpfs -o size=64m gpumon-test-boot /boot")
    try:
        said = " ".join(gpu02_refused(ulab, baseline, state_env).split())
        assert (
            "REFUSED gpu02: too little free space for the driver's install: /boot (on /boot): "
            "64 MiB free, 128 MiB needed"
        ) in said
        assert "nvidia_driver_min_free_mib" in said and "[disk-space]" in said
    finally:
        sh(ulab, "gpu02", "umount /boot")


def test_a_host_whose_boot_loader_starts_another_installed_kernel_is_refused_before_anything(
    ulab, baseline, state_env
):
    """gpu02's GRUB pinned (GRUB_DEFAULT=saved, grub-set-default's saved_entry, as Debian's
    10_linux names entries, and its grub.cfg as grub-mkconfig writes it) to an older installed
    kernel: DKMS builds the new driver's module for
    the running and the newest kernel only, so the rollout's reboot would bring the host back
    without its driver. The run is refused naming the kernel and the setting, nothing touched;
    so is ``up`` installing another driver there, its driver role failing before any package."""
    kernel = sh(ulab, "gpu02", "uname -r").strip()
    version, dash, rest = kernel.partition("-")
    parts = version.split(".")
    parts[-1] = str(max(0, int(re.match(r"\d*", parts[-1]).group() or 1) - 1))  # 6.18.44 -> .43
    older = ".".join(parts) + dash + rest
    device = "8c2f3a1e-5b4d-4c3e-9f1a-2b3c4d5e6f70"
    entry = f"gnulinux-advanced-{device}>gnulinux-{older}-advanced-{device}"
    made = f"/etc/default/grub /boot/grub/grubenv /boot/grub/grub.cfg /boot/vmlinuz-{older}"
    assert sh(ulab, "gpu02", f"ls {made} 2>/dev/null || true").strip() == ""  # ours to remove
    # grub.cfg as Debian 12's grub-mkconfig writes it (tests/fixtures/grub), its kernels the
    # host's: the newest and running one, the older one, one older still
    cfg = GRUB_CFG.read_text()
    for generated, release in (("6.1.0-31-amd64", kernel), ("6.1.0-28-amd64", older),
                               ("6.1.0-25-amd64", f"{older}-old")):  # fmt: skip
        cfg = cfg.replace(generated, release)
    sh(ulab, "gpu02", "mkdir -p /boot/grub && echo GRUB_DEFAULT=saved > /etc/default/grub && "
       f"printf '# GRUB Environment Block\\nsaved_entry={entry}\\n' > /boot/grub/grubenv && "
       f"echo {base64.b64encode(cfg.encode()).decode()} | base64 -d > /boot/grub/grub.cfg && "
       f"touch /boot/vmlinuz-{older}")  # fmt: skip
    try:
        said = " ".join(gpu02_refused(ulab, baseline, state_env).split())
        assert (
            f"REFUSED gpu02: its reboot boots kernel {older} (GRUB_DEFAULT=saved, saved_entry "
            f"'{entry}'), which DKMS builds no NVIDIA module for (it builds for {kernel}): the "
            "host would come back without its driver"
        ) in said
        assert "[boot-kernel]" in said
        # up installing another driver asks the same before anything (the role's boot_loader
        # task): the packages would take the old module from every kernel, whoever reboots
        before = host_state(ulab, "gpu02")
        for check, driver in up_580_126_fails_on_gpu02(baseline):
            assert [(t["task"], t["status"]) for t in driver] == [
                ("room for driver 580.126.20's install (/var, /usr, /boot)", "ok"),
                ("the reboot after driver 580.126.20's install starts a kernel its module is "
                 "built for", "failed"),
            ], check  # fmt: skip
            said = " ".join(driver[1]["error"].split())
            assert said == (
                f"the host's reboot boots kernel {older} (GRUB_DEFAULT=saved, saved_entry "
                f"'{entry}'), which DKMS builds no NVIDIA module for (it builds for {kernel}): "
                "after driver 580.126.20's install it would come back without its driver; set "
                "the boot loader's default to the running or newest kernel (grub-set-default, or "
                "GRUB_DEFAULT and update-grub), or boot the host into that kernel first; nothing "
                "was installed"
            ), said
            assert host_state(ulab, "gpu02") == before
    finally:
        sh(ulab, "gpu02", f"rm -f {made}")
    assert loaded(ulab, "gpu02") == BASELINE


def test_a_host_whose_dkms_built_no_module_is_not_rebooted_into_a_kernel_without_its_driver(
    ulab, baseline, inventory, tmp_path
):
    """gpu02 with DKMS's autoinstall disabled (``/etc/dkms/no-autoinstall``): ``upgrade-driver
    --to 580.126.20`` drains it and installs the packages (the old module goes with the old
    package, the new one is not built), then stops at its install step on the module the next
    boot needs, naming the kernel and why, before its reboot step: the old driver keeps running.
    ``up`` with reboots allowed asks the same while the reboot is owed. Once the module is built
    (the file removed, the DKMS package reinstalled) that ``up`` reboots the host into it."""
    kernel = sh(ulab, "gpu02", "uname -r").strip()
    put = ("up", "-i", baseline, "--limit", "gpu02", "-e", "nvidia_driver_reboot=if_required",
           "--out-of-service", "-e", "nvidia_driver_version=580.126.20")  # fmt: skip
    module = f"/lib/modules/{kernel}/updates/dkms/nvidia.ko"
    assert sh(ulab, "gpu02", f"modinfo -F version {module}").strip() == BASELINE
    boot = sh(ulab, "gpu02", "cat /proc/sys/kernel/random/boot_id")
    why = (
        f"the host's next boot starts kernel {kernel} (the running kernel; no other is installed), "
        "which has no NVIDIA module on disk: /etc/dkms/no-autoinstall is present, so the packages' "
        f"DKMS step built nothing: run `dkms autoinstall -k {kernel}` or remove that file and "
        "reinstall the driver; it would come back from a reboot without its driver, so it is not "
        "rebooted (its loaded driver keeps running until then)"
    )

    def not_rebooted() -> None:
        assert sh(ulab, "gpu02", "cat /proc/sys/kernel/random/boot_id") == boot
        assert loaded(ulab, "gpu02") == BASELINE
        assert sh(ulab, "gpu02", f"ls {module} 2>/dev/null || true").strip() == ""

    sh(ulab, "gpu02", "mkdir -p /etc/dkms && touch /etc/dkms/no-autoinstall")
    report = None
    try:
        proc = gpumon(
            "upgrade-driver", "-i", baseline, "--to", "580.126.20", "--limit", "gpu02",
            "--output", "json", *DRAIN_ARGS, env={"GPUMON_ROLLOUT_STATE_DIR": str(tmp_path)},
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        host = report["hosts"]["gpu02"]
        assert (host["state"], host["failed_step"]) == ("failed", "installing"), host
        said = " ".join(host["reason"].split())
        assert (
            "the module of driver 580.126.20 is built for the kernel the next boot starts" in said
        )
        assert why in said
        assert [s for s, _ in host["history"]][-2:] == ["installing", "failed"]
        not_rebooted()
        assert sh(ulab, "mon01", f"ls {MARKERS}").split() == ["gpu02"]  # left drained
        assert "nvidia-smi" in packages(ulab, "gpu02")
        # up, reboots allowed, the packages at plan now: asked again since the reboot is owed
        proc = gpumon(*put, "--output", "json")
        assert proc.returncode == 1, proc.stderr[-3000:]
        tasks = json.loads(proc.stdout)["hosts"]["gpu02"]["tasks"]
        done = {t["task"]: t for t in tasks if t["role"] == "nvidia_driver"}
        built = done["the module of driver 580.126.20 is built for the kernel the next boot starts"]
        assert built["status"] == "failed"
        assert (
            " ".join(built["error"].split())
            == f"driver 580.126.20's packages are installed, but {why}"
        )
        assert not any(n.startswith("reboot into driver") for n in done)
        not_rebooted()
        flavour = sh(
            ulab,
            "gpu02",
            "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' 'nvidia-kernel*-dkms' "
            "| awk '$1 ~ /^.i/ { print $2 }'",
        ).split()
        sh(ulab, "gpu02", "rm /etc/dkms/no-autoinstall && DEBIAN_FRONTEND=noninteractive "
           f"apt-get install -y -q --reinstall --allow-change-held-packages {flavour[0]}")  # fmt: skip
        assert sh(ulab, "gpu02", f"modinfo -F version {module}").strip() == "580.126.20"
        proc = gpumon(*put)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert loaded(ulab, "gpu02") == "580.126.20"
        assert sh(ulab, "gpu02", "cat /proc/sys/kernel/random/boot_id") != boot
    finally:
        sh(ulab, "gpu02", "rm -f /etc/dkms/no-autoinstall")
        sh(ulab, "mon01", f"rm -rf {MARKERS}")
        if report is not None:
            for sid in report["hosts"]["gpu02"]["silence_ids"]:
                http_json(f"{am_url(inventory)}/api/v2/silence/{sid}", method="DELETE")
        proc = gpumon(*put[:-1], f"nvidia_driver_version={BASELINE}")
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert loaded(ulab, "gpu02") == BASELINE
    assert sh(ulab, "gpu02", f"modinfo -F version {module}").strip() == BASELINE


def test_up_installing_a_driver_on_a_host_without_room_fails_it_before_anything_is_installed(
    ulab, baseline
):
    """``up`` with another driver (out of service) on gpu02, its /boot a 64 MiB tmpfs: the
    nvidia_driver role's first task reads the room with df and fails the host, in check mode and
    in a run, before the repository, the pin or any package is touched."""
    sh(ulab, "gpu02", "mount -t tmpfs -o size=64m gpumon-test-boot /boot")
    try:
        before = host_state(ulab, "gpu02")
        for check, driver in up_580_126_fails_on_gpu02(baseline):
            assert [(t["task"], t["status"]) for t in driver] == [
                ("room for driver 580.126.20's install (/var, /usr, /boot)", "failed")
            ], check
            said = " ".join(driver[0]["error"].split())
            assert said.startswith(
                "too little free space for driver 580.126.20's install: /boot (on /boot): "
                "64 MiB free, 128 MiB needed; free space there"
            ), said
            assert "nvidia_driver_min_free_mib" in said and said.endswith("nothing was installed")
            assert host_state(ulab, "gpu02") == before
    finally:
        sh(ulab, "gpu02", "umount /boot")
    assert loaded(ulab, "gpu02") == BASELINE


def test_a_branch_older_than_a_hosts_release_of_it_is_refused_and_an_exact_downgrade_is_not(
    ulab, baseline, state_env
):
    """gpu02 at 580.159.04 (a real R580 release past the matrix's newest, 580.126.20: the
    captured /proc/driver/nvidia/version line): ``upgrade-driver --to 580`` and ``up`` with
    ``nvidia_driver_branch=580`` (out of service too) refuse it before anything is touched,
    rule driver-downgrade; the exact older version, asked for, installs (apt's downgrade)."""
    ahead = "580.159.04"
    put = ("up", "-i", baseline, "--limit", "gpu02", "-e", "nvidia_driver_reboot=if_required",
           "--out-of-service")  # fmt: skip
    try:
        proc = gpumon(*put, "-e", f"nvidia_driver_version={ahead}")
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert loaded(ulab, "gpu02") == ahead
        before = host_state(ulab, "gpu02")
        proc = gpumon("upgrade-driver", "-i", baseline, "--to", "580", "--limit", "gpu01:gpu02",
                      *DRAIN_ARGS, env=state_env)  # fmt: skip
        assert proc.returncode == 2, proc.stderr[-3000:]
        said = " ".join(proc.stderr.split())
        assert (
            f"REFUSED gpu02: runs driver {ahead}, newer than 580.126.20, the newest R580 release "
            f"the matrix knows: --to 580 would downgrade it; give the release the hosts are to "
            f"run (--to {ahead} or newer"
        ) in said
        assert "[driver-downgrade]" in said and "REFUSED gpu01" not in said
        assert list(Path(state_env["GPUMON_ROLLOUT_STATE_DIR"]).iterdir()) == []
        proc = gpumon(*put, "-e", "nvidia_driver_branch=580")
        assert proc.returncode == 2, proc.stderr[-3000:]
        said = " ".join(proc.stderr.split())
        assert (
            f"gpu02: runs driver {ahead}, newer than 580.126.20, which nvidia_driver_branch 580 "
            "resolves to"
        ) in said
        assert f"keep it with nvidia_driver_version: {ahead}" in said
        assert host_state(ulab, "gpu02") == before
    finally:
        proc = gpumon(*put, "-e", f"nvidia_driver_version={BASELINE}")  # the exact older one
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert loaded(ulab, "gpu02") == BASELINE


# ---- a validation failure -----------------------------------------------------------------------


def test_a_host_failing_validation_stops_the_run_and_stays_drained_and_silenced(
    ulab, baseline, inventory, state_env, webhook
):
    ulab.fault("gpu02", "upgrade-validation")
    report = None
    try:
        proc = gpumon(
            "upgrade-driver", "-i", baseline, "--to", "580.126.20", "--limit", ROLLED_LIMIT,
            "--canary", "1", "--batch-size", "1", "--max-failures", "1", "--output", "json",
            *DRAIN_ARGS, env=state_env,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        hosts = report["hosts"]
        assert report["status"] == "stopped" and "--max-failures 1" in report["stop_reason"]
        assert hosts["gpu01"]["state"] == "done"
        assert hosts["gpu02"]["state"] == "failed"
        assert hosts["gpu02"]["failed_step"] == "validating"
        assert "dcgmi diag" in hosts["gpu02"]["reason"]
        assert hosts["gpu03"]["state"] == "pending" and hosts["gpu03"]["history"] == []
        assert loaded(ulab, "gpu03") == BASELINE  # not started: untouched
        assert sh(ulab, "mon01", f"ls {MARKERS}").split() == ["gpu02"]  # still drained
        am = am_url(inventory)
        for sid in hosts["gpu02"]["silence_ids"]:
            assert http_json(f"{am}/api/v2/silence/{sid}")["status"]["state"] == "active"
        for sid in hosts["gpu01"]["silence_ids"]:
            assert http_json(f"{am}/api/v2/silence/{sid}")["status"]["state"] == "expired"

        # the silenced host's alerts reach nobody; a host outside the run still notifies
        ulab.fault("gpu02", "memory-temp", gpu=0, value=99)
        ulab.fault("gpu04", "memory-temp", gpu=0, value=99)
        wait_until("gpu04's notification", lambda: firing_for(webhook, "gpu04"), 300)
        for url in prometheus_urls(inventory):
            wait_until(f"gpu02's alert firing in {url}", lambda u=url: firing_in(u, "gpu02"), 180)
        time.sleep(30)  # group_wait 5s + group_interval 10s: a notification would be here
        assert firing_for(webhook, "gpu02") == []
    finally:
        ulab.heal("gpu04")
        ulab.heal("gpu02")
        if report is not None:
            for sid in report["hosts"]["gpu02"]["silence_ids"]:
                http_json(f"{am_url(inventory)}/api/v2/silence/{sid}", method="DELETE")
        sh(ulab, "mon01", f"rm -rf {MARKERS}")


# ---- a rolling upgrade, killed and resumed -------------------------------------------------------

IN_FLIGHT = ("stopping", "installing", "rebooting", "starting", "validating")


def status_rows(inventory: str, env: dict[str, str]) -> list[dict]:
    """Every row of ``status --api-only`` (with the controller's run records of ``env``)."""
    proc = gpumon("status", "-i", inventory, "--api-only", "--output", "json", env=env)
    assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    return json.loads(proc.stdout)["checks"]


def rollout_rows(inventory: str, env: dict[str, str]) -> list[dict]:
    """The ``upgrade-driver`` rows of ``status --api-only``."""
    return [c for c in status_rows(inventory, env) if c["component"] == "upgrade-driver"]


class Sampler(threading.Thread):
    """Reads the state file every 0.2 s: the most hosts out of service seen, torn reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.most = 0
        self.samples = 0
        self.torn = 0
        self.latest: dict = {}
        self.done = threading.Event()

    def run(self) -> None:
        from deployer.rollout.state import RunRecord

        while not self.done.is_set():
            for path in self.root.glob("*/state.json"):
                try:
                    data = json.loads(path.read_text())
                except ValueError:
                    self.torn += 1
                    continue
                self.samples += 1
                self.latest = data
                self.most = max(self.most, len(RunRecord.from_json(data).out_of_service()))
            time.sleep(0.2)


def test_a_rolling_upgrade_killed_mid_run_is_finished_by_resume(
    ulab, baseline, inventory, state_env, tmp_path
):
    env = {"GPUMON_ROLLOUT_STATE_DIR": str(tmp_path / "runs")}
    (tmp_path / "runs").mkdir()
    sampler = Sampler(tmp_path / "runs")
    sampler.start()
    args = (
        "upgrade-driver", "-i", baseline, "--to", "595", "--limit", ROLLED_LIMIT,
        "--canary", "1", "--batch-size", "2", "--max-unavailable", "2", *DRAIN_ARGS,
    )  # fmt: skip
    first = subprocess.Popen(
        [*CLI, *args], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    killed_at = None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and first.poll() is None:
        hosts = sampler.latest.get("hosts", {})
        if hosts.get("gpu01", {}).get("state") == "done" and any(
            hosts.get(h, {}).get("state") in IN_FLIGHT for h in ("gpu02", "gpu03")
        ):
            first.send_signal(signal.SIGKILL)
            killed_at = {h: r["state"] for h, r in hosts.items()}
            break
        time.sleep(0.2)
    first.wait(60)
    assert killed_at is not None, f"the run ended before it could be killed: {first.returncode}"
    assert first.returncode == -signal.SIGKILL
    run = next((tmp_path / "runs").iterdir())
    boot_gpu01 = sh(ulab, "gpu01", "cat /proc/sys/kernel/random/boot_id")

    # status says what the dead controller left, and how to resume it (read from this
    # controller's record: no drain hook tells it here)
    steps = {
        h: r["state"] for h, r in json.loads((run / "state.json").read_text())["hosts"].items()
    }
    left = {h: s for h, s in steps.items() if s in OUT_OF_SERVICE}
    assert left, steps
    # while a controller holds the run's lock (this test, standing in for one that drives it),
    # what those hosts' rows fail of is pending: the rollout has them out of service
    fd = os.open(run / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        during = status_rows(baseline, env)
    finally:
        os.close(fd)
    [under_way] = [c for c in during if c["component"] == "upgrade-driver"]
    assert (under_way["check"], under_way["state"]) == ("rollout under way", "pending")
    assert all(f"{h} ({s})" in under_way["detail"] for h, s in left.items()), under_way
    for c in during:
        if c["state"] == "failed":
            assert c["host"] not in left, c
            assert not any(re.search(rf"\b{h} \([^)]*\) down:", c["detail"]) for h in left), c
    rows = rollout_rows(baseline, env)
    assert [(r["check"], r["state"]) for r in rows] == [("no rollout left mid-run", "failed")]
    detail = rows[0]["detail"]
    assert detail.startswith(f"run {run.name} died mid-run (no controller drives it)"), detail
    assert all(f"{h} ({s})" in detail for h, s in left.items()), (detail, left)
    assert f"--resume {run.name}" in detail

    # a new run over those hosts (the command hook keeps no owner of its drain) is refused
    # before any host is contacted: it would leave them drained after upgrading them
    markers = sh(ulab, "mon01", f"ls {MARKERS}").split()
    again = gpumon(*args, env=env)
    assert again.returncode == 2, again.stderr[-3000:]
    assert f"run {run.name} died mid-run" in again.stderr and f"--resume {run.name}" in again.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [run.name]  # no new run
    assert sh(ulab, "mon01", f"ls {MARKERS}").split() == markers  # no drain touched

    proc = gpumon(
        "upgrade-driver", "-i", baseline, "--resume", run.name, "--output", "json", env=env
    )
    sampler.done.set()
    sampler.join(5)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert rollout_rows(baseline, env) == []  # resumed to its end: nothing left
    report = json.loads(proc.stdout)
    hosts = report["hosts"]
    assert report["status"] == "finished"
    assert {h: r["state"] for h, r in hosts.items()} == {
        "gpu01": "done", "gpu02": "done", "gpu03": "done",
    }  # fmt: skip

    # at no sampled moment more than --max-unavailable hosts out of service; never a torn file
    assert sampler.samples > 20 and sampler.torn == 0
    assert 1 <= sampler.most <= 2

    # the host finished before the kill was not upgraded again
    assert [s for s, _ in hosts["gpu01"]["history"]].count("installing") == 1
    assert sh(ulab, "gpu01", "cat /proc/sys/kernel/random/boot_id") == boot_gpu01
    # the hosts caught mid-run went on from the step they were in
    for h in ("gpu02", "gpu03"):
        steps = [s for s, _ in hosts[h]["history"]]
        assert steps[-1] == "done" and steps.count("draining") == 1

    am = am_url(inventory)
    for h in ("gpu01", "gpu02", "gpu03"):
        assert loaded(ulab, h) == "595.45.04"
        smi = sh(ulab, h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        assert set(smi.split()) == {"595.45.04"}
        assert "datacenter-gpu-manager-4-cuda13" in packages(ulab, h)
        history = {s: t for s, t in hosts[h]["history"]}
        assert len(hosts[h]["silence_ids"]) == 2
        for sid in hosts[h]["silence_ids"]:
            sil = http_json(f"{am}/api/v2/silence/{sid}")
            assert sil["status"]["state"] == "expired"
            assert run.name in sil["comment"]
            assert rfc3339_to_unix(sil["startsAt"]) <= history["stopping"]
            assert rfc3339_to_unix(sil["endsAt"]) >= history["undraining"]  # after validation
        for name, v in inventory["hosts"].items():
            if name in inventory["children"]["monitoring"]["children"]["prometheus"]["hosts"]:
                # GPUs by UUID (a GPU in MIG mode has a series per GPU instance)
                q = urllib.request.quote(
                    "count(count by (UUID) "
                    f'(DCGM_FI_DEV_GPU_TEMP{{node="{h}",DCGM_FI_DRIVER_VERSION="595.45.04"}}))'
                )
                res = http_json(f"http://{v['ansible_host']}:9090/api/v1/query?query={q}")
                assert (
                    int(res["data"]["result"][0]["value"][1]) == inventory["hosts"][h]["gpu_count"]
                )
    assert sh(ulab, "mon01", f"ls {MARKERS} 2>/dev/null || true").split() == []  # undrained


# ---- across the CUDA 12 / 13 boundary ------------------------------------------------------------


def test_an_upgrade_across_cuda_12_and_13_switches_the_dcgm_variant(ulab, baseline, state_env):
    # Down from the baseline's R580 (new packaging, CUDA 13) to R535 (branch-suffixed, CUDA 12.2):
    # the roles replace the held packages of the other branch themselves.
    proc = gpumon(
        "up", "-i", baseline, "--limit", "gpu03", "-e", "nvidia_driver_version=535.54.03",
        "-e", "nvidia_driver_reboot=if_required", "--out-of-service",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert loaded(ulab, "gpu03") == "535.54.03"
    assert "datacenter-gpu-manager-4-cuda12" in packages(ulab, "gpu03")
    proc = gpumon(
        "upgrade-driver", "-i", baseline, "--to", "580", "--limit", "gpu03", "--output", "json",
        env=state_env,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    gpu03 = report["hosts"]["gpu03"]
    assert proc.returncode == 0, (gpu03["reason"], proc.stderr[-3000:])
    assert gpu03["state"] == "done"
    assert loaded(ulab, "gpu03") == "580.126.20"
    pkgs = packages(ulab, "gpu03")
    assert (
        "datacenter-gpu-manager-4-cuda13" in pkgs and "datacenter-gpu-manager-4-cuda12" not in pkgs
    )


# ---- a batch wider than --max-unavailable, killed and resumed; `up` after the rollout ------------

TARGET = "580.126.20"
RECORD = "/var/lib/gpumon/nvidia-driver.json"


@pytest.fixture(scope="module")
def pinned(ulab, tmp_path_factory) -> str:
    """The lab's inventory with the GPU hosts' driver pinned to the baseline, as a site pins it."""
    data = yaml.safe_load(ulab.inventory_path.read_text())
    data["all"]["children"]["gpu"]["vars"] = {"nvidia_driver_version": BASELINE}
    path = tmp_path_factory.mktemp("pinned") / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def host_state(lab: Lab, host: str) -> str:
    """What a driver change would touch: the package database and apt's configuration."""
    return sh(lab, host, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'; "
              "find /etc/apt -type f -exec sha256sum {} + | sort; "
              "cat /proc/driver/nvidia/version 2>/dev/null")  # fmt: skip


def test_a_kill_in_a_batch_wider_than_max_unavailable_is_finished_by_one_resume(
    ulab, baseline, pinned, tmp_path
):
    proc = gpumon(
        "up", "-i", pinned, "--limit", ROLLED_LIMIT, "--out-of-service",
        "-e", "nvidia_driver_reboot=if_required",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    for h in ROLLED:
        assert loaded(ulab, h) == BASELINE
        assert ulab.ssh(h, f"test -e {RECORD}").returncode == 1  # another driver's: removed
    sh(ulab, "mon01", f"rm -rf {MARKERS}")

    env = {"GPUMON_ROLLOUT_STATE_DIR": str(tmp_path / "runs")}
    (tmp_path / "runs").mkdir()
    sampler = Sampler(tmp_path / "runs")
    sampler.start()
    args = (
        "upgrade-driver", "-i", pinned, "--to", TARGET, "--limit", ROLLED_LIMIT,
        "--canary", "1", "--batch-size", "2", "--max-unavailable", "1", *DRAIN_ARGS,
    )  # fmt: skip
    first = subprocess.Popen(
        [*CLI, *args], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    killed_at = None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and first.poll() is None:
        hosts = sampler.latest.get("hosts", {})
        states = [hosts.get(h, {}).get("state") for h in ("gpu02", "gpu03")]
        if hosts.get("gpu01", {}).get("state") == "done" and any(s in IN_FLIGHT for s in states):
            first.send_signal(signal.SIGKILL)
            killed_at = {h: r["state"] for h, r in hosts.items()}
            break
        time.sleep(0.2)
    first.wait(60)
    assert killed_at is not None, f"the run ended before it could be killed: {first.returncode}"
    # one host of the second batch in flight, the other not started (max-unavailable 1)
    assert sorted(killed_at[h] in IN_FLIGHT for h in ("gpu02", "gpu03")) == [False, True]
    assert "pending" in (killed_at["gpu02"], killed_at["gpu03"]), killed_at
    run = next((tmp_path / "runs").iterdir())
    boot_gpu01 = sh(ulab, "gpu01", "cat /proc/sys/kernel/random/boot_id")

    proc = gpumon("upgrade-driver", "-i", pinned, "--resume", run.name, "--output", "json", env=env)
    sampler.done.set()
    sampler.join(5)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["status"] == "finished", report["stop_reason"]
    hosts = report["hosts"]
    assert {h: hosts[h]["state"] for h in ROLLED} == dict.fromkeys(ROLLED, "done")
    assert sampler.samples > 20 and sampler.torn == 0
    assert sampler.most == 1  # never more than --max-unavailable out of service
    for h in ROLLED:
        steps = [s for s, _ in hosts[h]["history"]]
        assert steps.count("installing") == 1 and steps.count("draining") == 1, (h, steps)
        assert loaded(ulab, h) == TARGET
        record = json.loads(sh(ulab, h, f"cat {RECORD}"))
        assert (record["version"], record["run_id"]) == (TARGET, run.name)
        assert record["inventory"] == {"version": BASELINE, "branch": None}
    assert sh(ulab, "gpu01", "cat /proc/sys/kernel/random/boot_id") == boot_gpu01


def test_up_after_the_rollout_keeps_every_upgraded_driver_and_exits_0(ulab, baseline, pinned):
    assert {h: loaded(ulab, h) for h in ROLLED} == dict.fromkeys(ROLLED, TARGET)  # the rollout's
    before = {h: host_state(ulab, h) for h in ROLLED}
    proc = gpumon("up", "-i", pinned, "--limit", ROLLED_LIMIT, "--output", "json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    for h in ROLLED:
        assert f"NOTE {h}: keeps driver {TARGET} from upgrade-driver run" in proc.stderr
        changed = [t["task"] for t in report["hosts"][h]["tasks"]
                   if t["role"] == "nvidia_driver" and t["status"] != "ok"]  # fmt: skip
        assert changed == [], (h, changed)
    assert {h: host_state(ulab, h) for h in ROLLED} == before
    proc = gpumon("check", "-i", pinned, "--limit", ROLLED_LIMIT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"NOTE gpu03: keeps driver {TARGET}" in proc.stderr


def test_up_with_another_driver_on_a_live_host_is_refused_with_nothing_touched(
    ulab, baseline, pinned
):
    before = host_state(ulab, "gpu03")
    proc = gpumon("up", "-i", pinned, "--limit", "gpu03", "-e", "nvidia_driver_version=595.45.04")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"gpu03: driver {TARGET} is loaded" in proc.stderr
    assert "would install driver 595.45.04" in proc.stderr
    assert "upgrade-driver --to 595.45.04 --limit gpu03" in proc.stderr
    assert host_state(ulab, "gpu03") == before
    smi = sh(ulab, "gpu03", "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert set(smi.split()) == {TARGET}  # NVML works: no library under the loaded module changed
