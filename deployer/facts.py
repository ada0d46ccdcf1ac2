"""Host facts, gathered once per host per run with one read-only command.

OS family, version, architecture and kernel; GPUs (NVIDIA functions on the PCI bus, then
``nvidia-smi`` when present); the NVIDIA driver version installed (package), loaded
(``/proc/driver/nvidia/version``) and seen by ``nvidia-smi``, with a mismatch flagged as "reboot
required"; DCGM, dcgm-exporter and fabric manager package versions; NVSwitch presence; the CA
bundle the tier's clients on the host trust (``/etc/gpumon/tls/ca.pem``, when TLS reached it).

What nvidia-smi and /proc print is read as real hosts print it (tests/contract/test_facts.py runs
this script on the captures of ../shared/gpu_reality_fixtures): ``[N/A]`` memory or MIG mode on
boards without them (L40S: ``mig.mode.current`` is ``[N/A]``), ``Enabled`` on a GPU in MIG mode
(nvidia-smi --query-gpu lists the physical GPU once, its MIG devices not at all), and the NVML
mismatch of a host whose user-space driver was upgraded under a still-loaded older module:
``Failed to initialize NVML: Driver/library version mismatch`` then ``NVML library version:
610.43`` on stdout, exit status 18 (driver-misc/nvidia-smi-mismatch.txt). From R595 the
``driver_version`` query field is deprecated ("use kmd_version instead", a field R580 and R590 do
not know) and still answered, with the same version as ``kmd_version`` (the L40S 595.80 capture:
``595.80, 595.80``; the H200 610.43.02 one, proposed for ../shared: tests/reality.py
``PROPOSED``), so one query serves every branch; a driver that refuses it is asked for
``kmd_version`` in its place (``REFUSED_DRIVER_VERSION``).

``GPUMON_PROCFS`` (default /proc) says where the host's /proc is, as for the roles' check scripts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from deployer import debversion
from deployer.connection import CommandResult, Connection
from deployer.dpkg_arch import NATIVE_ARCH_KEY, NATIVE_ARCH_SCRIPT, dpkg_instance
from deployer.errors import FactsUnread

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class 0x0302 (3D controller) and 0x0300 (VGA) are GPUs; 0x0680 are NVSwitches.
_GPU_CLASSES = ("0x0302", "0x0300")

_SECTIONS = ("os", "pci", "smi", "smi_rc", "proc", "pkgs", "nvswitch")
# Read when printed, not required (a read of a script before it is whole without it): the CA
# bundle the tier's clients on the host trust (deployer/tls/material.py HOST_CA_FILE), read with
# shell builtins; deployer/tls/continuity.py compares it with the controller's directory.
_OPTIONAL = ("tls_ca",)
HOST_CA_FILE = "/etc/gpumon/tls/ca.pem"

# Every probe runs on every host on every run, so the script forks as little as it can: shell
# builtins read sysfs and /proc, one dpkg-query names the packages; nvidia-smi runs where it exists.
# dpkg-query parses dpkg's whole status file (18 ms on a host of 850 packages, nine tenths of this
# script), so it runs only where the status file names a package of those names (grep -F reads
# it in 3 ms): every package dpkg knows has its "Package:" stanza there (deb-status(5)), so a
# host without one (every monitoring host) skips it and one with one gets the same answer.
# Both read one list of names, so the test can never miss a package the query asks for.
_DPKG_NAMES = (
    "nvidia-",
    "cuda-drivers",
    "libnvidia-compute",
    "libnvidia-nscq",
    "datacenter-gpu-manager",
    "nvidia-fabricmanager",
)
FACTS_SCRIPT = r"""
echo '@@os'
if [ -r /etc/os-release ]; then . /etc/os-release; fi
printf 'id=%s\nversion_id=%s\nid_like=%s\npretty=%s\n' "${ID:-}" "${VERSION_ID:-}" "${ID_LIKE:-}" "${PRETTY_NAME:-}"
{ read -r kernel < /proc/sys/kernel/osrelease; } 2>/dev/null || kernel=$(uname -r)
printf 'arch=%s\nkernel=%s\n' "${HOSTTYPE:-$(uname -m)}" "$kernel"
if [ -e "/lib/modules/$kernel/build/include" ]; then echo 'kernel_headers=yes'; else echo 'kernel_headers=no'; fi
for c in /boot/config-*; do
  [ -f "$c" ] || continue; k=${c#/boot/config-}
  if [ -e "/lib/modules/$k/build/include" ]; then h=yes; elif [ -e "/lib/modules/$k" ]; then h=no; else h=gone; fi
  echo "installed_kernel=$k $h"
done
echo '@@pci'
for d in /sys/bus/pci/devices/*; do
  { read -r v < "$d/vendor"; } 2>/dev/null || continue
  [ "$v" = "0x10de" ] || continue
  { read -r c < "$d/class"; } 2>/dev/null || c=''
  { read -r dev < "$d/device"; } 2>/dev/null || dev=''
  printf '%s %s %s\n' "${d##*/}" "${c%??}" "$dev"
done
echo '@@smi'
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,mig.mode.current,driver_version --format=csv,noheader,nounits 2>&1)
  rc=$?
  case $out in @REFUSED_DRIVER_VERSION@)
    out=$(nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,mig.mode.current,kmd_version --format=csv,noheader,nounits 2>&1)
    rc=$? ;;
  esac
  printf '%s\n' "$out"
  echo "@@smi_rc"; echo "rc=$rc"
else
  echo "@@smi_rc"; echo "rc=absent"
fi
echo '@@proc'
procfs=${GPUMON_PROCFS:-/proc}
if [ -r "$procfs/driver/nvidia/version" ]; then cat "$procfs/driver/nvidia/version" 2>/dev/null; fi
echo '@@pkgs'
if command -v dpkg-query >/dev/null 2>&1; then
  status="${DPKG_ADMINDIR:-/var/lib/dpkg}/status"
  if [ ! -r "$status" ] || grep -qF @STATUS_NAMES@ "$status"; then
    @NATIVE_ARCH_SCRIPT@
    dpkg-query -W -f='${Package}\t${Version}\t${db:Status-Abbrev}\t${Architecture}\n' @DPKG_PATTERNS@ 2>/dev/null
  fi
fi
if command -v rpm >/dev/null 2>&1; then
  rpm -qa --qf '%{NAME}\t%{VERSION}-%{RELEASE}\tii \n' 2>/dev/null | grep -E '^(nvidia-|cuda-drivers|datacenter-gpu-manager)'
fi
echo '@@tls_ca'
if [ -r @HOST_CA_FILE@ ]; then
  echo present
  while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done < @HOST_CA_FILE@
fi
echo '@@nvswitch'
n=0
for x in "$procfs"/driver/nvidia-nvswitch/devices/*; do [ -e "$x" ] && n=$((n+1)); done
echo "$n"
true
"""
# nvidia-smi refusing a --query-gpu field its driver does not know: on stdout, exit 2
# (CoHDI/composable-resource-operator#37, a real run: 'Field "device_minor" is not a valid field to
# query.'). R595 and R610 deprecate driver_version for kmd_version and answer both alike (the
# captures above); a driver that drops it is asked for kmd_version in its place, the same column
# (docs/unverified.md#nvidia-smi-without-driver-version). A shell case pattern.
REFUSED_DRIVER_VERSION = """*'Field "driver_version" is not a valid field to query.'*"""
FACTS_SCRIPT = (
    FACTS_SCRIPT.replace("@STATUS_NAMES@", " ".join(f"-e 'Package: {n}'" for n in _DPKG_NAMES))
    .replace("@DPKG_PATTERNS@", " ".join(f"'{n}*'" for n in _DPKG_NAMES))
    .replace("@HOST_CA_FILE@", HOST_CA_FILE)
    .replace("@NATIVE_ARCH_SCRIPT@", NATIVE_ARCH_SCRIPT)
    .replace("@REFUSED_DRIVER_VERSION@", REFUSED_DRIVER_VERSION)
)

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Wed Apr 29 ..." (proprietary, both
# lines of driver-misc/proc-driver-nvidia-version.txt) and "NVRM version: NVIDIA UNIX Open Kernel
# Module for x86_64  580.126.09 ..." (open: docs/unverified.md#proc-version-open-module)
_PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(?P<v>\d+\.\d+(?:\.\d+)?)")
_VERSION_IN_PKG = re.compile(r"^(?:\d+:)?(?P<v>\d+\.\d+(?:\.\d+)?)")
# nvidia-smi when the user-space driver and the loaded module differ (driver-misc/
# nvidia-smi-mismatch.txt): the NVML library's version is the new, installed one
_NVML_MISMATCH = re.compile(r"^Failed to initialize NVML: Driver/library version mismatch", re.M)
_NVML_LIBRARY = re.compile(r"^NVML library version: (?P<v>\d+\.\d+(?:\.\d+)?)\s*$", re.M)


@dataclass
class GPU:
    index: int
    uuid: str
    name: str
    memory_mib: int | None  # None: nvidia-smi printed [N/A]
    pci_bus_id: str
    mig_mode: str  # as nvidia-smi printed it: Enabled, Disabled, [N/A] (no MIG on the board)
    mig_enabled: bool = False


@dataclass
class HostFacts:
    host: str
    os_id: str = ""
    os_family: str = ""
    os_version: str = ""
    arch: str = ""
    kernel: str = ""
    # the running kernel's headers are where DKMS builds against (``/lib/modules/<kernel>/build/
    # include``, the test of Debian's dkms ``common.postinst``); None: not read
    kernel_headers: bool | None = None
    # The newer installed kernel Debian's dkms also builds the module for (``newest_kernel``; ""
    # when none), which a reboot may boot, and whether its headers are there (None: not read)
    newest_kernel: str = ""
    newest_kernel_headers: bool | None = None
    nvidia_pci_gpus: int = 0
    # PCI device ids of those GPUs (sysfs ``device``, e.g. "2330"): the model before any driver
    nvidia_pci_gpu_ids: list[str] = field(default_factory=list)
    nvidia_pci_switches: int = 0
    gpus: list[GPU] = field(default_factory=list)
    nvidia_smi: str = "absent"  # absent | ok | error
    nvidia_smi_error: str | None = None
    nvml_mismatch: bool = False  # nvidia-smi: "Driver/library version mismatch"
    nvml_library_version: str | None = None  # the user-space NVML's version it then names
    driver_installed: str | None = None  # from the package
    driver_loaded: str | None = None  # from /proc/driver/nvidia/version
    driver_smi: str | None = None  # from nvidia-smi
    kernel_module_flavour: str | None = None  # open | proprietary (of the loaded module)
    reboot_required: bool = False
    # installed NVIDIA packages -> version: the instance apt means by the plain name (the native
    # architecture's, or Architecture: all), which is what the host runs
    packages: dict[str, str] = field(default_factory=dict)
    # installed instances of another architecture ("libnvidia-compute-535:i386" -> version):
    # never the host's driver, but a driver switch removes them with their package
    foreign_packages: dict[str, str] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)  # packages with a held instance
    dcgm_version: str | None = None
    dcgm_package: str | None = None
    exporter_version: str | None = None
    fabricmanager_version: str | None = None
    nvswitch: bool = False
    # HOST_CA_FILE's content (None: the host has none: the tier's TLS never reached it)
    tls_ca_pem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def gpu_names(self) -> tuple[list[str], str]:
        """The host's GPUs as names a model is read from, and where they were read: nvidia-smi's
        names when it answers, else the PCI device ids (``10de:<id>``, which the matrix's
        ``pci_ids`` resolve) of a host without a working driver; empty when neither shows one."""
        if self.gpus:
            return [g.name for g in self.gpus], "nvidia-smi"
        if self.nvidia_pci_gpu_ids:
            return [f"10de:{i}" for i in self.nvidia_pci_gpu_ids], "the PCI bus"
        return [], ""


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s: [] for s in (*_SECTIONS, *_OPTIONAL)}
    current = None
    for line in text.splitlines():
        if line.startswith("@@") and line[2:] in out:
            current = line[2:]
            continue
        if current is not None:
            out[current].append(line)
    return out


def _family(os_id: str, id_like: str) -> str:
    ids = {os_id, *id_like.split()}
    if ids & {"debian", "ubuntu"}:
        return "debian"
    if ids & {"rhel", "fedora", "centos", "rocky", "almalinux"}:
        return "redhat"
    return os_id or "unknown"


def _upstream_version(pkg_version: str) -> str | None:
    m = _VERSION_IN_PKG.match(pkg_version)
    return m.group("v") if m else None


def _version_and_abi(release: str) -> str:
    """``VERSION-ABI`` of a kernel release (``6.1.0-28-amd64``: ``6.1.0-28``), as dkms cuts it:
    ``${K%%-*}``, then the part after the first ``-`` up to the next (the whole release when it
    has no ``-``, as the shell's ``${K#*-}`` leaves it)."""
    version = release.split("-", 1)[0]
    abi = release.split("-", 1)[1] if "-" in release else release
    return f"{version}-{abi.split('-', 1)[0]}"


def newest_kernel(running: str, installed: Iterable[str]) -> str:
    """The kernel Debian's dkms builds a module for besides the running one, "" when none: of
    the releases with a ``/boot/config-<release>`` (``installed``, in the shell's glob order),
    the last whose ``VERSION-ABI`` is at least the running kernel's and every earlier pick's
    (dkms 3.0.10-8+deb12u1, ``/usr/lib/dkms/common.postinst``: ``_get_newest_kernel_debian``,
    ``dpkg --compare-versions ... ge``; ``KERNELS="$CURRENT_KERNEL $NEWEST_KERNEL"`` when they
    differ; a newest without ``/lib/modules/<release>`` is none, which the caller checks)."""
    newest = ""
    floor = _version_and_abi(running)
    for release in installed:
        if debversion.compare(_version_and_abi(release), floor) >= 0:
            newest, floor = release, _version_and_abi(release)
    return "" if newest == running else newest


def parse_facts(host: str, result: CommandResult) -> HostFacts:
    """Facts from the output of FACTS_SCRIPT (pure; unit-tested on captured outputs)."""
    s = _sections(result.stdout)
    f = HostFacts(host=host)
    kv = dict(line.split("=", 1) for line in s["os"] if "=" in line)
    f.os_id, f.os_version = kv.get("id", ""), kv.get("version_id", "")
    f.os_family = _family(f.os_id, kv.get("id_like", ""))
    f.arch, f.kernel = kv.get("arch", ""), kv.get("kernel", "")
    if "kernel_headers" in kv:
        f.kernel_headers = kv["kernel_headers"] == "yes"
    # release -> yes (its headers are there) | no (its modules directory, no headers) | gone
    installed = {}
    for line in s["os"]:
        if line.startswith("installed_kernel="):
            release, _, state = line[len("installed_kernel=") :].partition(" ")
            installed[release] = state
    newest = newest_kernel(f.kernel, installed)
    if newest and installed[newest] != "gone":  # dkms: no /lib/modules/<newest>, no newest
        f.newest_kernel, f.newest_kernel_headers = newest, installed[newest] == "yes"
    for line in s["pci"]:
        parts = line.split()
        if len(parts) in (2, 3):
            if parts[1] in _GPU_CLASSES:
                f.nvidia_pci_gpus += 1
                if len(parts) == 3:
                    f.nvidia_pci_gpu_ids.append(parts[2].lower().removeprefix("0x"))
            elif parts[1] == "0x0680":
                f.nvidia_pci_switches += 1
    smi_rc = "".join(s["smi_rc"]).strip().removeprefix("rc=")
    if smi_rc == "absent":
        f.nvidia_smi = "absent"
    elif smi_rc == "0":
        f.nvidia_smi = "ok"
        for line in s["smi"]:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) < 7 or not cols[0].isdigit():
                continue
            mem = cols[3].split()[0] if cols[3] else ""
            f.gpus.append(
                GPU(
                    index=int(cols[0]),
                    uuid=cols[1],
                    name=cols[2],
                    memory_mib=int(mem) if mem.isdigit() else None,
                    pci_bus_id=cols[4],
                    mig_mode=cols[5],
                    mig_enabled=cols[5] == "Enabled",
                )
            )
            f.driver_smi = cols[6]
    else:
        f.nvidia_smi = "error"
        text = "\n".join(s["smi"]).strip()
        f.nvidia_smi_error = text or f"exit status {smi_rc}"
        f.nvml_mismatch = bool(_NVML_MISMATCH.search(text))
        lib = _NVML_LIBRARY.search(text)
        f.nvml_library_version = lib.group("v") if lib else None
    proc = "\n".join(s["proc"])
    m = _PROC_VERSION.search(proc)
    if m:
        f.driver_loaded = m.group("v")
        f.kernel_module_flavour = "open" if "Open Kernel Module" in proc else "proprietary"
    _read_packages(f, s["pkgs"])
    _derive_versions(f)
    f.nvswitch = (("".join(s["nvswitch"]).strip() or "0") != "0") or f.nvidia_pci_switches > 0
    if s["tls_ca"][:1] == ["present"]:
        f.tls_ca_pem = "".join(line + "\n" for line in s["tls_ca"][1:])
    return f


def _read_packages(f: HostFacts, lines: list[str]) -> None:
    """The installed instances dpkg-query (or rpm) listed: the one apt means by a package's plain
    name (deployer/dpkg_arch.py) in ``packages``, every other architecture's in
    ``foreign_packages``; a package any of whose instances is held in ``held``, once."""
    native = ""
    installed: dict[str, str] = {}  # "name:arch" -> version
    for line in lines:
        if line.startswith(f"{NATIVE_ARCH_KEY}="):
            native = line.partition("=")[2].strip()
            continue
        parts = line.split("\t")
        if len(parts) < 3 or not parts[2].startswith(("ii", "hi")):
            continue
        name, version = parts[0], parts[1]
        # rpm's lines carry no architecture: the package as the host names it
        installed[f"{name}:{parts[3].strip() if len(parts) > 3 else native}"] = version
        if parts[2].startswith("hi") and name not in f.held:
            f.held.append(name)
    keys = {key: key for key in installed}
    for key, version in installed.items():
        name = key.partition(":")[0]
        if dpkg_instance(keys, name, native) == key:
            f.packages[name] = version
        else:
            f.foreign_packages[key] = version


def _derive_versions(f: HostFacts) -> None:
    for name in ("nvidia-open", "cuda-drivers", "libnvidia-compute"):
        if name in f.packages:
            f.driver_installed = _upstream_version(f.packages[name])
            break
    else:
        for name, version in f.packages.items():
            if name.startswith("libnvidia-compute-"):
                f.driver_installed = _upstream_version(version)
                break
    for name, version in f.packages.items():
        if name.startswith("datacenter-gpu-manager-4-cuda") or (
            name.startswith("datacenter-gpu-manager")
            and f.dcgm_package is None
            and "exporter" not in name
        ):
            f.dcgm_package = name
            f.dcgm_version = _upstream_version(version)
        elif name == "datacenter-gpu-manager-exporter":
            f.exporter_version = _upstream_version(version)
        elif name.startswith("nvidia-fabricmanager") and not name.endswith("-dev"):
            f.fabricmanager_version = _upstream_version(version)
    seen = {v for v in (f.driver_installed, f.driver_loaded, f.driver_smi) if v}
    f.reboot_required = len(seen) > 1 or f.nvml_mismatch


def unfinished(result: CommandResult) -> str | None:
    """Why ``result`` is not a whole read of FACTS_SCRIPT (a section it always prints is missing:
    the script stopped early, or never ran), None when it is whole. Parsed anyway, a cut read is
    a host without an OS or an architecture: a template error far from its cause."""
    lines = set(result.stdout.splitlines())
    missing = next((s for s in _SECTIONS if f"@@{s}" not in lines), None)
    if missing is None:
        return None
    said = (result.stderr.strip().splitlines() or [""])[-1].strip()[:200]
    return f"the facts script stopped before its {missing!r} section (exit {result.rc})" + (
        f": {said}" if said else ""
    )


def gather(conn: Connection) -> HostFacts:
    """The host's facts. A cut read is read once more (the script only reads; a fork that
    failed under load may not fail again); cut twice, :class:`FactsUnread` says why."""
    result = conn.run(FACTS_SCRIPT)
    if unfinished(result) is not None:
        result = conn.run(FACTS_SCRIPT)
        why = unfinished(result)
        if why is not None:
            raise FactsUnread(why)
    return parse_facts(conn.name, result)
