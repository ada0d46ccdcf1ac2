"""The compatibility matrix's data: driver branches, GPU architectures and models, package
schemes, DCGM and dcgm-exporter releases, loaded once from ``deployer/data/compat.yml`` (each
entry cites its source in the technical reference and marks community/unverified facts) and
shape-checked on load; and a GPU name as nvidia-smi or lspci prints it mapped to its model.

``matrix() -> Matrix``
    The loaded data (branches, architectures, models, ...), e.g. for listing known names.
``model_from_gpu_name(name) -> str | None``
    The canonical model for a name as nvidia-smi or lspci (``-nn`` too) prints it, or None.

The rest of the package reads the data through this module (``deployer.gpu.version_plan``,
``rules``, ``verify``); the version patterns (``DRIVER_VERSION_RE`` ...) are shared from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.yamlsrc import SourceDict, load_yaml_file

DATA_FILE = Path(__file__).parent.parent / "data" / "compat.yml"

FLAVOURS = ("auto", "open", "proprietary")
MODULE_KINDS = ("open_required", "open_default", "proprietary_only")
UNVERIFIED_TAGS = ("C", "U")

DRIVER_VERSION_RE = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$")
VERSION_TRIPLE_RE = re.compile(r"^\d+\.\d+\.\d+$")
EXPORTER_TAG_RE = re.compile(r"^(\d+\.\d+\.\d+)-(\d+\.\d+\.\d+)$")
BRANCH_RE = re.compile(r"^[Rr]?(\d{3})$")
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
            if not isinstance(version, str) or not DRIVER_VERSION_RE.match(version):
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


def models_from_gpu_names(names: list[str]) -> tuple[dict[str, str], str | None]:
    """The models a host's GPU names show, each with the first name that shows it, in order, and
    the first name no model matches (None: every name is known). One model and no unknown name:
    the host's model (gpu/rules.py ``_effective_model``, init_inventory.py ``finding``)."""
    seen: dict[str, str] = {}
    for name in names:
        model = model_from_gpu_name(name)
        if model is None:
            return seen, name
        seen.setdefault(model, name)
    return seen, None
