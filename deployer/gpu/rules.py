"""The compatibility rules: what a version plan implies, and every rule it may break.

``check(plans) -> list[Refusal]``
    Every rule against every plan, plus the cross-host rules (one driver per GB200 rack).
    Empty list = the plans are compatible. Each distinct combination of model and planned
    versions is judged once; its refusals are repeated for each of its hosts, under its name.
``resolve(plan) -> ResolvedPlan``
    What a compatible plan implies: exact driver version and branch, CUDA major, module flavour,
    DCGM version and packages, exporter tag, Fabric Manager package and version, the ordered
    ``install`` list of ``PackagePin`` (``.apt`` gives ``name=deb_version``), the ``hold`` and
    ``remove`` lists. Raises ``PlanRefused`` (message lists the refusals) for a refused plan.

Defaults when the plan leaves a version out: the driver is the newest known version of the
newest LTSB or PB branch that supports the GPU; DCGM and the exporter are a tested pair (an
exporter tag and the DCGM it was built on): with neither set, the newest exporter tag whose DCGM
is new enough for the driver's CUDA major; with only one set, the other follows from it.
Pure: the data comes from ``deployer.gpu.matrix``.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import PlanRefused
from deployer.gpu import matrix as data
from deployer.gpu.matrix import (
    EXPORTER_TAG_RE,
    Citation,
    DriverBranch,
    GpuModel,
    models_from_gpu_names,
    version_key,
)
from deployer.gpu.version_plan import VersionPlan

# --------------------------------------------------------------------------------------------
# Resolution and rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A rule a plan breaks: which host, which rule, what is wrong, how to fix it."""

    host: str
    rule: str
    message: str
    fix: str
    source: str = ""
    verified: bool = True

    def __str__(self) -> str:
        note = "" if self.verified else " (rule rests on an unverified fact)"
        return f"{self.host}: {self.message}; {self.fix} [{self.rule}]{note}"


@dataclass(frozen=True)
class PackagePin:
    """One package to install: ``version`` is upstream, ``deb_version`` what apt wants."""

    name: str
    version: str | None
    deb_version: str | None
    component: str  # driver | fabricmanager | dcgm | exporter

    @property
    def apt(self) -> str:
        return f"{self.name}={self.deb_version}" if self.deb_version else self.name


@dataclass(frozen=True)
class ResolvedPlan:
    """Everything a compatible plan implies, for the roles and the verification."""

    host: str
    gpu_model: str
    architecture: str
    compute_capability: str
    gpu_count: int
    nvswitch: bool
    driver_branch: str
    driver_version: str
    driver_listed: bool
    branch_type: str | None
    branch_eol: str | None
    cuda_major: int
    module_flavour: str
    dcgm_version: str
    dcgm_major: int
    dcgm_cuda_variant: int | None
    dcgm_packages: tuple[str, ...]
    exporter_tag: str
    exporter_version: str
    exporter_dcgm_version: str
    fabricmanager_package: str | None
    fabricmanager_version: str | None
    pinning_package: str | None
    install: tuple[PackagePin, ...]
    hold: tuple[str, ...]
    remove: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def packages(self, component: str) -> tuple[PackagePin, ...]:
        return tuple(p for p in self.install if p.component == component)


@dataclass
class _State:
    """Working values while the rules run over one plan."""

    plan: VersionPlan
    refusals: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def refuse(
        self,
        rule: str,
        message: str,
        fix: str,
        cite: Citation | None = None,
        *,
        unverified_field: str | None = None,
    ) -> None:
        verified = True
        if cite is not None:
            verified = (
                cite.verified if unverified_field is None else not cite.covers(unverified_field)
            )
        self.refusals.append(
            Refusal(
                host=self.plan.host,
                rule=rule,
                message=message,
                fix=fix,
                source=cite.source if cite else "",
                verified=verified,
            )
        )


def _effective_model(s: _State) -> GpuModel | None:
    m, plan = data.matrix(), s.plan
    inventory = m.models[plan.gpu_model] if plan.gpu_model else None
    if not plan.gpu_names:
        return inventory
    seen, unknown = models_from_gpu_names(plan.gpu_names)
    if unknown is not None:
        s.refuse(
            "gpu-name-unknown",
            f"GPU name {unknown!r} from facts matches no model in the matrix",
            "add the name to deployer/data/compat.yml, or set gpu_model and run with --offline",
        )
        return None
    if len(seen) > 1:
        s.refuse(
            "gpu-models-mixed",
            f"facts show several GPU models ({', '.join(sorted(seen))}); a plan covers one model",
            "split the host's GPUs by model or check the facts",
        )
        return None
    if plan.gpu_count != len(plan.gpu_names):
        s.refuse(
            "gpu-count-facts",
            f"facts show {len(plan.gpu_names)} GPU(s) but the inventory says gpu_count "
            f"{plan.gpu_count}",
            f"set gpu_count: {len(plan.gpu_names)} (or remove it: facts give it), or find the "
            "missing GPU (nvidia-smi -L, the kernel log's Xid 79) before converging",
        )
        return None
    ((facts_model, name),) = seen.items()
    if inventory is not None and inventory.name != facts_model:
        s.refuse(
            "gpu-model-facts",
            f"facts report {name!r} ({facts_model}) "
            f"but the inventory says gpu_model {inventory.name}",
            f"set gpu_model: {facts_model} in the inventory",
        )
        return None
    return m.models[facts_model]


def _supports(model: GpuModel, version: str) -> bool:
    m = data.matrix()
    arch = m.architectures[model.architecture]
    branch = version.split(".")[0]
    if arch.last_branch is not None and int(branch) > int(arch.last_branch):
        return False
    return all(
        version_key(version) >= version_key(floor)
        for floor in (arch.min_driver, model.min_driver)
        if floor
    )


def _default_driver(model: GpuModel) -> DriverBranch | None:
    """Newest LTSB or PB branch with a known version that supports the model."""
    m = data.matrix()
    candidates = [
        b
        for b in m.branches.values()
        if b.type in ("LTSB", "PB") and b.newest() and _supports(model, b.newest() or "")
    ]
    return max(candidates, key=lambda b: int(b.name), default=None)


def _resolve_driver(s: _State, model: GpuModel) -> tuple[DriverBranch, str, bool] | None:
    m, plan = data.matrix(), s.plan
    if plan.driver_version:
        branch = m.branches[plan.driver_version.split(".")[0]]
        listed = plan.driver_version in branch.versions
        if not listed:
            s.notes.append(f"driver {plan.driver_version} is not listed in the matrix")
        return branch, plan.driver_version, listed
    if plan.driver_branch:
        branch = m.branches[plan.driver_branch]
        newest = branch.newest()
        if newest is None:
            s.refuse(
                "driver-version-unknown",
                f"no version of R{branch.name} is known to the matrix",
                f"set nvidia_driver_version to an exact {branch.name}.x version",
                branch.cite,
            )
            return None
        return branch, newest, True
    branch = _default_driver(model)
    if branch is None:
        s.refuse(
            "driver-no-default",
            f"no LTSB or PB branch with a known version supports {model.name}",
            "set nvidia_driver_version",
        )
        return None
    s.notes.append(f"driver defaulted to R{branch.name} ({branch.newest()}), newest LTSB/PB")
    return branch, branch.newest() or "", True


def _suggest_driver(model: GpuModel) -> str:
    branch = _default_driver(model)
    if branch is None:
        return "a supported driver"
    return f"R{branch.name} ({branch.newest()})"


def _check_driver(s: _State, model: GpuModel, branch: DriverBranch, version: str) -> None:
    m = data.matrix()
    arch = m.architectures[model.architecture]
    if arch.last_branch is not None and int(branch.name) > int(arch.last_branch):
        last = m.branches.get(arch.last_branch)
        newest = last.newest() if last else None
        target = f"R{arch.last_branch}" + (f" ({newest})" if newest else "")
        s.refuse(
            "arch-last-branch",
            f"{model.name} ({arch.title}) is not supported after branch R{arch.last_branch}",
            f"plan {target} or keep this host on its current branch",
            arch.cite,
            unverified_field="last_branch",
        )
    floors = [
        (floor, cite, what)
        for floor, cite, what in (
            (arch.min_driver, arch.cite, f"{arch.title} floor"),
            (model.min_driver, model.cite, f"{model.name} minimum"),
        )
        if floor and version_key(version) < version_key(floor)
    ]
    if floors:
        # report the strictest floor broken, once
        floor, cite, what = max(floors, key=lambda f: version_key(f[0] or "0"))
        s.refuse(
            "driver-minimum",
            f"{model.name} needs driver {floor} or later ({what}); planned {version}",
            f"plan {_suggest_driver(model)}",
            cite,
            unverified_field="min_driver",
        )


def _resolve_flavour(s: _State, model: GpuModel, branch: DriverBranch) -> str:
    m = data.matrix()
    arch = m.architectures[model.architecture]
    kind, cite = (model.module, model.cite) if model.module else (arch.module, arch.cite)
    wanted = s.plan.module_flavour
    if wanted == "auto":
        if kind == "open_required":
            flavour = "open"
        elif kind == "proprietary_only":
            flavour = "proprietary"
        else:
            flavour = "open" if int(branch.name) >= int(m.open_default_since) else "proprietary"
    else:
        flavour = wanted
    if flavour == "open" and kind == "proprietary_only":
        s.refuse(
            "module-open-unsupported",
            f"{model.name} ({arch.title}) cannot run the open kernel modules "
            "(they drive Turing and newer only)",
            "set nvidia_module_flavour to proprietary or auto",
            cite,
            unverified_field="module",
        )
    if flavour == "proprietary" and kind == "open_required":
        s.refuse(
            "module-open-required",
            f"{model.name} requires the open kernel modules; planned proprietary",
            "set nvidia_module_flavour to open or auto",
            cite,
            unverified_field="module",
        )
    if flavour == "open" and int(branch.name) < int(m.open_available_since):
        s.refuse(
            "module-open-branch",
            f"open kernel modules exist from branch R{m.open_available_since}; "
            f"planned R{branch.name}",
            f"plan R{m.open_available_since} or later, or set nvidia_module_flavour to proprietary",
            m.flavours_cite,
        )
    return flavour


def _variant_major(model: GpuModel, cuda_major: int) -> tuple[int, Citation | None]:
    for archs, driver_cuda, variant, cite in data.matrix().dcgm_variant_exceptions:
        if model.architecture in archs and cuda_major == driver_cuda:
            return variant, cite
    return cuda_major, None


def _tag_parts(tag: str) -> tuple[str, str]:
    match = EXPORTER_TAG_RE.match(tag)
    assert match is not None  # validated when the plan was built
    return match.group(1), match.group(2)


def _exporter_for(dcgm_version: str) -> str | None:
    """Newest known exporter tag of the host's DCGM major built on DCGM >= ``dcgm_version``."""
    m = data.matrix()
    major = version_key(dcgm_version)[0]
    fits = [
        t
        for t in m.exporter_tags
        if version_key(_tag_parts(t)[0])[0] == major
        and version_key(_tag_parts(t)[0]) >= version_key(dcgm_version)
        and m.exporter_dcgm_major.get(version_key(_tag_parts(t)[1])[0], (None,))[0] == major
    ]
    return max(fits, key=lambda t: version_key(_tag_parts(t)[1]), default=None)


def _default_pair(cuda_major: int) -> str | None:
    """Newest known exporter tag whose DCGM is new enough for the driver's CUDA major."""
    m = data.matrix()
    floor = m.dcgm_min_for_cuda.get(cuda_major, ("0.0.0", None))[0]
    fits = [
        t
        for t in m.exporter_tags
        if version_key(_tag_parts(t)[0]) >= version_key(floor)
        and version_key(_tag_parts(t)[0])[0] in m.dcgm_majors
    ]
    return max(fits, key=lambda t: version_key(_tag_parts(t)[1]), default=None)


def _resolve_dcgm(s: _State, cuda_major: int) -> tuple[str, str] | None:
    """(dcgm version, exporter tag) after defaults, or None when they cannot be chosen."""
    plan = s.plan
    dcgm, tag = plan.dcgm_version, plan.exporter_tag
    if dcgm is None and tag is None:
        tag = _default_pair(cuda_major)
        if tag is None:
            s.refuse(
                "dcgm-no-default",
                f"no known DCGM / exporter pair supports CUDA {cuda_major}",
                "set dcgm_version and dcgm_exporter_version",
            )
            return None
        dcgm = _tag_parts(tag)[0]
        s.notes.append(f"DCGM {dcgm} and exporter {tag} chosen as the newest tested pair")
    elif dcgm is None:
        assert tag is not None
        dcgm = _tag_parts(tag)[0]
        s.notes.append(f"DCGM {dcgm} follows from exporter tag {tag}")
    elif tag is None:
        tag = _exporter_for(dcgm)
        if tag is None:
            s.refuse(
                "exporter-none-known",
                f"no known dcgm-exporter tag is built on DCGM {dcgm} or later "
                f"({version_key(dcgm)[0]}.x)",
                "set dcgm_exporter_version explicitly",
            )
            return None
        s.notes.append(f"exporter {tag} chosen for DCGM {dcgm}")
    return dcgm, tag


def _check_dcgm(s: _State, dcgm: str, branch: DriverBranch, version: str) -> bool:
    """DCGM rules; False when the DCGM major itself is unusable."""
    m = data.matrix()
    major = version_key(dcgm)[0]
    cuda = branch.cuda_major
    if major not in m.dcgm_majors:
        s.refuse(
            "dcgm-major-unsupported",
            f"DCGM {dcgm} (major {major}) is not supported; gpumon-deploy installs DCGM "
            f"{' or '.join(str(k) for k in sorted(m.dcgm_majors))}",
            f"set dcgm_version to {_dcgm_suggestion(cuda)}",
        )
        return False
    if dcgm not in m.dcgm_releases:
        s.notes.append(f"DCGM {dcgm} is not listed in the matrix")
    floor, cite = m.dcgm_min_for_cuda.get(cuda, (None, None))
    if floor and version_key(dcgm) < version_key(floor):
        variant = m.dcgm_majors.get(version_key(floor)[0], {}).get("cuda_variant")
        needs = (
            f"{variant.format(cuda=cuda)}, first released with DCGM {floor}"
            if variant
            else f"DCGM {floor} or later"
        )
        s.refuse(
            "dcgm-cuda-minimum",
            f"driver {version} (R{branch.name}) is CUDA {cuda} and needs {needs}; "
            f"planned DCGM {dcgm}",
            f"set dcgm_version to {_dcgm_suggestion(cuda)}",
            cite,
            unverified_field="dcgm",
        )
    return True


def _dcgm_suggestion(cuda: int) -> str:
    tag = _default_pair(cuda)
    if tag is None:
        return "a newer release"
    floor = data.matrix().dcgm_min_for_cuda.get(cuda, ("", None))[0]
    return f"{_tag_parts(tag)[0]} (or at least {floor})" if floor else _tag_parts(tag)[0]


def _check_exporter(s: _State, dcgm: str, tag: str) -> None:
    m = data.matrix()
    exp_dcgm, exp_version = _tag_parts(tag)
    exp_major = version_key(exp_version)[0]
    host_major = version_key(dcgm)[0]
    if tag not in m.exporter_tags:
        s.notes.append(f"exporter tag {tag} is not listed in the matrix")
    needs, cite = m.exporter_dcgm_major.get(exp_major, (None, None))
    if needs is None or needs != host_major:
        other = _exporter_for(dcgm)
        suggestion = f" (e.g. {other})" if other else ""
        needs_text = f"needs DCGM {needs}.x (libdcgm.so.{needs})" if needs else "is not supported"
        s.refuse(
            "exporter-dcgm-major",
            f"dcgm-exporter {tag} ({exp_major}.x) {needs_text}; host DCGM is {dcgm}",
            f"plan an exporter tag for DCGM {host_major}.x{suggestion}",
            cite,
        )
        return
    if version_key(exp_dcgm) < version_key(dcgm):
        other = _exporter_for(dcgm)
        suggestion = f" (e.g. {other})" if other else ""
        s.refuse(
            "exporter-dcgm-older",
            f"dcgm-exporter {tag} is built on DCGM {exp_dcgm}, older than the host's DCGM {dcgm}",
            f"plan an exporter tag built on DCGM {dcgm} or later{suggestion}",
            m.exporter_not_older_cite,
        )


def _packages(
    model: GpuModel,
    plan: VersionPlan,
    branch: DriverBranch,
    version: str,
    flavour: str,
    dcgm: str,
    variant: int | None,
    tag: str,
) -> tuple[tuple[PackagePin, ...], tuple[str, ...], tuple[str, ...], str | None, str | None]:
    """(install, hold, remove, pinning package, fabric manager package)."""
    m = data.matrix()
    fmt = {"branch": branch.name, "version": version}
    scheme = m.packages_for(m.driver_packages, branch.name).names
    install: list[PackagePin] = []
    pinning = scheme.get("pinning")
    pinning = pinning.format(**fmt) if pinning else None
    if pinning:
        install.append(PackagePin(pinning, None, None, "driver"))
    deb = scheme["deb_version"].format(**fmt)
    for name in scheme[flavour]:
        install.append(PackagePin(name.format(**fmt), version, deb, "driver"))
    fm_package = None
    if plan.nvswitch:
        fm = m.packages_for(m.fabric_manager, branch.name).names
        fm_deb = fm["deb_version"].format(**fmt)
        fm_package = fm["fabricmanager"].format(**fmt)
        install.append(PackagePin(fm_package, version, fm_deb, "fabricmanager"))
        install.append(PackagePin(fm["nscq"].format(**fmt), version, fm_deb, "fabricmanager"))
    layout = m.dcgm_majors[version_key(dcgm)[0]]
    dcgm_deb = layout["deb_version"].format(version=dcgm)
    names = list(layout["packages"])
    if layout.get("cuda_variant") and variant is not None:
        names.append(layout["cuda_variant"].format(cuda=variant))
    install.extend(PackagePin(n, dcgm, dcgm_deb, "dcgm") for n in names)
    package = m.exporter_package
    exp_version = _tag_parts(tag)[1]
    if version_key(dcgm)[0] == package["dcgm_major"]:
        install.append(
            PackagePin(
                package["name"],
                exp_version,
                package["deb_version"].format(version=exp_version),
                "exporter",
            )
        )
    hold = tuple(p.name for p in install if p.deb_version)
    remove = tuple(layout.get("conflicts") or ())
    return tuple(install), hold, remove, pinning, fm_package


def _evaluate(plan: VersionPlan) -> tuple[ResolvedPlan | None, list[Refusal]]:
    m = data.matrix()
    s = _State(plan)
    model = _effective_model(s)
    if model is None:
        return None, s.refusals
    arch = m.architectures[model.architecture]
    driver = _resolve_driver(s, model)
    if driver is None:
        return None, s.refusals
    branch, version, listed = driver
    _check_driver(s, model, branch, version)
    flavour = _resolve_flavour(s, model, branch)
    pair = _resolve_dcgm(s, branch.cuda_major)
    if pair is None:
        return None, s.refusals
    dcgm, tag = pair
    if not _check_dcgm(s, dcgm, branch, version):
        return None, s.refusals
    _check_exporter(s, dcgm, tag)
    if s.refusals:
        return None, s.refusals

    layout = m.dcgm_majors[version_key(dcgm)[0]]
    variant: int | None = None
    if layout.get("cuda_variant"):
        variant, cite = _variant_major(model, branch.cuda_major)
        if cite is not None:
            s.notes.append(
                f"{model.name} ({arch.title}) on a CUDA {branch.cuda_major} driver takes the "
                f"-cuda{variant} DCGM packages ({cite.source})"
            )
    install, hold, remove, pinning, fm_package = _packages(
        model, plan, branch, version, flavour, dcgm, variant, tag
    )
    return (
        ResolvedPlan(
            host=plan.host,
            gpu_model=model.name,
            architecture=arch.name,
            compute_capability=model.compute_capability,
            gpu_count=plan.gpu_count,
            nvswitch=plan.nvswitch,
            driver_branch=branch.name,
            driver_version=version,
            driver_listed=listed,
            branch_type=branch.type,
            branch_eol=branch.eol,
            cuda_major=branch.cuda_major,
            module_flavour=flavour,
            dcgm_version=dcgm,
            dcgm_major=version_key(dcgm)[0],
            dcgm_cuda_variant=variant,
            dcgm_packages=tuple(p.name for p in install if p.component == "dcgm"),
            exporter_tag=tag,
            exporter_version=_tag_parts(tag)[1],
            exporter_dcgm_version=_tag_parts(tag)[0],
            fabricmanager_package=fm_package,
            fabricmanager_version=version if plan.nvswitch else None,
            pinning_package=pinning,
            install=install,
            hold=hold,
            remove=remove,
            notes=tuple(s.notes),
        ),
        [],
    )


def resolve(plan: VersionPlan) -> ResolvedPlan:
    """What a compatible plan implies; ``PlanRefused`` listing the refusals otherwise."""
    resolved, refusals = _evaluate(plan)
    if resolved is None:
        raise PlanRefused("; ".join(str(r) for r in refusals), key=plan.host)
    return resolved


# What one host's verdict depends on: every field of its plan but its name and rack (the rack
# matters only to the cross-host rule, which reads it from the plan itself).
_VERDICT_FIELDS = tuple(
    f.name for f in dataclasses.fields(VersionPlan) if f.name not in ("host", "rack")
)
_verdict_key = operator.attrgetter(*_VERDICT_FIELDS)  # a plan's fields but host and rack


class _Verdicts:
    """``_evaluate`` once per distinct plan: the hosts of a fleet share a few (GPU model, planned
    versions) combinations, and the rules' verdict is the same for each host of one (the host
    name appears only as the refusals' ``host``, which :meth:`refusals` sets per host)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], tuple[ResolvedPlan | None, list[Refusal]]] = {}

    def evaluate(self, plan: VersionPlan) -> tuple[ResolvedPlan | None, list[Refusal]]:
        """The shared verdict for ``plan``'s combination (its ResolvedPlan and refusals may name
        another host of the same combination)."""
        key = _verdict_key(plan)
        verdict = self._seen.get(key)
        if verdict is None:
            verdict = self._seen[key] = _evaluate(plan)
        return verdict

    def refusals(self, plan: VersionPlan) -> list[Refusal]:
        """``plan``'s refusals, each naming ``plan.host``."""
        return [
            r if r.host == plan.host else dataclasses.replace(r, host=plan.host)
            for r in self.evaluate(plan)[1]
        ]


def _rack_rule(plans: Sequence[VersionPlan], verdicts: _Verdicts) -> list[Refusal]:
    """GB200 NVL72: one driver version per rack."""
    m = data.matrix()
    racks: dict[str, dict[str, str]] = {}
    cites: dict[str, Citation] = {}
    for plan in plans:
        model = m.models.get(plan.gpu_model or "")
        if model is None or not model.rack_uniform_driver or plan.rack is None:
            continue
        resolved, _ = verdicts.evaluate(plan)
        version = resolved.driver_version if resolved else plan.driver_version
        if version:
            racks.setdefault(plan.rack, {})[plan.host] = version
            cites[plan.rack] = model.cite
    out = []
    for rack, hosts in racks.items():
        if len(set(hosts.values())) < 2:
            continue
        listing = ", ".join(f"{v} on {h}" for h, v in sorted(hosts.items()))
        for host in sorted(hosts):
            out.append(
                Refusal(
                    host=host,
                    rule="rack-uniform-driver",
                    message=f"rack {rack} plans different drivers ({listing}); "
                    "an NVL72 rack must run one driver version",
                    fix=f"plan the same driver for every host of rack {rack}",
                    source=cites[rack].source,
                    verified=not cites[rack].covers("rack_uniform_driver"),
                )
            )
    return out


def check(plans: Iterable[VersionPlan]) -> list[Refusal]:
    """Every refusal for these plans, host by host, then the cross-host rules."""
    plans = list(plans)
    verdicts = _Verdicts()
    refusals: list[Refusal] = []
    for plan in plans:
        refusals.extend(verdicts.refusals(plan))
    refusals.extend(_rack_rule(plans, verdicts))
    return refusals
