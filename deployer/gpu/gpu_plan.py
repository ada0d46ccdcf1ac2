"""The ``gpu_plan`` template variable: a GPU host's resolved compatibility plan, as roles read it.

Owns the translation from ``rules.ResolvedPlan`` (plus the host's facts) to the plain mapping the
GPU roles (``nvidia_driver``, ``dcgm``, ``dcgm_exporter``) use, so that every computed value lives
here in Python and the role files stay short: package names grouped by component with the exact
Debian version apt wants, the NVIDIA CUDA repository's distro and architecture names, and whether
the value is a stand-in.

Public API
----------
``template_plan(host, variables, facts=None, record=None) -> dict``
    With facts (the run that converges): the host's plan resolved against the matrix, the GPU
    names from facts deciding the model when nvidia-smi saw GPUs; ``variables`` already carry
    the driver the host is to run (``preflight.choose_driver``), and ``driver_record`` says where
    the host's ``upgrade-driver`` record lives and whether it is ``stale`` (it names another
    driver than the plan's: the role removes it before installing, see ``deployer.gpu.driver_record``). A refused plan raises
    ``PlanRefused`` and malformed inventory values ``InputError`` (the preflight reports both
    first, so a converge never gets here with either).
    Without facts (validating templates before any connection): malformed values still raise
    ``InputError``, but a plan the matrix refuses, or one that needs facts to name the GPU model,
    gives a *stand-in* (``stand_in: true``) resolved from the model's defaults, only so that
    templates can be checked for undefined names; the preflight then refuses the real plan.
``driver_switch(resolved, facts) -> dict``
    What moving a host onto the planned driver must take away first, from the installed and held
    packages in facts (an instance of any architecture): ``purge`` (driver, Fabric Manager and
    NSCQ packages of other branches or of the other module flavour, which would otherwise hold
    the old branch in place), ``unhold``
    (held packages of that family the plan does not hold, so apt may replace them) and
    ``install`` (the planned driver and Fabric Manager as ``name=version``, to install in the same
    apt transaction); ``needed`` is false when both lists are empty.
``dcgm_stale_variants(resolved, facts) -> list``
    Installed ``datacenter-gpu-manager-4-cuda<N>`` packages of another CUDA major than the plan's.
``repo_names(facts) -> (distro, arch)``
    NVIDIA's CUDA repository path names for a host (``debian12``/``ubuntu2204``/``rhel9``,
    ``x86_64``/``sbsa``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any, NamedTuple

from deployer import dcgm_fields
from deployer.booleans import as_boolean
from deployer.errors import InputError, PlanRefused
from deployer.facts import HostFacts
from deployer.gpu import hpc_job_mapping, matrix, rules, version_plan
from deployer.gpu.driver_record import RECORD_PATH, DriverRecord
from deployer.modules import disk_space

# Model used for a stand-in when neither the inventory nor facts name one (validation only).
_STAND_IN_MODEL = "H100"
_RHEL_LIKE = ("rhel", "centos", "rocky", "almalinux", "ol")
# NVIDIA's repository architecture names: arm64 servers are "sbsa" (nvidia-driver.md §4).
_REPO_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}


def repo_names(facts: Mapping[str, Any]) -> tuple[str, str]:
    """(distro, arch) path components of NVIDIA's CUDA repository for a host (nvidia-driver.md §4:
    ``<distro>`` like ``ubuntu2204``, ``debian12``, ``rhel9``; ``<arch>`` ``x86_64`` or ``sbsa``)."""
    os_id = str(facts.get("os_id") or "")
    version = str(facts.get("os_version") or "")
    if os_id == "ubuntu":
        distro = "ubuntu" + version.replace(".", "")
    elif os_id == "debian" or facts.get("os_family") == "debian":
        distro = "debian" + version.split(".")[0]
    elif os_id in _RHEL_LIKE or facts.get("os_family") == "redhat":
        distro = "rhel" + version.split(".")[0]
    else:
        distro = os_id + version.split(".")[0]
    arch = str(facts.get("arch") or "")
    return distro, _REPO_ARCH.get(arch, arch)


HEADERS_VAR = "nvidia_driver_kernel_headers"
HEADERS_COMPONENT = "kernel-headers"
# A Debian package name (deb-control(5)): a kernel release outside it has no headers package.
_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


def kernel_headers_packages(
    facts: Mapping[str, Any], variables: Mapping[str, Any]
) -> tuple[str, ...]:
    """The kernel headers packages the nvidia_driver role installs before the driver: those of
    the running kernel and of the newer installed kernel Debian's dkms also builds the module for
    (``facts.newest_kernel``, which a reboot may boot), each where facts found it missing.

    NVIDIA's driver packages build their kernel module with DKMS against the running kernel's
    headers, which "must also be installed" (NVIDIA driver installation guide, "Pre-installation
    Actions": docs.nvidia.com/datacenter/tesla/driver-installation-guide/pre-installation-actions.html);
    the packages themselves may pull in the newest headers, "which may or may not
    match the version of the kernel your system is using". Without them Debian's dkms skips the
    build and the install still succeeds ("Module build for kernel ... was skipped since the
    kernel headers for this kernel do not seem to be installed": dkms 3.0.10
    ``/usr/lib/dkms/common.postinst``), so the host reboots with no NVIDIA module; the same
    postinst builds for the newest installed kernel too, skipped alike without its headers.
    Debian family only (``linux-headers-<kernel release>``), for a kernel whose
    ``/lib/modules/<release>/build/include`` (dkms' own test) facts found missing, unless
    ``nvidia_driver_kernel_headers`` is false. That NVIDIA's own DKMS packages behave as Debian's
    dkms does: docs/unverified.md#nvidia-dkms-without-headers."""
    if facts.get("os_family") != "debian" or not as_boolean(variables.get(HEADERS_VAR, True)):
        return ()
    kernels = (
        (facts.get("kernel"), facts.get("kernel_headers")),
        (facts.get("newest_kernel"), facts.get("newest_kernel_headers")),
    )
    names = (f"linux-headers-{release}" for release, has in kernels if release and has is False)
    return tuple(name for name in names if _PACKAGE_NAME.match(name))


def _template_pattern(template: str) -> re.Pattern[str]:
    """A package-name template of the matrix (``cuda-drivers-{branch}``) as an anchored regex
    whose group ``branch`` is the branch, if the template has one."""
    escaped = re.escape(template).replace(re.escape("{branch}"), r"(?P<branch>\d{3})")
    return re.compile(f"^{escaped}$")


@cache
def _driver_family() -> tuple[tuple[re.Pattern[str], str | None], ...]:
    """Every driver, Fabric Manager and NSCQ package name the matrix knows, across branches and
    module flavours, as (pattern, NSCQ template) -- the NSCQ template of a Fabric Manager name,
    whose library goes with it (facts list Fabric Manager but not NSCQ)."""
    m = matrix.matrix()
    out: list[tuple[re.Pattern[str], str | None]] = []
    for scheme in m.driver_packages:
        for key in ("open", "proprietary", "also_named"):
            out.extend((_template_pattern(t), None) for t in scheme.names.get(key) or ())
    for scheme in m.fabric_manager:
        nscq = scheme.names["nscq"]
        out.append((_template_pattern(scheme.names["fabricmanager"]), nscq))
        out.append((_template_pattern(nscq), None))
        out.extend((_template_pattern(t), None) for t in scheme.names.get("also_named") or ())
    return tuple(out)


def driver_switch(resolved: rules.ResolvedPlan, facts: Mapping[str, Any]) -> dict[str, Any]:
    """What the host must lose to take the planned driver (see the module docstring)."""
    flavour = resolved.module_flavour
    keep = {p.name for p in resolved.install}
    # Branch-suffixed metapackages depend on the unversioned one of their flavour: it stays.
    for scheme in matrix.matrix().driver_packages:
        keep.update(n for n in scheme.names.get(flavour) or () if "{branch}" not in n)
    purge: set[str] = set()
    family: set[str] = set()
    # a foreign instance alone (an old branch's 32-bit library) holds the old branch as well:
    # its package is purged too, which removes every instance (modules/driver_switch.py)
    installed = dict.fromkeys(facts.get("packages") or {})
    installed.update(
        dict.fromkeys(k.partition(":")[0] for k in facts.get("foreign_packages") or {})
    )
    for name in installed:
        for pattern, nscq in _driver_family():
            match = pattern.match(name)
            if match is None:
                continue
            family.add(name)
            if name not in keep:
                purge.add(name)
                if nscq is not None:
                    companion = nscq.format(**match.groupdict())
                    if companion not in keep:
                        purge.add(companion)
            break
    held = {n for n in facts.get("held") or () if n in family}
    unhold = (held - set(resolved.hold)) | purge
    install = [
        p.apt
        for p in resolved.install
        if p.component in ("driver", "fabricmanager") and p.deb_version
    ]
    return {
        "needed": bool(purge or unhold),
        "purge": sorted(purge),
        "unhold": sorted(unhold),
        "install": install,
    }


def install_room(
    view: Mapping[str, Any],
    variables: Mapping[str, Any],
    facts: Mapping[str, Any],
    changes: bool,
) -> dict[str, Any]:
    """The nvidia_driver role's free-space check: ``needs`` (``min_free_mib``) and whether it
    is ``asked``: on a Debian-family host whose facts show something of the driver to install
    (a driver or Fabric Manager package not at the planned version, a kernel's headers, another
    branch's packages to replace). A host at its planned driver is not asked (no process added
    to a run that changes nothing); nor an RPM-family one, whose versions facts do not compare
    here. ``changes``: :func:`driver_changes` of the host."""
    needs = min_free_mib(str(view.get("host", "")), variables)
    if not needs or facts.get("os_family") != "debian":
        return {"needs": needs, "asked": False, "hint": ROOM_HINT}
    asked = changes or bool(view["kernel_headers"])
    return {"needs": needs, "asked": asked, "hint": ROOM_HINT}


def driver_changes(view: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
    """Whether facts show the driver's packages to change: a driver or Fabric Manager package
    not at the planned version, or another branch's packages to replace (Debian family; an RPM
    host's versions are not compared here)."""
    if facts.get("os_family") != "debian":
        return False
    installed = facts.get("packages") or {}
    pinned = [(view[c]["names"], view[c]["deb_version"]) for c in ("driver", "fabricmanager")]
    behind = any(installed.get(n) != version for names, version in pinned for n in names)
    return behind or bool(view["driver_switch"]["needed"])


def boot_check(facts: Mapping[str, Any], changes: bool) -> dict[str, Any]:
    """The nvidia_driver role's boot loader check (module boot_loader): ``asked`` where the
    driver's packages change (``changes``: :func:`driver_changes`) on a host whose running
    kernel facts know, since the new packages
    take the old module from every kernel and Debian's dkms builds the new one for the running
    and the newest installed kernel only; ``running`` and ``newest`` are those two."""
    running = str(facts.get("kernel") or "")
    return {
        "asked": bool(running) and changes,
        "running": running,
        "newest": str(facts.get("newest_kernel") or ""),
    }


def module_check(
    view: Mapping[str, Any], facts: Mapping[str, Any], changes: bool
) -> dict[str, Any]:
    """The nvidia_driver role's check, after the packages and before any reboot, that DKMS built
    the planned driver's module for the kernel the next boot starts (module driver_module):
    ``asked`` on a Debian-family host whose running kernel facts know, where the driver's
    packages change (``changes``), the loaded module is not the planned driver (a reboot is
    owed: a run after one that failed this check, or an operator's install, asks again), the
    role installs a kernel's headers (``view["kernel_headers"]``: a kernel put in after the
    driver without them, e.g. by an unattended upgrade; their package's hook has DKMS build the
    module for it, and this says whether it did), or a kernel newer than the running one is
    installed (facts' ``newest_kernel``, which a boot loader's default starts: put in with its
    headers, its DKMS build may still have failed -- an older driver branch that does not build
    against a newer kernel -- and nothing else on the run would say so before a reboot). A host
    with no kernel newer than the running one, whose loaded module is the planned driver, is not
    asked: the running kernel's module is the one loaded. The read is batched with the play's
    other reads (no round trip of its own)."""
    owed = facts.get("driver_loaded") != view["driver_version"]
    later = bool(facts.get("newest_kernel"))
    moved = changes or owed or later or bool(view.get("kernel_headers"))
    asked = facts.get("os_family") == "debian" and bool(facts.get("kernel")) and moved
    return {"asked": asked}


def dcgm_stale_variants(resolved: rules.ResolvedPlan, facts: Mapping[str, Any]) -> list[str]:
    """Installed DCGM CUDA-variant packages the plan does not install (see the module docstring)."""
    return sorted(
        name
        for name in facts.get("packages") or {}
        if re.fullmatch(r"datacenter-gpu-manager-4-cuda\d+", name)
        and name not in resolved.dcgm_packages
    )


def _view(
    resolved: rules.ResolvedPlan,
    variables: Mapping[str, Any],
    facts: Mapping[str, Any],
    stand_in: bool,
) -> dict[str, Any]:
    out = dataclasses.asdict(resolved)
    out["install"] = [{**dataclasses.asdict(p), "apt": p.apt} for p in resolved.install]
    for key, value in list(out.items()):
        if isinstance(value, tuple):
            out[key] = list(value)

    def component(name: str) -> dict[str, Any]:
        pins = [p for p in resolved.packages(name) if p.deb_version]
        versions = {p.deb_version for p in pins}
        if len(versions) > 1:  # the matrix gives one version per component
            raise ValueError(f"{name} packages at several versions: {sorted(versions)}")
        return {
            "names": [p.name for p in pins],
            "deb_version": versions.pop() if versions else None,
            "version": pins[0].version if pins else None,
        }

    out["driver"] = component("driver")
    out["fabricmanager"] = component("fabricmanager")
    fm = out["fabricmanager"]["deb_version"]
    if fm is not None and fm != out["driver"]["deb_version"]:
        # one apt transaction installs both at one version (nvidia-driver.md §10)
        raise ValueError(
            f"Fabric Manager {fm} differs from the driver {out['driver']['deb_version']}"
        )
    out["dcgm"] = component("dcgm")
    out["exporter"] = component("exporter")
    distro, arch = repo_names(facts)
    out["repo_distro"] = distro
    out["repo_arch"] = arch
    # RHEL 8/9's dnf module stream of the branch: <branch>-open or <branch>-dkms (the
    # proprietary modules, built by DKMS): ../shared/reference/nvidia-driver.md §4.3 [S6]
    dkms = "open" if resolved.module_flavour == "open" else "dkms"
    out["dnf_module_stream"] = f"{resolved.driver_branch}-{dkms}"
    out["stand_in"] = stand_in
    # pinning packages of other branches (left by an earlier plan) would pin the old branch too
    out["stale_pinning_packages"] = sorted(
        name
        for name in facts.get("packages") or {}
        if name.startswith("nvidia-driver-pinning-") and name != resolved.pinning_package
    )
    out["driver_switch"] = driver_switch(resolved, facts)
    out["kernel_headers"] = list(kernel_headers_packages(facts, variables)) or None
    changes = driver_changes(out, facts)
    out["disk_space"] = install_room(out, variables, facts, changes)
    out["boot_loader"] = boot_check(facts, changes)
    # Under Secure Boot, the module DKMS signs must be one the kernel loads (module_signing)
    out["module_signing"] = {"asked": changes}
    out["driver_module"] = module_check(out, facts, changes)
    out["dcgm_stale_variants"] = dcgm_stale_variants(resolved, facts)
    # The CSV holds only names this exporter version accepts; a host with a GPU in MIG mode also
    # collects the instances' utilization signal (deployer/dcgm_fields.py). Both are planned: MIG
    # mode is read on the host when the exporter role runs (module copy_by_mig_mode), since the
    # facts of a run that installs the driver cannot know it.
    out["exporter_csv"] = dcgm_fields.csv_from_vars(variables, exporter_tag=resolved.exporter_tag)
    out["exporter_csv_mig"] = dcgm_fields.csv_from_vars(
        variables, exporter_tag=resolved.exporter_tag, mig_enabled=True
    )
    out["driver_record"] = {"path": RECORD_PATH, "stale": False}
    out["hpc_job_mapping"] = hpc_job_mapping.plan(resolved.host, variables, resolved.exporter_tag)
    return out


def _with_record(view: dict[str, Any], record: DriverRecord | None) -> dict[str, Any]:
    view["driver_record"]["stale"] = record is not None and record.version != view["driver_version"]
    return view


def _resolve(host: str, variables: Mapping[str, Any], names: list[str] | None):
    plan = version_plan.plan_from_vars(host, variables, gpu_names=names)
    return rules.resolve(plan)


_CHOICES = {"nvidia_driver_reboot": ("never", "if_required")}
_BOOLEANS = ("nvidia_driver_reboot_force", "nvidia_persistenced_persistence_mode", HEADERS_VAR)
FREE_SPACE_VAR = "nvidia_driver_min_free_mib"
# What to do about too little room, said by the role's check and the rollout's preflight alike
ROOM_HINT = (
    "free space there (apt-get clean empties /var/cache/apt/archives; old kernels fill /boot), "
    f"or set {FREE_SPACE_VAR} for the host where its install needs less"
)


def min_free_mib(host: str, variables: Mapping[str, Any]) -> dict[str, int]:
    """Path -> MiB the driver's install needs free on the filesystem holding it
    (``nvidia_driver_min_free_mib``: a path at 0, or left out, is not asked; ``false`` or null
    asks none). Paths on one filesystem need the sum (``deployer/rollout/free_space.py``).
    Refused, naming the host and the key, unless a mapping of absolute paths to whole MiB."""
    value = variables.get(FREE_SPACE_VAR)
    if value is None or value is False:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(
            f"host {host}: {value!r} is not a mapping of paths to MiB ({{/var: 2048}}) or false",
            key=FREE_SPACE_VAR,
        )
    needs = {}
    for path, mib in value.items():
        if not isinstance(path, str) or not disk_space.PATH.match(path):
            raise InputError(
                f"host {host}: {path!r} is not an absolute path (letters, digits, '._-/')",
                key=f"{FREE_SPACE_VAR}.{path}",
            )
        if isinstance(mib, bool) or not isinstance(mib, int) or mib < 0:
            raise InputError(
                f"host {host}: {mib!r} is not a whole number of MiB (0 or more)",
                key=f"{FREE_SPACE_VAR}.{path}",
            )
        if mib:
            needs[path] = mib
    return needs


def check_role_vars(host: str, variables: Mapping[str, Any]) -> None:
    """The GPU roles' own choice variables, refused with the key named when out of range."""
    for key, allowed in _CHOICES.items():
        if key in variables and variables[key] not in allowed:
            raise InputError(
                f"host {host}: {variables[key]!r} is not one of {', '.join(allowed)}", key=key
            )
    for key in _BOOLEANS:
        value = variables.get(key, False)
        if as_boolean(value) is None:
            raise InputError(f"host {host}: {value!r} is not true or false", key=key)
    min_free_mib(host, variables)


def template_plan(
    host: str,
    variables: Mapping[str, Any],
    facts: HostFacts | None = None,
    record: DriverRecord | None = None,
) -> dict[str, Any]:
    """The ``gpu_plan`` mapping of one GPU host (see the module docstring)."""
    check_role_vars(host, variables)
    if facts is not None:
        names = facts.gpu_names()[0] or None
        view = _view(_resolve(host, variables, names), variables, facts.to_json(), stand_in=False)
        return _with_record(view, record)
    stand_in_facts = {
        "os_id": "debian",
        "os_family": "debian",
        "os_version": "12",
        "arch": "x86_64",
    }
    try:
        return _view(_resolve(host, variables, None), variables, stand_in_facts, stand_in=False)
    except PlanRefused:
        pass
    except InputError as exc:
        # Only a missing model or count may wait for facts; every malformed value is refused now.
        if exc.key not in ("gpu_model", "gpu_count") or variables.get(exc.key) not in (None, ""):
            raise
    model = variables.get("gpu_model") or _STAND_IN_MODEL
    fallback = {
        "gpu_model": model,
        "gpu_count": variables.get("gpu_count") or 1,
        "nvswitch": variables.get("nvswitch", False),
    }
    try:
        resolved = _resolve(host, fallback, None)
    except (PlanRefused, InputError):
        resolved = _resolve(host, {**fallback, "gpu_model": _STAND_IN_MODEL}, None)
    return _view(resolved, variables, stand_in_facts, stand_in=True)


class ExporterPlan(NamedTuple):
    """What a GPU host's exporter collects, from its ``template_plan`` without facts: the
    collectors CSV (``exporter_csv``), the one for a GPU in MIG mode (``exporter_csv_mig``) and
    the ``gpu_count`` (a stand-in 1 where neither inventory nor facts count the GPUs)."""

    csv: str
    csv_mig: str
    gpu_count: int


# Every variable template_plan (no facts) reads: its output for the exporter and its verdict on
# bad values depend on these alone (tests/unit/test_gpu_plan_batch.py holds it to that).
TEMPLATE_PLAN_VARS = (
    *version_plan.PLAN_VARS,
    *_CHOICES,
    *_BOOLEANS,
    FREE_SPACE_VAR,
    *dcgm_fields.VARS,
    *hpc_job_mapping.VARS,
)
_SHARED_TEMPLATE_VARS = tuple(v for v in TEMPLATE_PLAN_VARS if v != "rack")


def exporter_plans(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, ExporterPlan]:
    """:class:`ExporterPlan` of each ``(host, variables)``: what ``template_plan(host,
    variables)`` gives for them, computed once for the hosts whose variables that
    ``template_plan`` reads (but ``rack``) are equal, with equal types, nested (a fleet has a few
    combinations; 100,000 hosts' plans one by one took 40 s). The first host with bad values
    raises, as it would alone."""
    by_value: dict[Any, ExporterPlan] = {}
    # The hosts of a group read the very same objects (group variables, role defaults): known
    # by identity first, the values kept alive beside their plan so that no id is reused.
    by_identity: dict[tuple[int, ...], tuple[tuple[Any, ...], ExporterPlan]] = {}
    out = {}
    for host, variables in hosts:
        values = version_plan.read_many(variables, _SHARED_TEMPLATE_VARS, _ABSENT)
        identity = tuple(map(id, values))
        seen = by_identity.get(identity)
        if seen is None:
            key = _frozen(values)
            try:
                found = by_value.get(key)
            except TypeError:  # a value of no YAML type that cannot be hashed: planned alone
                key, found = None, None
            if found is None:
                plan = template_plan(host, variables)
                found = ExporterPlan(
                    plan["exporter_csv"], plan["exporter_csv_mig"], int(plan["gpu_count"] or 0)
                )
                if key is not None:
                    by_value[key] = found
            seen = by_identity[identity] = (values, found)
        out[host] = seen[1]
    return out


_ABSENT = object()


def _frozen(value: Any) -> Any:
    """``value`` as a hashable key, with the type of everything in it (1, True, 1.0 and "1" are
    equal or alike to ``==`` and ``repr`` but not to the plan)."""
    if isinstance(value, Mapping):
        return (type(value), tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value), tuple(_frozen(v) for v in value))
    if isinstance(value, set | frozenset):
        return (type(value), frozenset(_frozen(v) for v in value))
    return (type(value), value)
