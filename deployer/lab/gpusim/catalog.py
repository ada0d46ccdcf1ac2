"""What the SIMULATED NVIDIA repository holds: driver releases, DCGM and dcgm-exporter
releases, and the Debian packages (names, versions, relations, contents) each one becomes.

Names and version strings follow NVIDIA's Debian 12 CUDA repository as the references describe it
(/work/shared/reference/nvidia-driver.md section 4, dcgm.md section 2, dcgm-exporter.md section 1).
The contents are small Python stand-ins; every package says SIMULATED in its Description.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

from deployer.lab.gpusim import exporter_fields

ARCH = "amd64"
MAINTAINER = "gpumon-deploy lab (SIMULATED packages) <gpusim@gpumon-lab.invalid>"
HOMEPAGE = "https://developer.nvidia.com/"
SIM_LINE = (
    " SIMULATED: a stand-in built by the gpumon-deploy lab for testing without GPUs. It carries the\n"
    " real package name and version but contains small Python programs, not NVIDIA software.\n"
    " Never install it on a real GPU host."
)
DATA = Path(__file__).parent / "data"
STANDINS = Path(__file__).parent / "standins"


@dataclass(frozen=True)
class DriverRelease:
    version: str  # e.g. 580.65.06
    cuda: str  # nvidia-smi "CUDA Version"
    build_date: str  # the date in /proc/driver/nvidia/version

    @property
    def branch(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def deb_version(self) -> str:
        return f"{self.version}-1"

    @property
    def has_pinning(self) -> bool:
        # "All releases beyond driver version 570 will use these packaging conventions"
        return self.branch > 570

    @property
    def unversioned_fabricmanager(self) -> bool:
        return self.branch >= 580


DRIVERS: tuple[DriverRelease, ...] = (
    DriverRelease("535.54.03", "12.2", "Tue Jun  6 22:20:39 UTC 2023"),
    DriverRelease("570.133.20", "12.8", "Fri Apr 11 20:33:58 UTC 2025"),
    DriverRelease("580.65.06", "13.0", "Sun Jul 27 06:54:38 UTC 2025"),
    DriverRelease("580.126.20", "13.0", "Thu Jan 15 09:01:11 UTC 2026"),
    # a real R580 release past the matrix's newest (deployer/data/compat.yml), as the real line
    # of gpu_reality_fixtures/driver-misc/proc-driver-nvidia-version.txt prints it: the lab's
    # host already ahead of what a branch resolves to (driver-downgrade). Its "CUDA Version" is
    # R580's, not read from a capture of it: docs/unverified.md#gpusim-r580-159
    DriverRelease("580.159.04", "13.0", "Wed Apr 29 17:32:45 UTC 2026"),
    # the release of the H100/H200 captures (gpu_reality_fixtures/nvidia_gpu_exporter/*590.48.01*:
    # "CUDA Version : 13.1"), so the reality tests run the simulator at the captured version
    DriverRelease("590.48.01", "13.1", "Mon Dec  8 18:44:40 UTC 2025"),
    DriverRelease("595.45.04", "13.2", "Tue Mar 10 18:12:40 UTC 2026"),
    # the release of the H200 R610 captures (proposed for ../shared: tests/reality.py PROPOSED;
    # "CUDA UMD Version : 13.3"); its build date is not in them: docs/unverified.md#gpusim-r610
    DriverRelease("610.43.02", "13.3", "Tue Jul 28 20:17:42 UTC 2026"),
)


@dataclass(frozen=True)
class DcgmRelease:
    version: str  # e.g. 4.4.2
    build_date: str

    @property
    def deb_version(self) -> str:
        return f"1:{self.version}-1"


DCGMS: tuple[DcgmRelease, ...] = (
    DcgmRelease("4.4.2", "2025-10-08"),
    DcgmRelease("4.5.3", "2026-02-20"),
    # The newest pair the compatibility matrix knows (dcgm-exporter.md §1: 4.6.0-4.8.3), so the
    # product's defaults install on the lab without version overrides.
    DcgmRelease("4.6.0", "2026-07-15"),
)


@dataclass(frozen=True)
class ExporterRelease:
    dcgm: str  # DCGM version it was built against (tag prefix)
    version: str  # exporter version
    #: label name of the host: "Hostname" up to 4.5.3-4.8.2 (internal/pkg/rendermetrics/
    #: render_metrics.go:47 @691c927), "hostname" from NVIDIA/dcgm-exporter d5e5f51 (#655),
    #: released in 4.6.0-4.8.3 (shared/reference/dcgm-exporter.md section 5, [X2])
    hostname_label: str = "Hostname"
    #: --hpc-job-mapping-dir: which file names label which series. "gpu": names strconv.Atoi
    #: accepts, keyed on the gpu label for every series, a MIG GPU's instances included
    #: (internal/pkg/transformation/hpc.go:97,176 @b921c57, tag 4.4.2-4.7.1); "gpu_or_instance":
    #: names matching ^\d+(\.\d+)?$, an instance's series keyed "<gpu>.<GPU_I_ID>"
    #: (hpc.go:98-105,165 @691c927, tag 4.5.3-4.8.2, NVIDIA/dcgm-exporter#602; 4.8.3:
    #: docs/unverified.md#exporter-4-8-3-hpc)
    hpc_job_files: str = "gpu_or_instance"

    @property
    def tag(self) -> str:
        return f"{self.dcgm}-{self.version}"

    @property
    def deb_version(self) -> str:
        return f"{self.version}-1"


EXPORTERS: tuple[ExporterRelease, ...] = (
    ExporterRelease("4.4.2", "4.7.1", hpc_job_files="gpu"),
    ExporterRelease("4.5.3", "4.8.2"),
    ExporterRelease("4.6.0", "4.8.3", hostname_label="hostname"),
)


@dataclass
class Deb:
    """One Debian binary package: control fields, files and maintainer scripts."""

    name: str
    version: str
    summary: str
    depends: list[str] = field(default_factory=list)
    pre_depends: list[str] = field(default_factory=list)
    recommends: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    section: str = "non-free/libs"
    arch: str = ARCH
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    conffiles: list[str] = field(default_factory=list)
    scripts: dict[str, str] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        upstream = self.version.split(":", 1)[-1]
        return f"{self.name}_{upstream}_{self.arch}.deb"

    def add(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        data = content.encode() if isinstance(content, str) else content
        self.files[path] = (data, mode)

    def add_json(self, path: str, obj: dict) -> None:
        self.add(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")

    def add_tools(
        self, module: str, tools: dict[str, str], build: dict, parts: tuple[str, ...] = ()
    ) -> None:
        """Install stand-in executables: ``tools`` maps an installed path to an entry function
        of ``standins/<module>.py``; the module, the ``parts`` it imports (``standins/<part>.py``
        each), the shared code and ``build`` go to a private directory of this package."""
        libdir = f"/usr/lib/gpusim/{self.name}"
        self.add(f"{libdir}/gpusim_common.py", (STANDINS / "common.py").read_bytes())
        for name in (module, *parts):
            self.add(f"{libdir}/gpusim_{name}.py", (STANDINS / f"{name}.py").read_bytes())
        self.add_json(f"{libdir}/build.json", {"package": self.name, **build})
        for exe, func in tools.items():
            depth = exe.count("/") - 1
            up = "/".join([".."] * depth)
            self.add(
                exe, _launcher(exe, self.name, self.version, module, func, f"{up}{libdir}"), 0o755
            )
        if "python3" not in self.depends:
            self.depends.append("python3")


def _launcher(exe: str, package: str, version: str, module: str, func: str, rel_lib: str) -> str:
    tool = exe.rsplit("/", 1)[-1]
    return f"""#!/usr/bin/python3
# SIMULATED {tool}: a stand-in from the gpumon-deploy lab ({package} {version}).
# Not NVIDIA software; it answers from /etc/gpusim and /var/lib/gpusim on this host.
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(__file__)),
                                                 "{rel_lib}")))
import gpusim_{module} as tool  # noqa: E402

sys.exit(tool.{func}(sys.argv[1:]))
"""


# --- maintainer scripts ----------------------------------------------------------------------


def _postinst(body: str) -> str:
    return f"#!/bin/sh\n# SIMULATED package (gpumon-deploy lab)\nset -e\n{body}\nexit 0\n"


def _service_scripts(deb: Deb, units: list[str], *, start_on_install: bool = False,
                     restart_on_upgrade: bool = False, users: tuple[str, ...] = ()) -> None:  # fmt: skip
    lines = ['if [ "$1" = configure ]; then']
    for user in users:
        lines.append(f"  getent passwd {user} >/dev/null || useradd --system --no-create-home "
                     f"--shell /usr/sbin/nologin {user} || true")  # fmt: skip
    lines.append("  if [ -d /run/systemd/system ]; then")
    lines.append("    systemctl daemon-reload >/dev/null 2>&1 || true")
    for unit in units:
        if start_on_install:
            lines.append(
                f'    if [ -z "$2" ]; then systemctl enable --now {unit} >/dev/null 2>&1 || true; fi'
            )
        if restart_on_upgrade:
            lines.append(
                f'    if [ -n "$2" ]; then systemctl try-restart {unit} >/dev/null 2>&1 || true; fi'
            )
    lines.append("  fi")
    lines.append("fi")
    deb.scripts["postinst"] = _postinst("\n".join(lines))
    stops = "\n".join(f"    systemctl stop {u} >/dev/null 2>&1 || true" for u in units)
    deb.scripts["prerm"] = _postinst(
        f'if [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n{stops}\nfi'
    )
    deb.scripts["postrm"] = _postinst(
        "if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi"
    )


def _unit(description: str, service: str, install: str = "WantedBy=multi-user.target",
          unit_extra: str = "") -> str:  # fmt: skip
    return (f"# SIMULATED unit from the gpumon-deploy lab (stand-in for NVIDIA's)\n[Unit]\n"
            f"Description={description} (SIMULATED, gpumon-deploy lab)\n{unit_extra}\n"
            f"[Service]\n{service}\n\n[Install]\n{install}\n")  # fmt: skip


MODULE_UNIT = "gpusim-nvidia-module.service"
DKMS_TOOL = "/usr/libexec/gpusim/nvidia-dkms"
HEADER_HOOK = "/etc/kernel/header_postinst.d/gpusim-nvidia-dkms"
DAEMON_UNITS = ("nvidia-persistenced.service nvidia-dcgm.service nvidia-fabricmanager.service "
                "nvidia-dcgm-exporter.service")  # fmt: skip


# --- driver packages -------------------------------------------------------------------------


def driver_packages(d: DriverRelease) -> list[Deb]:
    v, b = d.deb_version, d.branch
    eq = f"(= {v})"
    build = {"version": d.version, "cuda_version": d.cuda, "build_dates": {d.version: d.build_date}}
    debs: list[Deb] = []

    nvml = Deb("libnvidia-ml1", v, "NVIDIA Management Library (NVML) runtime library")
    nvml.add_json("/usr/lib/gpusim/libnvidia-ml.json", {"version": d.version})
    debs.append(nvml)

    cuda = Deb("libcuda1", v, f"NVIDIA CUDA Driver Library (CUDA {d.cuda})")
    cuda.add_json("/usr/lib/gpusim/libcuda.json", {"version": d.version, "cuda_version": d.cuda})
    debs.append(cuda)

    smi = Deb("nvidia-smi", v, "NVIDIA System Management Interface", depends=[f"libnvidia-ml1 {eq}"],
              section="non-free/utils")  # fmt: skip
    smi.add_tools("nvidia_smi", {"/usr/bin/nvidia-smi": "main"}, build,
                  parts=("smi_format", "smi_query", "smi_table", "smi_report"))  # fmt: skip
    debs.append(smi)

    pers = Deb("nvidia-persistenced", v, "daemon to maintain persistent software state in the NVIDIA driver",
               depends=[f"libnvidia-ml1 {eq}"], section="non-free/utils")  # fmt: skip
    pers.add_tools("daemons", {"/usr/bin/nvidia-persistenced": "persistenced_main"}, build)
    pers.add("/usr/lib/systemd/system/nvidia-persistenced.service", _unit(
        "NVIDIA Persistence Daemon",
        "Type=forking\nExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced "
        "--no-persistence-mode --verbose\nExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n"
        "PIDFile=/run/nvidia-persistenced/nvidia-persistenced.pid",
        unit_extra=f"Wants=syslog.target\nAfter={MODULE_UNIT}"))  # fmt: skip
    _service_scripts(pers, ["nvidia-persistenced.service"], start_on_install=True,
                     restart_on_upgrade=True, users=("nvidia-persistenced",))  # fmt: skip
    debs.append(pers)

    for flavour, name in (
        ("proprietary", "nvidia-kernel-dkms"),
        ("open", "nvidia-kernel-open-dkms"),
    ):
        words = "open GPU kernel modules" if flavour == "open" else "kernel module (proprietary)"
        k = Deb(name, v, f"NVIDIA binary {words} DKMS source",
                provides=[f"nvidia-kernel-dkms-any {eq}", f"nvidia-kernel-{d.version}"],
                conflicts=["nvidia-kernel-dkms-any"], replaces=["nvidia-kernel-dkms-any"],
                section="non-free/kernel")  # fmt: skip
        k.add_json("/usr/lib/gpusim/nvidia-kernel.json", {"version": d.version, "flavour": flavour})
        k.add_tools(
            "daemons", {"/usr/libexec/gpusim/nvidia-module-load": "module_load_main"}, build
        )
        k.add_tools("dkms", {DKMS_TOOL: "main"}, build)
        # dkms' hook a kernel's headers package runs (Debian's linux-headers postinst: run-parts
        # /etc/kernel/header_postinst.d), as /etc/kernel/header_postinst.d/dkms does
        k.add(HEADER_HOOK, f"#!/bin/sh\n# SIMULATED (gpumon-deploy lab): builds the simulated NVIDIA "
                           f"module for a kernel whose headers were just installed\n"
                           f'exec {DKMS_TOOL} kernel "$1"\n', 0o755)  # fmt: skip
        k.add(f"/usr/lib/systemd/system/{MODULE_UNIT}", _unit(
            "Load the simulated NVIDIA kernel module (no real module is loaded)",
            "Type=oneshot\nRemainAfterExit=yes\nExecStart=/usr/libexec/gpusim/nvidia-module-load",
            unit_extra=f"Before={DAEMON_UNITS}"))  # fmt: skip
        # dh_dkms' maintainer scripts: the postinst builds (common.postinst; a failed build fails
        # it), the prerm removes this version's modules from every kernel (dkms remove --all)
        k.scripts["postinst"] = _postinst(
            f'if [ "$1" = configure ]; then {DKMS_TOOL} autoinstall "$2"; fi\n'
            'if [ "$1" = configure ] && [ -d /run/systemd/system ]; then\n'
            "  systemctl daemon-reload >/dev/null 2>&1 || true\n"
            f"  systemctl enable {MODULE_UNIT} >/dev/null 2>&1 || true\n"
            "  # like modprobe after a first install; an upgrade keeps the old module until reboot\n"
            f"  [ -e /run/gpusim/nvidia-module.json ] || systemctl start {MODULE_UNIT} || true\n"
            "fi"
        )
        k.scripts["prerm"] = _postinst(
            f'case "$1" in remove|upgrade|deconfigure) {DKMS_TOOL} remove ;; esac'
        )
        debs.append(k)

    debs.append(Deb("nvidia-driver-cuda", v, "NVIDIA driver CUDA integration components (compute-only)",
                    depends=[f"nvidia-smi {eq}", f"libcuda1 {eq}", f"libnvidia-ml1 {eq}",
                             f"nvidia-persistenced {eq}"], section="non-free/metapackages"))  # fmt: skip
    debs.append(Deb("nvidia-driver", v, "NVIDIA metapackage (driver user space)",
                    depends=[f"nvidia-driver-cuda {eq}",
                             f"nvidia-kernel-dkms {eq} | nvidia-kernel-open-dkms {eq}"],
                    section="non-free/metapackages"))  # fmt: skip
    debs.append(Deb("nvidia-open", v, "NVIDIA driver metapackage, open kernel modules",
                    depends=[f"nvidia-driver {eq}", f"nvidia-kernel-open-dkms {eq}"],
                    section="non-free/metapackages"))  # fmt: skip
    debs.append(Deb("cuda-drivers", v, "CUDA Driver native metapackage, proprietary kernel module",
                    depends=[f"nvidia-driver {eq}", f"nvidia-kernel-dkms {eq}"],
                    section="non-free/metapackages"))  # fmt: skip
    if b < 590:
        debs.append(Deb(f"cuda-drivers-{b}", v, f"CUDA Driver native metapackage, branch {b}",
                        depends=[f"cuda-drivers {eq}"], section="non-free/metapackages"))  # fmt: skip
        # the branch-suffixed open metapackage as install scripts name it (nvidia-driver.md §4.1:
        # `nvidia-driver-580-open` [C]; `nvidia-open-<branch>` is named only as a name not to use)
        debs.append(Deb(f"nvidia-driver-{b}-open", v, f"NVIDIA driver metapackage, open modules, branch {b}",
                        depends=[f"nvidia-open {eq}"], section="non-free/metapackages"))  # fmt: skip
    if d.has_pinning:
        pin = Deb(f"nvidia-driver-pinning-{b}", v, f"Pin the NVIDIA driver packages to branch {b}",
                  section="non-free/metapackages", arch="all")  # fmt: skip
        pinned = ("nvidia-open cuda-drivers nvidia-driver nvidia-driver-cuda nvidia-smi libnvidia-ml1 "
                  "libcuda1 nvidia-persistenced nvidia-kernel-dkms nvidia-kernel-open-dkms "
                  "nvidia-fabricmanager libnvidia-nscq")  # fmt: skip
        path = f"/etc/apt/preferences.d/nvidia-driver-pinning-{b}"
        pin.add(path, f"# SIMULATED nvidia-driver-pinning-{b} (gpumon-deploy lab)\n"
                      f"Package: {pinned}\nPin: version {b}.*\nPin-Priority: 1000\n")  # fmt: skip
        pin.conffiles.append(path)
        debs.append(pin)

    fm_name = "nvidia-fabricmanager" if d.unversioned_fabricmanager else f"nvidia-fabricmanager-{b}"
    fm = Deb(fm_name, v, "Fabric Manager for NVSwitch based systems",
             provides=["nvidia-fabricmanager-any"], conflicts=["nvidia-fabricmanager-any"],
             replaces=["nvidia-fabricmanager-any"], section="non-free/utils")  # fmt: skip
    fm.add_tools("daemons", {"/usr/bin/nv-fabricmanager": "fabricmanager_main"}, build)
    cfg = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
    fm.add(cfg, "# SIMULATED fabric manager configuration (gpumon-deploy lab)\nLOG_LEVEL=4\n"
                "LOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nBIND_INTERFACE_IP=127.0.0.1\n"
                "STARTING_TCP_PORT=16000\nFABRIC_MODE=0\n")  # fmt: skip
    fm.add("/usr/lib/systemd/system/nvidia-fabricmanager.service", _unit(
        "NVIDIA fabric manager service",
        f"User=root\nPrivateTmp=false\nType=forking\nExecStart=/usr/bin/nv-fabricmanager -c {cfg}\n"
        "PIDFile=/run/nvidia-fabricmanager/nv-fabricmanager.pid\nLimitCORE=infinity",
        unit_extra=f"After={MODULE_UNIT}"))  # fmt: skip
    _service_scripts(fm, ["nvidia-fabricmanager.service"])
    debs.append(fm)
    nscq_name = "libnvidia-nscq" if d.unversioned_fabricmanager else f"libnvidia-nscq-{b}"
    nscq = Deb(nscq_name, v, "NVSwitch Configuration and Query library",
               provides=["libnvidia-nscq-any"], conflicts=["libnvidia-nscq-any"],
               replaces=["libnvidia-nscq-any"])  # fmt: skip
    nscq.add_json(f"/usr/lib/gpusim/{nscq_name}.json", {"version": d.version})
    debs.append(nscq)
    if not d.unversioned_fabricmanager:
        debs.append(Deb(f"cuda-drivers-fabricmanager-{b}", v, f"CUDA driver + fabric manager, branch {b}",
                        depends=[f"cuda-drivers-{b} {eq}", f"{fm_name} {eq}"],
                        section="non-free/metapackages"))  # fmt: skip
    return debs


# --- DCGM and dcgm-exporter ------------------------------------------------------------------


def dcgm_packages(r: DcgmRelease) -> list[Deb]:
    v = r.deb_version
    build = {"version": r.version, "dcgm_version": r.version, "build_date": r.build_date}
    core = Deb("datacenter-gpu-manager-4-core", v,
               "NVIDIA Datacenter GPU Manager 4 core: nv-hostengine, dcgmi, libdcgm.so.4",
               depends=["libc6 (>= 2.27)"], pre_depends=["passwd", "login"],
               conflicts=["datacenter-gpu-manager"], section="non-free/utils")  # fmt: skip
    core.add_tools("hostengine", {"/usr/bin/nv-hostengine": "main"}, build)
    core.add_tools("dcgmi", {"/usr/bin/dcgmi": "main"}, build)
    core.add_json("/usr/lib/gpusim/dcgm-core.json", {"version": r.version})
    core.add("/usr/lib/systemd/system/nvidia-dcgm.service", _unit(
        "NVIDIA DCGM service",
        'User=root\nPrivateTmp=false\nEnvironment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"\n'
        "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm\nRestart=on-abort",
        install="WantedBy=multi-user.target\nAlias=dcgm.service",
        unit_extra=f"After={MODULE_UNIT}"))  # fmt: skip
    _service_scripts(core, ["nvidia-dcgm.service"], users=("nvidia-dcgm",))
    core.scripts["postinst"] = core.scripts["postinst"].replace(
        "set -e\n", "set -e\nmkdir -p /var/log/nvidia-dcgm\n", 1
    )
    debs = [core]
    for major in (12, 13):
        diag = Deb(f"datacenter-gpu-manager-4-cuda{major}", v,
                   f"NVIDIA Datacenter GPU Manager 4 diagnostics for CUDA {major} user-mode drivers",
                   depends=[f"datacenter-gpu-manager-4-core (= {v})"], recommends=["libnuma1"],
                   provides=["datacenter-gpu-manager-4"], section="non-free/utils")  # fmt: skip
        diag.add_json(f"/usr/lib/gpusim/dcgm-diag-cuda{major}.json",
                      {"version": r.version, "cuda_major": major})  # fmt: skip
        debs.append(diag)
    return debs


def exporter_package(e: ExporterRelease) -> Deb:
    deb = Deb("datacenter-gpu-manager-exporter", e.deb_version,
              f"NVIDIA DCGM Exporter {e.tag} (Prometheus exporter for GPU metrics)",
              depends=["datacenter-gpu-manager-4-core (>= 1:4.0.0)"], section="non-free/utils")  # fmt: skip
    deb.add_tools("exporter", {"/usr/bin/dcgm-exporter": "main"},
                  {"version": e.version, "exporter_tag": e.tag, "dcgm_version": e.dcgm,
                   "hostname_label": e.hostname_label, "hpc_job_files": e.hpc_job_files,
                   "field_names": exporter_fields.field_names(e.version)},
                  parts=("webconfig",))  # fmt: skip
    # upstream's etc/ files, byte for byte (the same at 4.4.2-4.7.1, 4.5.3-4.8.2 and d5e5f51)
    for name in ("default-counters.csv", "dcp-metrics-included.csv"):
        deb.add(f"/etc/dcgm-exporter/{name}", (DATA / "dcgm-exporter" / name).read_bytes())
        deb.conffiles.append(f"/etc/dcgm-exporter/{name}")
    deb.add("/usr/lib/systemd/system/nvidia-dcgm-exporter.service", _unit(
        "NVIDIA DCGM Exporter",
        "User=root\nExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv\n"
        "StandardOutput=append:/var/log/dcgm-exporter.log\n"
        "StandardError=append:/var/log/dcgm-exporter.log\nRestart=on-abort",
        unit_extra="Wants=nvidia-dcgm.service\nAfter=nvidia-dcgm.service"))  # fmt: skip
    _service_scripts(deb, ["nvidia-dcgm-exporter.service"])
    return deb


# The version of the kernel headers' stand-in (see kernel_headers_package).
HEADERS_VERSION = "0+gpusim1"


def lab_kernel() -> str:
    """The kernel the lab's hosts run: the lab machine's own (containers share it)."""
    return platform.release()


def later_kernel(release: str) -> str:
    """A kernel release newer than ``release`` by one at its version's last number
    (``6.18.44-fc-v1272`` -> ``6.18.45-fc-v1272``): the kernel a lab test installs on a host
    after its driver, as an unattended upgrade would (its ``/boot/config-*`` and
    ``/lib/modules`` only: the lab's hosts never boot it)."""
    version, dash, rest = release.partition("-")
    head, _, last = version.rpartition(".")
    digits = last[: len(last) - len(last.lstrip("0123456789"))]
    bumped = f"{int(digits or 0) + 1}{last[len(digits) :]}"
    return f"{head}.{bumped}{dash}{rest}" if head else f"{bumped}{dash}{rest}"


def kernel_headers_package(release: str, which: str = "the lab machine's kernel") -> Deb:
    """A stand-in for ``linux-headers-<release>`` of the lab machine's kernel, which no Debian
    archive carries (a cloud or VM kernel): the nvidia_driver role installs the running kernel's
    headers before the driver, as DKMS needs them, and a host without them is refused by
    ``upgrade-driver``'s preflight. It holds only the directory dkms tests for
    (``/lib/modules/<release>/build/include``), and runs the kernel's header hooks as Debian's
    does, so the simulated DKMS builds its module stand-in for this kernel."""
    deb = Deb(f"linux-headers-{release}", HEADERS_VERSION,
              f"Header files for Linux {release} ({which})",
              section="kernel")  # fmt: skip
    deb.add(
        f"/lib/modules/{release}/build/include/GPUSIM-STAND-IN",
        "SIMULATED: the lab's stand-in for this kernel's headers; no header file is here.\n",
    )
    # Debian's linux-headers-<release> postinst (linux 6.1.192-3): the hooks that build DKMS
    # modules for the kernel whose headers these are
    deb.scripts["postinst"] = _postinst(
        "if [ -d /etc/kernel/header_postinst.d ]; then\n"
        f"  run-parts --report --exit-on-error --arg={release} /etc/kernel/header_postinst.d\n"
        "fi"
    )
    return deb


def all_packages(box_kernels: tuple[str, ...] = ()) -> list[Deb]:
    """Every package of the simulated repository; the kernel headers' stand-ins are of
    :func:`lab_kernel`, of the :func:`later_kernel` after it, and of ``box_kernels`` (the
    Debian kernels the lab's Vagrant box boots its VMs with: deployer/lab/vagrant_box.py)."""
    debs: list[Deb] = []
    for d in DRIVERS:
        debs.extend(driver_packages(d))
    for r in DCGMS:
        debs.extend(dcgm_packages(r))
    for e in EXPORTERS:
        debs.append(exporter_package(e))
    debs.append(kernel_headers_package(lab_kernel()))
    # and of a later kernel, which the lab's hosts never boot: a test puts that kernel on a host
    # after its driver (an unattended upgrade) and the nvidia_driver role installs its headers
    debs.append(kernel_headers_package(later_kernel(lab_kernel()), "a later kernel, never booted"))
    for release in sorted(set(box_kernels) - {lab_kernel(), later_kernel(lab_kernel())}):
        debs.append(kernel_headers_package(release, "the lab's Vagrant box's kernel"))
    return debs
