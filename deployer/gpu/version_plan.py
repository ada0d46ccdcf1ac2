"""A GPU host's version plan: the versions its inventory variables ask for, validated for shape
(not yet against the rules), and the driver an ``upgrade-driver --to`` means.

``plan_from_vars(host, variables, *, gpu_names=None, origin=None) -> VersionPlan``
    Build a host's version plan from its resolved inventory variables (``gpu_model``,
    ``gpu_count``, ``nvswitch``, ``rack``, ``nvidia_driver_version`` / ``nvidia_driver_branch``,
    ``nvidia_module_flavour``, ``dcgm_version``, ``dcgm_exporter_version``). ``gpu_names`` are the
    GPU names from facts (nvidia-smi or lspci); when given they decide the model (``gpu_model``
    may then be absent) and a disagreement with the inventory is a refusal. ``origin(key)`` may
    return ``(source, line)`` for error messages; a ``SourceDict`` is asked directly. Malformed
    values, unknown GPU models, unknown branches and wrong types raise ``InputError(key=...)``.
``plans_from_vars([(host, variables, gpu_names), ...]) -> list[VersionPlan]``
    The same for many hosts; hosts with equal plan variables share one validation.
``resolve_target(to) -> DriverTarget``
    For ``upgrade-driver --to``: a branch (``580`` or ``R580``) picks the newest version of that
    branch the matrix knows; a full version (``580.126.20``) must be well-formed and of a known
    branch but need not be listed (NVIDIA ships patch releases faster than this file is edited;
    ``DriverTarget.listed`` says whether it is). Anything else raises ``InputError(key="--to")``.
    ``VersionPlan.retarget(target)`` gives the plan with that driver, to check before a rollout.

(``VersionPlan`` was ``compat.HostPlan``: the task plan of a host is ``deployer.plan.HostPlan``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.booleans import as_boolean
from deployer.errors import InputError
from deployer.gpu import matrix as data
from deployer.gpu.matrix import (
    BRANCH_RE,
    DRIVER_VERSION_RE,
    EXPORTER_TAG_RE,
    FLAVOURS,
    VERSION_TRIPLE_RE,
)
from deployer.yamlsrc import SourceDict

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

    @property
    def by_branch(self) -> bool:
        """``--to`` named a branch: the version is the newest of it the matrix knows, which
        NVIDIA's newer releases of that branch may have passed."""
        return self.requested != self.version


def passed(version: str, installed: str | None, loaded: str | None) -> str | None:
    """A host's driver that is a newer release of ``version``'s branch (installed, else
    loaded), so that installing ``version`` downgrades the host; None when neither is, or when
    ``version`` is the loaded driver (newer packages under it: putting them back is a repair)."""
    if loaded == version:
        return None
    return next((v for v in (installed, loaded) if newer_in_branch(v, version)), None)


def newer_in_branch(running: str | None, version: str) -> bool:
    """Whether ``running`` is a release of ``version``'s branch newer than it (by number:
    580.159.04 after 580.126.20, 580.65.06 before it); False for anything not a release."""
    if not running or not DRIVER_VERSION_RE.match(running) or not DRIVER_VERSION_RE.match(version):
        return False
    if running.split(".")[0] != version.split(".")[0]:
        return False
    return data.version_key(running) > data.version_key(version)


@dataclass(frozen=True)
class VersionPlan:
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

    def retarget(self, target: DriverTarget) -> VersionPlan:
        """This plan with the driver replaced by ``target`` (for a rolling upgrade)."""
        return dataclasses.replace(self, driver_version=target.version, driver_branch=target.branch)


def plan_from_vars(
    host: str,
    variables: Mapping[str, Any],
    *,
    gpu_names: Sequence[str] | None = None,
    origin: Callable[[str], tuple[str | None, int | None]] | None = None,
) -> VersionPlan:
    """A host's plan from its resolved variables; bad values raise ``InputError(key=...)``."""
    m = data.matrix()

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
        raise bad(
            "gpu_model",
            "not set, and the host's facts show no GPU to read it from (no nvidia-smi, no NVIDIA "
            "GPU on the PCI bus): declare gpu_model (and gpu_count), e.g. in group_vars",
        )

    count = variables.get("gpu_count")
    if count is None:
        count = len(gpu_names) if gpu_names else None
    if count is None:
        raise bad(
            "gpu_count",
            "not set, and the host's facts show no GPU to count (no nvidia-smi, no NVIDIA GPU on "
            "the PCI bus): declare gpu_count, e.g. in host_vars or group_vars",
        )
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
        if not DRIVER_VERSION_RE.match(version):
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
        match = BRANCH_RE.match(branch)
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
    if dcgm is not None and not VERSION_TRIPLE_RE.match(dcgm):
        raise bad("dcgm_version", f"{dcgm!r} is not a DCGM version like 4.4.2")
    tag = text("dcgm_exporter_version")
    if tag is not None and not EXPORTER_TAG_RE.match(tag):
        raise bad("dcgm_exporter_version", f"{tag!r} is not an exporter tag like 4.4.2-4.7.1")

    return VersionPlan(
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
_SHARED_VARS = tuple(name for name in PLAN_VARS if name != "rack")


def _for_host(plan: VersionPlan, host: str, rack: str | None) -> VersionPlan:
    """``dataclasses.replace(plan, host=host, rack=rack)`` without its per-field ``__init__``
    call: ``plan`` was validated, and only the two fields that are never validated change (a
    sixth of checking 100,000 hosts went to ``replace``)."""
    copied = object.__new__(VersionPlan)
    fields = copied.__dict__
    fields.update(plan.__dict__)
    fields["host"] = host
    fields["rack"] = rack
    return copied


def read_many(variables: Mapping[str, Any], names: Sequence[str], default: Any) -> tuple[Any, ...]:
    """``variables.get(name, default)`` of each of ``names``: in one call where the mapping
    reads many at once (the inventory's views: ``LayeredVars.get_many``; a score of calls per
    host was most of planning 100,000 hosts' versions and exporters), else one by one."""
    get_many = getattr(variables, "get_many", None)
    if get_many is not None:
        return get_many(names, default)  # type: ignore[no-any-return]
    return tuple([variables.get(name, default) for name in names])


def plans_from_vars(
    hosts: Iterable[tuple[str, Mapping[str, Any], Sequence[str] | None]],
) -> list[VersionPlan]:
    """``plan_from_vars`` for each ``(host, variables, gpu_names)``, in order; hosts whose plan
    variables (all but ``rack``) and GPU names are equal, with equal types, share one validation
    (a fleet has a few combinations, and validating each host dominated checking a large one:
    bench/README.md).
    The first host with bad values raises, as it would alone."""
    shared: dict[tuple[Any, ...], VersionPlan] = {}
    plans = []
    for host, variables, gpu_names in hosts:
        values = read_many(variables, _SHARED_VARS, _ABSENT)
        key: tuple[Any, ...] | None = (
            values,
            tuple(map(type, values)),
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
            plan = _for_host(plan, host, None if rack is None else str(rack))
        plans.append(plan)
    return plans


def resolve_target(to: str) -> DriverTarget:
    """The driver an ``upgrade-driver --to BRANCH_OR_VERSION`` means (see module docstring)."""
    m = data.matrix()
    value = str(to).strip()
    branch_match = BRANCH_RE.match(value)
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
    if not DRIVER_VERSION_RE.match(value):
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
