"""The driver / GPU / DCGM / dcgm-exporter / Fabric Manager compatibility matrix and its rules.

Owns the rules; the facts live in ``deployer/data/compat.yml`` (each entry cites its source in
the technical reference and marks community/unverified facts). Pure: the only I/O is loading that
file once.

Public API
----------
``plan_from_vars(host, variables, *, gpu_names=None, origin=None) -> HostPlan``
    Build a host's version plan from its resolved inventory variables (``gpu_model``,
    ``gpu_count``, ``nvswitch``, ``rack``, ``nvidia_driver_version`` / ``nvidia_driver_branch``,
    ``nvidia_module_flavour``, ``dcgm_version``, ``dcgm_exporter_version``). ``gpu_names`` are the
    GPU names from facts (nvidia-smi or lspci); when given they decide the model (``gpu_model``
    may then be absent) and a disagreement with the inventory is a refusal. ``origin(key)`` may
    return ``(source, line)`` for error messages; a ``SourceDict`` is asked directly. Malformed
    values, unknown GPU models, unknown branches and wrong types raise ``InputError(key=...)``.
``plans_from_vars([(host, variables, gpu_names), ...]) -> list[HostPlan]``
    The same for many hosts; hosts with equal plan variables share one validation.
``check(plans) -> list[Refusal]``
    Every rule against every plan, plus the cross-host rules (one driver per GB200 rack).
    Empty list = the plans are compatible. Each distinct combination of model and planned
    versions is judged once; its refusals are repeated for each of its hosts, under its name.
``resolve(plan) -> ResolvedPlan``
    What a compatible plan implies: exact driver version and branch, CUDA major, module flavour,
    DCGM version and packages, exporter tag, Fabric Manager package and version, the ordered
    ``install`` list of ``PackagePin`` (``.apt`` gives ``name=deb_version``), the ``hold`` and
    ``remove`` lists. Raises ``PlanRefused`` (message lists the refusals) for a refused plan.
``verify(resolved, observed) -> list[Mismatch]``
    After converge: compare a host's observed versions (``ObservedVersions``, from facts) with
    the resolved plan and the matrix: reboot required, wrong driver / flavour / Fabric Manager /
    DCGM version or CUDA variant / exporter version, exporter older than the host's DCGM, GPUs of
    another model.
``resolve_target(to) -> DriverTarget``
    For ``upgrade-driver --to``: a branch (``580`` or ``R580``) picks the newest version of that
    branch the matrix knows; a full version (``580.126.20``) must be well-formed and of a known
    branch but need not be listed (NVIDIA ships patch releases faster than this file is edited;
    ``DriverTarget.listed`` says whether it is). Anything else raises ``InputError(key="--to")``.
    ``HostPlan.retarget(target)`` gives the plan with that driver, to ``check`` before a rollout.
``model_from_gpu_name(name) -> str | None``
    The canonical model for a name as nvidia-smi or lspci (``-nn`` too) prints it, or None.
``matrix() -> Matrix``
    The loaded data (branches, architectures, models, ...), e.g. for listing known names.

Defaults when the plan leaves a version out: the driver is the newest known version of the
newest LTSB or PB branch that supports the GPU; DCGM and the exporter are a tested pair (an
exporter tag and the DCGM it was built on): with neither set, the newest exporter tag whose DCGM
is new enough for the driver's CUDA major; with only one set, the other follows from it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from deployer.booleans import as_boolean
from deployer.errors import InputError, PlanRefused
from deployer.yamlsrc import SourceDict, load_yaml_file

DATA_FILE = Path(__file__).parent / "data" / "compat.yml"

FLAVOURS = ("auto", "open", "proprietary")
MODULE_KINDS = ("open_required", "open_default", "proprietary_only")
UNVERIFIED_TAGS = ("C", "U")

_DRIVER_RE = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$")
_TRIPLE_RE = re.compile(r"^\d+\.\d+\.\d+$")
_TAG_RE = re.compile(r"^(\d+\.\d+\.\d+)-(\d+\.\d+\.\d+)$")
_BRANCH_RE = re.compile(r"^[Rr]?(\d{3})$")
_WORD_RE = re.compile(r"[A-Za-z0-9]+")
_PCI_RE = re.compile(r"\b10de:([0-9a-fA-F]{4})\b")


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key of a dotted version ("580.126.20" -> (580, 126, 20))."""
    return tuple(int(part) for part in version.split("."))


# --------------------------------------------------------------------------------------------
# The matrix, as loaded from the data file
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Citation:
    """Where a fact comes from and how sure the reference is of it."""

    source: str
    tag: str
    unverified: tuple[str, ...] = ()

    @property
    def verified(self) -> bool:
        return self.tag not in UNVERIFIED_TAGS

    def covers(self, name: str) -> bool:
        """True when field ``name`` of the entry rests on an unverified fact."""
        return "*" in self.unverified or name in self.unverified

    def __str__(self) -> str:
        note = "" if self.verified else f", unverified: {', '.join(self.unverified)}"
        return f"{self.source} [{self.tag}{note}]"


@dataclass(frozen=True)
class DriverBranch:
    name: str
    type: str | None
    eol: str | None
    cuda_major: int
    versions: dict[str, Citation]
    cite: Citation

    def newest(self) -> str | None:
        return max(self.versions, key=version_key) if self.versions else None


@dataclass(frozen=True)
class Architecture:
    name: str
    compute_capability: tuple[str, ...]
    min_driver: str | None
    last_branch: str | None
    module: str
    cite: Citation

    @property
    def title(self) -> str:
        return self.name.capitalize()


@dataclass(frozen=True)
class GpuModel:
    name: str
    architecture: str
    compute_capability: str
    aliases: tuple[str, ...]
    names: tuple[str, ...]  # as nvidia-smi prints them
    pci_ids: tuple[str, ...]
    min_driver: str | None
    module: str | None
    rack_uniform_driver: bool
    cite: Citation
    name_sources: dict[str, str] = field(default_factory=dict)  # name -> where it is seen
    memory_temp_sensor: bool | None = None  # None: not known
    mig: bool = False


@dataclass(frozen=True)
class PackageScheme:
    """Package names for a branch range (inclusive bounds, None = open-ended)."""

    min_branch: str | None
    max_branch: str | None
    names: dict[str, Any]
    cite: Citation

    def applies(self, branch: str) -> bool:
        b = int(branch)
        return (self.min_branch is None or b >= int(self.min_branch)) and (
            self.max_branch is None or b <= int(self.max_branch)
        )


@dataclass(frozen=True)
class Matrix:
    """The whole data file, checked for shape when loaded."""

    branches: dict[str, DriverBranch]
    open_available_since: str
    open_default_since: str
    flavours_cite: Citation
    architectures: dict[str, Architecture]
    models: dict[str, GpuModel]
    driver_packages: tuple[PackageScheme, ...]
    fabric_manager: tuple[PackageScheme, ...]
    fm_cite: Citation
    dcgm_majors: dict[int, dict[str, Any]]
    dcgm_majors_cite: dict[int, Citation]
    dcgm_min_for_cuda: dict[int, tuple[str, Citation]]
    dcgm_variant_exceptions: tuple[tuple[frozenset[str], int, int, Citation], ...]
    dcgm_releases: dict[str, Citation]
    exporter_dcgm_major: dict[int, tuple[int, Citation]]
    exporter_not_older_cite: Citation
    exporter_package: dict[str, Any]
    exporter_package_cite: Citation
    exporter_tags: dict[str, Citation]

    def model(self, name: str) -> GpuModel | None:
        """A model by canonical name or alias, case-insensitive."""
        wanted = name.strip().upper()
        for model in self.models.values():
            if wanted == model.name.upper() or wanted in (a.upper() for a in model.aliases):
                return model
        return None

    def packages_for(self, schemes: Iterable[PackageScheme], branch: str) -> PackageScheme:
        for scheme in schemes:
            if scheme.applies(branch):
                return scheme
        raise LookupError(f"no package scheme covers branch {branch}")  # data integrity bug

    def branch_of(self, version: str) -> DriverBranch | None:
        return self.branches.get(version.split(".")[0])


class _Reader:
    """Reads one section of the data file, raising InputError with file:line on bad shape."""

    def __init__(self, data: Any, path: str) -> None:
        self.data = data
        self.path = path

    def fail(self, where: Any, key: str, message: str) -> InputError:
        line = where.line_of(key) if isinstance(where, SourceDict) else None
        return InputError(message, source=self.path, line=line, key=key)

    def get(self, mapping: Any, key: str, kinds: tuple[type, ...], *, optional: bool = False):
        if not isinstance(mapping, dict):
            raise InputError("expected a mapping", source=self.path, key=key)
        if key not in mapping:
            if optional:
                return None
            raise self.fail(mapping, key, "missing")
        value = mapping[key]
        if value is None and optional:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.fail(mapping, key, f"expected {'/'.join(k.__name__ for k in kinds)}")
        return value

    def cite(self, entry: Any, key: str) -> Citation:
        source = self.get(entry, "source", (str,))
        tag = self.get(entry, "tag", (str,))
        if tag not in ("V", "E", "D", "C", "U"):
            raise self.fail(entry, "tag", f"{key}: tag must be one of V E D C U")
        unverified = tuple(
            str(u) for u in (self.get(entry, "unverified", (list,), optional=True) or [])
        )
        if tag in UNVERIFIED_TAGS and not unverified:
            raise self.fail(entry, "tag", f"{key}: a {tag} entry must list its unverified fields")
        return Citation(source, tag, unverified)


def load_matrix(path: str | Path = DATA_FILE) -> Matrix:
    """Load and shape-check a matrix file (the default one is cached by ``matrix()``)."""
    data = load_yaml_file(path)
    r = _Reader(data, str(path))

    branches = {}
    for name, entry in r.get(data, "driver_branches", (dict,)).items():
        name = str(name)
        versions = {}
        for version, vcite in r.get(entry, "versions", (dict,)).items():
            if not isinstance(version, str) or not _DRIVER_RE.match(version):
                raise r.fail(
                    entry, "versions", f"{name}: version {version!r} is not a quoted x.y[.z]"
                )
            if version.split(".")[0] != name:
                raise r.fail(entry, "versions", f"{name}: version {version} is of another branch")
            versions[version] = r.cite(vcite, version)
        branches[name] = DriverBranch(
            name=name,
            type=r.get(entry, "type", (str,), optional=True),
            eol=r.get(entry, "eol", (str,), optional=True),
            cuda_major=r.get(entry, "cuda_major", (int,)),
            versions=versions,
            cite=r.cite(entry, name),
        )

    flav = r.get(data, "module_flavours", (dict,))
    archs = {}
    for name, entry in r.get(data, "architectures", (dict,)).items():
        module = r.get(entry, "module", (str,))
        if module not in MODULE_KINDS:
            raise r.fail(entry, "module", f"{name}: module must be one of {MODULE_KINDS}")
        archs[name] = Architecture(
            name=name,
            compute_capability=tuple(r.get(entry, "compute_capability", (list,))),
            min_driver=r.get(entry, "min_driver", (str,), optional=True),
            last_branch=r.get(entry, "last_branch", (str,), optional=True),
            module=module,
            cite=r.cite(entry, name),
        )

    models = {}
    for name, entry in r.get(data, "gpu_models", (dict,)).items():
        module = r.get(entry, "module", (str,), optional=True)
        if module is not None and module not in MODULE_KINDS:
            raise r.fail(entry, "module", f"{name}: module must be one of {MODULE_KINDS}")
        names = r.get(entry, "names", (dict,), optional=True) or {}
        for shown, where in names.items():
            if not isinstance(where, str) or not where.strip():
                raise r.fail(entry, "names", f"{name}: name {shown!r} must say where it is seen")
        models[name] = GpuModel(
            name=name,
            architecture=r.get(entry, "architecture", (str,)),
            compute_capability=r.get(entry, "compute_capability", (str,)),
            aliases=tuple(r.get(entry, "aliases", (list,), optional=True) or ()),
            names=tuple(str(n) for n in names),
            pci_ids=tuple(
                str(p).lower() for p in r.get(entry, "pci_ids", (list,), optional=True) or ()
            ),
            min_driver=r.get(entry, "min_driver", (str,), optional=True),
            module=module,
            rack_uniform_driver=bool(r.get(entry, "rack_uniform_driver", (bool,), optional=True)),
            cite=r.cite(entry, name),
            name_sources={str(k): str(v) for k, v in names.items()},
            memory_temp_sensor=r.get(entry, "memory_temp_sensor", (bool,), optional=True),
            mig=bool(r.get(entry, "mig", (bool,), optional=True)),
        )

    def schemes(entries: Any, label: str) -> tuple[PackageScheme, ...]:
        out = []
        for i, entry in enumerate(entries):
            out.append(
                PackageScheme(
                    min_branch=r.get(entry, "min_branch", (str,), optional=True),
                    max_branch=r.get(entry, "max_branch", (str,), optional=True),
                    names={
                        k: v for k, v in entry.items() if k not in ("source", "tag", "unverified")
                    },
                    cite=r.cite(entry, f"{label}[{i}]"),
                )
            )
        return tuple(out)

    fm = r.get(data, "fabric_manager", (dict,))
    dcgm = r.get(data, "dcgm", (dict,))
    dcgm_majors, dcgm_majors_cite = {}, {}
    for major, entry in r.get(dcgm, "majors", (dict,)).items():
        dcgm_majors[int(major)] = dict(entry)
        dcgm_majors_cite[int(major)] = r.cite(entry, f"dcgm.majors.{major}")
    exceptions = tuple(
        (
            frozenset(r.get(e, "architectures", (list,))),
            r.get(e, "driver_cuda_major", (int,)),
            r.get(e, "variant_cuda_major", (int,)),
            r.cite(e, "dcgm.variant_exceptions"),
        )
        for e in r.get(dcgm, "variant_exceptions", (list,))
    )
    exp = r.get(data, "dcgm_exporter", (dict,))
    package = r.get(exp, "package", (dict,))
    return Matrix(
        branches=branches,
        open_available_since=r.get(flav, "open_available_since_branch", (str,)),
        open_default_since=r.get(flav, "open_default_since_branch", (str,)),
        flavours_cite=r.cite(flav, "module_flavours"),
        architectures=archs,
        models=models,
        driver_packages=schemes(r.get(data, "driver_packages", (list,)), "driver_packages"),
        fabric_manager=schemes(r.get(fm, "packages", (list,)), "fabric_manager.packages"),
        fm_cite=r.cite(fm, "fabric_manager"),
        dcgm_majors=dcgm_majors,
        dcgm_majors_cite=dcgm_majors_cite,
        dcgm_min_for_cuda={
            int(cuda): (r.get(e, "dcgm", (str,)), r.cite(e, f"dcgm.min_for_cuda.{cuda}"))
            for cuda, e in r.get(dcgm, "min_for_cuda", (dict,)).items()
        },
        dcgm_variant_exceptions=exceptions,
        dcgm_releases={
            str(v): r.cite(e, str(v)) for v, e in r.get(dcgm, "releases", (dict,)).items()
        },
        exporter_dcgm_major={
            int(major): (r.get(e, "dcgm_major", (int,)), r.cite(e, f"exporter major {major}"))
            for major, e in r.get(exp, "dcgm_major_for_exporter_major", (dict,)).items()
        },
        exporter_not_older_cite=r.cite(
            r.get(exp, "dcgm_not_older_than_host", (dict,)), "dcgm_not_older_than_host"
        ),
        exporter_package={
            k: v for k, v in package.items() if k not in ("source", "tag", "unverified")
        },
        exporter_package_cite=r.cite(package, "dcgm_exporter.package"),
        exporter_tags={str(t): r.cite(e, str(t)) for t, e in r.get(exp, "tags", (dict,)).items()},
    )


@cache
def matrix() -> Matrix:
    """The packaged matrix, loaded once."""
    return load_matrix(DATA_FILE)


# --------------------------------------------------------------------------------------------
# GPU names from facts
# --------------------------------------------------------------------------------------------


def model_from_gpu_name(name: str) -> str | None:
    """Canonical model for a GPU name as nvidia-smi or lspci prints it, or None.

    A PCI id in the name (``lspci -nn``: "... [10de:2330]", or a bare "10de:2330") wins, then an
    exact (case-insensitive) listed name; otherwise a name matches a model when the model's name
    or an alias appears in it as a word ("Tesla V100-SXM2-32GB" -> V100). A name that matches
    several models is ambiguous and gives None.
    """
    m = matrix()
    pci = _PCI_RE.search(name)
    if pci:
        for model in m.models.values():
            if pci.group(1).lower() in model.pci_ids:
                return model.name
    folded = name.strip().casefold()
    for model in m.models.values():
        if any(folded == n.casefold() for n in model.names):
            return model.name
    words = {w.upper() for w in _WORD_RE.findall(name)}
    # multi-word canonical names ("RTX-PRO-6000") match as a word sequence
    joined = " ".join(w.upper() for w in _WORD_RE.findall(name))
    found = set()
    for model in m.models.values():
        for token in (model.name, *model.aliases):
            parts = [p.upper() for p in _WORD_RE.findall(token)]
            if (len(parts) == 1 and parts[0] in words) or (
                len(parts) > 1 and re.search(rf"\b{' '.join(parts)}\b", joined)
            ):
                found.add(model.name)
    return found.pop() if len(found) == 1 else None


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriverTarget:
    """A driver chosen for ``upgrade-driver --to``."""

    requested: str
    branch: str
    version: str
    listed: bool


@dataclass(frozen=True)
class HostPlan:
    """One GPU host's planned versions, validated for shape but not yet against the matrix."""

    host: str
    gpu_model: str | None
    gpu_count: int
    nvswitch: bool = False
    rack: str | None = None
    driver_version: str | None = None
    driver_branch: str | None = None
    module_flavour: str = "auto"
    dcgm_version: str | None = None
    exporter_tag: str | None = None
    gpu_names: tuple[str, ...] = ()

    def retarget(self, target: DriverTarget) -> HostPlan:
        """This plan with the driver replaced by ``target`` (for a rolling upgrade)."""
        return dataclasses.replace(self, driver_version=target.version, driver_branch=target.branch)


def plan_from_vars(
    host: str,
    variables: Mapping[str, Any],
    *,
    gpu_names: Sequence[str] | None = None,
    origin: Callable[[str], tuple[str | None, int | None]] | None = None,
) -> HostPlan:
    """A host's plan from its resolved variables; bad values raise ``InputError(key=...)``."""
    m = matrix()

    def bad(key: str, message: str) -> InputError:
        source, line = None, None
        if origin is not None:
            source, line = origin(key)
        elif isinstance(variables, SourceDict):
            source, line = variables.source, variables.line_of(key)
        return InputError(f"host {host}: {message}", source=source, line=line, key=key)

    def text(key: str) -> str | None:
        value = variables.get(key)
        if value is None or value == "":
            return None
        if isinstance(value, float):
            raise bad(key, f"{value!r} loaded as a number; quote the version, e.g. '{value}'")
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise bad(key, f"expected a string, got {type(value).__name__}")
        return str(value).strip()

    gpu_model = text("gpu_model")
    if gpu_model is not None:
        model = m.model(gpu_model)
        if model is None:
            raise bad("gpu_model", f"unknown GPU model {gpu_model!r}; known: {', '.join(m.models)}")
        gpu_model = model.name
    elif not gpu_names:
        raise bad("gpu_model", "not set, and no GPU names from facts (needed with --offline)")

    count = variables.get("gpu_count")
    if count is None:
        count = len(gpu_names) if gpu_names else None
    if isinstance(count, str) and count.strip().isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise bad("gpu_count", f"expected a positive integer, got {count!r}")

    nvswitch = as_boolean(variables.get("nvswitch", False))
    if nvswitch is None:
        raise bad("nvswitch", f"expected true or false, got {variables.get('nvswitch')!r}")

    rack = variables.get("rack")
    rack = None if rack is None else str(rack)

    version = text("nvidia_driver_version")
    if version is not None:
        if not _DRIVER_RE.match(version):
            raise bad(
                "nvidia_driver_version", f"{version!r} is not a driver version like 580.126.20"
            )
        if version.split(".")[0] not in m.branches:
            raise bad(
                "nvidia_driver_version",
                f"{version} is of unknown branch R{version.split('.')[0]}; "
                f"known branches: {', '.join(m.branches)}",
            )
    branch = text("nvidia_driver_branch")
    if branch is not None:
        match = _BRANCH_RE.match(branch)
        if not match:
            raise bad("nvidia_driver_branch", f"{branch!r} is not a branch like 580")
        branch = match.group(1)
        if branch not in m.branches:
            raise bad(
                "nvidia_driver_branch",
                f"unknown branch R{branch}; known branches: {', '.join(m.branches)}",
            )
        if version is not None and version.split(".")[0] != branch:
            raise bad(
                "nvidia_driver_version",
                f"{version} is not of nvidia_driver_branch {branch}; set one or make them agree",
            )
    elif version is not None:
        branch = version.split(".")[0]

    flavour = text("nvidia_module_flavour") or "auto"
    if flavour not in FLAVOURS:
        raise bad("nvidia_module_flavour", f"{flavour!r} is not one of {', '.join(FLAVOURS)}")

    dcgm = text("dcgm_version")
    if dcgm is not None and not _TRIPLE_RE.match(dcgm):
        raise bad("dcgm_version", f"{dcgm!r} is not a DCGM version like 4.4.2")
    tag = text("dcgm_exporter_version")
    if tag is not None and not _TAG_RE.match(tag):
        raise bad("dcgm_exporter_version", f"{tag!r} is not an exporter tag like 4.4.2-4.7.1")

    return HostPlan(
        host=host,
        gpu_model=gpu_model,
        gpu_count=count,
        nvswitch=nvswitch,
        rack=rack,
        driver_version=version,
        driver_branch=branch,
        module_flavour=flavour,
        dcgm_version=dcgm,
        exporter_tag=tag,
        gpu_names=tuple(gpu_names or ()),
    )


# The variables plan_from_vars reads (tests/unit/test_compat_plan.py holds it to that).
PLAN_VARS = (
    "gpu_model",
    "gpu_count",
    "nvswitch",
    "rack",
    "nvidia_driver_version",
    "nvidia_driver_branch",
    "nvidia_module_flavour",
    "dcgm_version",
    "dcgm_exporter_version",
)
_ABSENT = object()


def plans_from_vars(
    hosts: Iterable[tuple[str, Mapping[str, Any], Sequence[str] | None]],
) -> list[HostPlan]:
    """``plan_from_vars`` for each ``(host, variables, gpu_names)``, in order; hosts whose plan
    variables (all but ``rack``) and GPU names are equal, with equal types, share one validation
    (a fleet has a few combinations, and validating each host was a quarter of checking 100,000).
    The first host with bad values raises, as it would alone."""
    shared: dict[tuple[Any, ...], HostPlan] = {}
    plans = []
    for host, variables, gpu_names in hosts:
        values = [variables.get(name, _ABSENT) for name in PLAN_VARS if name != "rack"]
        key: tuple[Any, ...] | None = (
            *((type(v), v) for v in values),
            tuple(gpu_names) if gpu_names is not None else None,
        )
        try:
            plan = shared.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable value (a list where a version belongs): no sharing
            plan, key = None, None
        if plan is None:
            plan = plan_from_vars(host, variables, gpu_names=gpu_names)
            if key is not None:
                shared[key] = plan
        else:
            rack = variables.get("rack")
            plan = dataclasses.replace(plan, host=host, rack=None if rack is None else str(rack))
        plans.append(plan)
    return plans


def resolve_target(to: str) -> DriverTarget:
    """The driver an ``upgrade-driver --to BRANCH_OR_VERSION`` means (see module docstring)."""
    m = matrix()
    value = str(to).strip()
    branch_match = _BRANCH_RE.match(value)
    if branch_match:
        name = branch_match.group(1)
        branch = m.branches.get(name)
        if branch is None:
            raise InputError(f"unknown branch R{name}; known: {', '.join(m.branches)}", key="--to")
        newest = branch.newest()
        if newest is None:
            raise InputError(
                f"no version of R{name} is known to the matrix; pass a full version like "
                f"{name}.xx.yy",
                key="--to",
            )
        return DriverTarget(requested=value, branch=name, version=newest, listed=True)
    if not _DRIVER_RE.match(value):
        raise InputError(
            f"{value!r} is neither a branch (580) nor a version (580.126.20)", key="--to"
        )
    branch = m.branch_of(value)
    if branch is None:
        raise InputError(
            f"{value} is of unknown branch R{value.split('.')[0]}; known: {', '.join(m.branches)}",
            key="--to",
        )
    return DriverTarget(
        requested=value, branch=branch.name, version=value, listed=value in branch.versions
    )


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

    plan: HostPlan
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
    m, plan = matrix(), s.plan
    inventory = m.models[plan.gpu_model] if plan.gpu_model else None
    if not plan.gpu_names:
        return inventory
    seen: dict[str, str] = {}
    for name in plan.gpu_names:
        model = model_from_gpu_name(name)
        if model is None:
            s.refuse(
                "gpu-name-unknown",
                f"GPU name {name!r} from facts matches no model in the matrix",
                "add the name to deployer/data/compat.yml, or set gpu_model and run with --offline",
            )
            return None
        seen.setdefault(model, name)
    if len(seen) > 1:
        s.refuse(
            "gpu-models-mixed",
            f"facts show several GPU models ({', '.join(sorted(seen))}); a plan covers one model",
            "split the host's GPUs by model or check the facts",
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
    m = matrix()
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
    m = matrix()
    candidates = [
        b
        for b in m.branches.values()
        if b.type in ("LTSB", "PB") and b.newest() and _supports(model, b.newest() or "")
    ]
    return max(candidates, key=lambda b: int(b.name), default=None)


def _resolve_driver(s: _State, model: GpuModel) -> tuple[DriverBranch, str, bool] | None:
    m, plan = matrix(), s.plan
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
    m = matrix()
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
    m = matrix()
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
    for archs, driver_cuda, variant, cite in matrix().dcgm_variant_exceptions:
        if model.architecture in archs and cuda_major == driver_cuda:
            return variant, cite
    return cuda_major, None


def _tag_parts(tag: str) -> tuple[str, str]:
    match = _TAG_RE.match(tag)
    assert match is not None  # validated when the plan was built
    return match.group(1), match.group(2)


def _exporter_for(dcgm_version: str) -> str | None:
    """Newest known exporter tag of the host's DCGM major built on DCGM >= ``dcgm_version``."""
    m = matrix()
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
    m = matrix()
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
    m = matrix()
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
    floor = matrix().dcgm_min_for_cuda.get(cuda, ("", None))[0]
    return f"{_tag_parts(tag)[0]} (or at least {floor})" if floor else _tag_parts(tag)[0]


def _check_exporter(s: _State, dcgm: str, tag: str) -> None:
    m = matrix()
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
    plan: HostPlan,
    branch: DriverBranch,
    version: str,
    flavour: str,
    dcgm: str,
    variant: int | None,
    tag: str,
) -> tuple[tuple[PackagePin, ...], tuple[str, ...], tuple[str, ...], str | None, str | None]:
    """(install, hold, remove, pinning package, fabric manager package)."""
    m = matrix()
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


def _evaluate(plan: HostPlan) -> tuple[ResolvedPlan | None, list[Refusal]]:
    m = matrix()
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


def resolve(plan: HostPlan) -> ResolvedPlan:
    """What a compatible plan implies; ``PlanRefused`` listing the refusals otherwise."""
    resolved, refusals = _evaluate(plan)
    if resolved is None:
        raise PlanRefused("; ".join(str(r) for r in refusals), key=plan.host)
    return resolved


# What one host's verdict depends on: every field of its plan but its name and rack (the rack
# matters only to the cross-host rule, which reads it from the plan itself).
_VERDICT_FIELDS = tuple(
    f.name for f in dataclasses.fields(HostPlan) if f.name not in ("host", "rack")
)


class _Verdicts:
    """``_evaluate`` once per distinct plan: the hosts of a fleet share a few (GPU model, planned
    versions) combinations, and the rules' verdict is the same for each host of one (the host
    name appears only as the refusals' ``host``, which :meth:`refusals` sets per host)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], tuple[ResolvedPlan | None, list[Refusal]]] = {}

    def evaluate(self, plan: HostPlan) -> tuple[ResolvedPlan | None, list[Refusal]]:
        """The shared verdict for ``plan``'s combination (its ResolvedPlan and refusals may name
        another host of the same combination)."""
        key = tuple(getattr(plan, name) for name in _VERDICT_FIELDS)
        verdict = self._seen.get(key)
        if verdict is None:
            verdict = self._seen[key] = _evaluate(plan)
        return verdict

    def refusals(self, plan: HostPlan) -> list[Refusal]:
        """``plan``'s refusals, each naming ``plan.host``."""
        return [
            r if r.host == plan.host else dataclasses.replace(r, host=plan.host)
            for r in self.evaluate(plan)[1]
        ]


def _rack_rule(plans: Sequence[HostPlan], verdicts: _Verdicts) -> list[Refusal]:
    """GB200 NVL72: one driver version per rack."""
    m = matrix()
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


def check(plans: Iterable[HostPlan]) -> list[Refusal]:
    """Every refusal for these plans, host by host, then the cross-host rules."""
    plans = list(plans)
    verdicts = _Verdicts()
    refusals: list[Refusal] = []
    for plan in plans:
        refusals.extend(verdicts.refusals(plan))
    refusals.extend(_rack_rule(plans, verdicts))
    return refusals


# --------------------------------------------------------------------------------------------
# Verification of a converged host
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedVersions:
    """What facts found on a host. Versions may carry an epoch or Debian revision; None = absent.

    ``driver_smi`` is None when nvidia-smi failed (e.g. "Driver/library version mismatch").
    ``exporter_version`` may be a tag (``4.5.3-4.8.2``) or the package's exporter version.
    ``module_flavour`` is ``open``/``proprietary`` (from ``modinfo -F license nvidia``).
    """

    driver_installed: str | None = None
    driver_loaded: str | None = None
    driver_smi: str | None = None
    module_flavour: str | None = None
    dcgm_version: str | None = None
    dcgm_packages: tuple[str, ...] = ()
    exporter_version: str | None = None
    fabricmanager_version: str | None = None
    gpu_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mismatch:
    """A difference between a host's observed state and its resolved plan."""

    host: str
    rule: str
    message: str
    fix: str
    expected: str | None
    observed: str | None

    def __str__(self) -> str:
        return f"{self.host}: {self.message}; {self.fix} [{self.rule}]"


def upstream_version(version: str | None) -> str | None:
    """Strip a Debian epoch and revision: ``1:4.5.3-1`` -> ``4.5.3``."""
    if version is None:
        return None
    v = version.strip()
    if ":" in v:
        v = v.split(":", 1)[1]
    return v.split("-", 1)[0] or None


def verify(resolved: ResolvedPlan, observed: ObservedVersions) -> list[Mismatch]:
    """Differences between what facts found and what the plan resolved to."""
    host = resolved.host
    out: list[Mismatch] = []

    def add(rule: str, message: str, fix: str, expected: str | None, seen: str | None) -> None:
        out.append(Mismatch(host, rule, message, fix, expected, seen))

    want = resolved.driver_version
    installed = upstream_version(observed.driver_installed)
    loaded = upstream_version(observed.driver_loaded)
    smi = upstream_version(observed.driver_smi)
    if installed != want:
        add(
            "driver-version",
            f"driver package {installed or 'not installed'}, planned {want}",
            "run the nvidia_driver role",
            want,
            installed,
        )
    if installed and loaded != installed:
        add(
            "reboot-required",
            f"loaded driver {loaded or 'none'} differs from the installed {installed}",
            "reboot the host (or reload the nvidia modules)",
            installed,
            loaded,
        )
    elif loaded and smi != loaded:
        add(
            "driver-smi",
            f"nvidia-smi reports {smi or 'an error'} but the loaded module is {loaded}",
            "reboot the host (user-space and kernel module disagree)",
            loaded,
            smi,
        )
    if observed.module_flavour and observed.module_flavour != resolved.module_flavour:
        add(
            "module-flavour",
            f"{observed.module_flavour} kernel modules loaded, planned {resolved.module_flavour}",
            f"install the {resolved.module_flavour} driver packages and reboot",
            resolved.module_flavour,
            observed.module_flavour,
        )
    if resolved.nvswitch:
        fm = upstream_version(observed.fabricmanager_version)
        if fm != want or (installed and fm != installed):
            driver = installed if installed and installed != want else want
            add(
                "fabricmanager-version",
                f"Fabric Manager {fm or 'not installed'}, must equal the driver {driver}"
                + ("" if driver == want else f" (planned {want})"),
                f"install {resolved.fabricmanager_package}={want} together with the driver",
                want,
                fm,
            )
    dcgm = upstream_version(observed.dcgm_version)
    if dcgm != resolved.dcgm_version:
        add(
            "dcgm-version",
            f"DCGM {dcgm or 'not installed'}, planned {resolved.dcgm_version}",
            "run the dcgm role",
            resolved.dcgm_version,
            dcgm,
        )
    if resolved.dcgm_cuda_variant is not None and observed.dcgm_packages:
        expected = next(p for p in resolved.dcgm_packages if re.search(r"-cuda\d+$", p))
        wrong = sorted(
            p for p in observed.dcgm_packages if re.search(r"-cuda\d+$", p) and p != expected
        )
        if expected not in observed.dcgm_packages or wrong:
            found = ", ".join(wrong) or "none"
            add(
                "dcgm-package-variant",
                f"CUDA {resolved.cuda_major} driver (R{resolved.driver_branch}) needs "
                f"{expected}, not {found}",
                f"install {expected} and remove {found}",
                expected,
                found,
            )
    seen_exporter = observed.exporter_version
    if seen_exporter is not None:
        tag_match = _TAG_RE.match(seen_exporter.strip())
        if tag_match:
            exp_dcgm, exp_version = tag_match.group(1), tag_match.group(2)
        else:
            exp_dcgm, exp_version = None, upstream_version(seen_exporter)
        if exp_version != resolved.exporter_version or (
            exp_dcgm is not None and exp_dcgm != resolved.exporter_dcgm_version
        ):
            add(
                "exporter-version",
                f"dcgm-exporter {seen_exporter.strip()}, planned {resolved.exporter_tag}",
                "run the dcgm_exporter role",
                resolved.exporter_tag,
                seen_exporter,
            )
        if exp_dcgm is not None and dcgm and version_key(exp_dcgm) < version_key(dcgm):
            add(
                "exporter-dcgm-older",
                f"dcgm-exporter is built on DCGM {exp_dcgm}, older than the host's DCGM {dcgm}",
                "install an exporter built on the host's DCGM or later",
                dcgm,
                exp_dcgm,
            )
    else:
        add(
            "exporter-version",
            f"dcgm-exporter not installed, planned {resolved.exporter_tag}",
            "run the dcgm_exporter role",
            resolved.exporter_tag,
            None,
        )
    for name in observed.gpu_names:
        model = model_from_gpu_name(name)
        if model != resolved.gpu_model:
            add(
                "gpu-model",
                f"GPU {name!r} is {model or 'an unknown model'}, planned {resolved.gpu_model}",
                "correct gpu_model in the inventory",
                resolved.gpu_model,
                name,
            )
            break
    return out
