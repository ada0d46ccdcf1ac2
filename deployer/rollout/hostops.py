"""What the rollout runs on a GPU host itself: the GPU-job probe, stopping the GPU services,
rebooting or reloading the kernel modules, and the read-only validation probe.

Shell text only (built here, unit-tested as text); the controller runs it over the host's SSH
connection. Order of the stop and the reload follows NVIDIA's driver-container unload sequence
(nvidia-driver.md §7): the exporter and DCGM hold /dev/nvidia* open, then persistenced and
Fabric Manager; modules unload only when nothing holds them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from deployer import dcgm_fields
from deployer.connection import CommandResult
from deployer.facts import REFUSED_DRIVER_VERSION

# Compute processes on the GPUs (one CSV line each; nothing when idle). rc!=0: nvidia-smi failed.
COMPUTE_APPS = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"

# Stopped before the packages change, in this order (dcgm-exporter first: it talks to
# nv-hostengine; nvidia-dcgm-exporter is the CUDA repository package's own unit).
GPU_SERVICES = (
    "dcgm-exporter.service",
    "nvidia-dcgm-exporter.service",
    "nvidia-dcgm.service",
    "nvidia-persistenced.service",
    "nvidia-fabricmanager.service",
)


def stop_services_script(services: tuple[str, ...] = GPU_SERVICES) -> str:
    """Stop every unit of ``services`` that exists; fail naming a unit that will not stop."""
    names = " ".join(shlex.quote(s) for s in services)
    return (
        f"for u in {names}; do\n"
        '  systemctl cat "$u" >/dev/null 2>&1 || continue\n'
        '  systemctl stop "$u" || { echo "cannot stop $u" >&2; exit 1; }\n'
        '  if systemctl is-active --quiet "$u"; then echo "$u still active" >&2; exit 1; fi\n'
        "done"
    )


LOADED_DRIVER = (
    "cat /sys/module/nvidia/version 2>/dev/null || "
    "grep -m1 NVRM /proc/driver/nvidia/version 2>/dev/null | "
    "grep -oE '[0-9]+\\.[0-9]+(\\.[0-9]+)?' | head -n1"
)

# nvidia-driver.md §7: refuse when a module is in use, then unload and load again.
RELOAD_MODULES = r"""
set -u
for m in nvidia_uvm nvidia_modeset nvidia_drm nvidia_peermem; do
  r=$(cat /sys/module/$m/refcnt 2>/dev/null || echo 0)
  if [ "$r" -gt 0 ]; then echo "module $m is in use (refcnt $r): reboot instead" >&2; exit 1; fi
done
for m in nvidia_drm nvidia_modeset nvidia_uvm nvidia_peermem nvidia; do
  if [ -d /sys/module/$m ]; then rmmod $m || { echo "rmmod $m failed" >&2; exit 1; }; fi
done
modprobe nvidia && modprobe nvidia_uvm && modprobe nvidia_modeset
"""


@dataclass(frozen=True)
class ValidationProbe:
    """What the host itself says after the upgrade (parsed from ``PROBE`` output)."""

    loaded: str | None
    smi_rc: int
    smi_versions: tuple[str, ...]
    smi_uuids: tuple[str, ...]
    smi_error: str
    health_rc: int
    health_output: str
    diag_rc: int | None
    diag_output: str


# DCGM's health watches, set before the probe (after a reboot nv-hostengine watches nothing:
# ``health -c`` then exits 253, "Health watches not enabled"). What ``health -c`` reports right
# after ``-s`` (NVIDIA/DCGM at v4.6.0, 51b65ccebf9d): ``SetWatches`` ends with
# ``UpdateAllFields(1)`` (modules/health/DcgmHealthWatch.cpp:497-502), so each watched field has
# exactly one sample, and ``dcgmHealthCheck`` asks with startTime 0 (dcgmlib/src/DcgmApi.cpp:
# 3366-3367), which every rate check turns into "now - 60 s" and compares the first sample in
# that minute with the latest one: PCIe replays (MonitorPcie, DcgmHealthWatch.cpp:1588-1684),
# thermal and power violation time (MonitorThermal :2345-2415, MonitorPower :2418-2504), NVLink
# error counters. With one sample the difference is 0 -- "Healthy" without having looked -- and a
# field with no sample yet is DCGM_ST_NO_DATA, also no incident (:1617-1621). The watched fields
# update every 30 s at the least (MIN_HEALTH_WATCH_UPDATE_INTERVAL_US, :36-37; ``-u`` default 30.0,
# dcgmi/CommandLineParser.cpp:1253-1258), and dcgmi's own help says of the m, n, p and t watches
# "(*) watch requires 60 sec before first query" (CommandLineParser.cpp:1246; dcgm.md §6). Only
# the latest-value checks (volatile DBEs, retired pages, row remapping, InfoROM, XIDs) see a
# fault at once. The same at v4.4.2 (UpdateAllFields(1) at :337, the one-minute windows).
HEALTH_WATCH = "dcgmi health -s a"
HEALTH_SETTLE_S = 60.0


def health_watch_script() -> str:
    """Set every health watch; fails (non-zero, DCGM's message on stdout/stderr) when it cannot."""
    return f"{HEALTH_WATCH} 2>&1"


def probe_script(diag_level: int) -> str:
    """One read-only script: loaded module, nvidia-smi GPUs and versions, ``dcgmi health -c``
    (the watches set ``HEALTH_SETTLE_S`` before: ``health_watch_script``), then diag (after the
    health check, whose one-minute window must not hold the diag's own load)."""
    diag = (
        f'out=$(dcgmi diag -r {int(diag_level)} 2>&1); echo "@@diag_rc=$?"; printf "%s\\n" "$out"'
        if diag_level > 0
        else 'echo "@@diag_rc=skipped"'
    )
    return "\n".join(
        [
            'echo "@@loaded"',
            f"{{ {LOADED_DRIVER}; }} || true",
            'echo "@@smi"',
            "out=$(nvidia-smi --query-gpu=driver_version,uuid --format=csv,noheader 2>&1); rc=$?; "
            f"case $out in {REFUSED_DRIVER_VERSION}) "
            "out=$(nvidia-smi --query-gpu=kmd_version,uuid --format=csv,noheader 2>&1); rc=$? ;; "
            "esac; "
            'printf "%s\\n" "$out"; echo "@@smi_rc=$rc"',
            'echo "@@health"',
            'out=$(dcgmi health -c 2>&1); rc=$?; printf "%s\\n" "$out"; echo "@@health_rc=$rc"',
            'echo "@@diag"',
            diag,
            "true",
        ]
    )


_RC = re.compile(r"^@@(\w+)_rc=(\S+)$")


def parse_probe(stdout: str) -> ValidationProbe:
    sections: dict[str, list[str]] = {}
    rcs: dict[str, str] = {}
    current = None
    for line in stdout.splitlines():
        m = _RC.match(line)
        if m:
            rcs[m.group(1)] = m.group(2)
            continue
        if line.startswith("@@"):
            current = line[2:]
            sections[current] = []
            continue
        if current is not None:
            sections[current].append(line)
    loaded = next((x.strip() for x in sections.get("loaded", []) if x.strip()), None)
    smi_rc = int(rcs.get("smi", "1"))
    versions, uuids = [], []
    if smi_rc == 0:
        for line in sections.get("smi", []):
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[1]:
                versions.append(parts[0])
                uuids.append(parts[1])
    diag_rc = rcs.get("diag", "skipped")
    return ValidationProbe(
        loaded=loaded,
        smi_rc=smi_rc,
        smi_versions=tuple(versions),
        smi_uuids=tuple(uuids),
        smi_error="" if smi_rc == 0 else "\n".join(sections.get("smi", [])).strip(),
        health_rc=int(rcs.get("health", "1")),
        health_output="\n".join(sections.get("health", [])).strip(),
        diag_rc=None if diag_rc == "skipped" else int(diag_rc),
        diag_output="\n".join(sections.get("diag", [])).strip(),
    )


def scrape_script(url: str, basic_auth: bool) -> str:
    """Scrape the exporter from the host itself (credentials, if any, on stdin as a curl config)."""
    auth = " -K -" if basic_auth else ""
    insecure = " -k" if url.startswith("https:") else ""
    return f"curl -sS --max-time 10{insecure}{auth} --fail -- {shlex.quote(url)}"


_UUID_LABEL = re.compile(r'[{,]UUID="([^"]*)"')


def driver_label(exporter_tag: str | None = None) -> str:
    """The label the exporter writes the driver version in: the field registry's name for it as
    that exporter version's CSV names it (the metric name where it accepts it)."""
    field = dcgm_fields.FIELDS_BY_KEY["driver_version"]
    return dcgm_fields.csv_name(field, exporter_tag) or field.metric


def exporter_driver_labels(metrics: str, label: str | None = None) -> tuple[set[str], set[str]]:
    """(driver versions in the driver-version labels, GPU UUIDs) of a /metrics body; ``label``
    defaults to the registry's metric name for the field. UUIDs are GPUs: a GPU in MIG mode has
    one series per GPU instance, all with the GPU's UUID."""
    pattern = re.compile(r"[{,]" + re.escape(label or driver_label()) + r'="([^"]*)"')
    drivers, uuids = set(), set()
    for line in metrics.splitlines():
        if line.startswith("#"):
            continue
        drivers.update(pattern.findall(line))
        uuids.update(_UUID_LABEL.findall(line))
    return drivers, uuids


def jobs_script(driver_check: str) -> str:
    """Exit 0 when no GPU compute process runs, 3 (listing them) when some do, other on error.

    The nvidia_driver role's check script answers even when nvidia-smi cannot (a driver/library
    mismatch): it then looks for processes holding /dev/nvidia* open. Without it, nvidia-smi.
    """
    c = shlex.quote(driver_check)
    return (
        f"if [ -x {c} ]; then if {c} busy; then exit 3; fi; exit 0; fi\n"
        f"out=$({COMPUTE_APPS}) || {{ printf '%s\\n' \"$out\" >&2; exit 2; }}\n"
        'if [ -n "$out" ]; then printf \'%s\\n\' "$out"; exit 3; fi'
    )


def output_tail(result: CommandResult, lines: int = 3) -> str:
    """The last ``lines`` lines a host's command said (its stderr, else its stdout), for an error."""
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return " | ".join(text[-lines:]) or f"exit status {result.rc}"
