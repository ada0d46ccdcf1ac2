"""``gpumon-deploy init``: the variables the product needs, read from the hosts of an existing
inventory and written beside it, so that the first ``up --check`` is one command away.

For every GPU host (group ``gpu``, after ``gpumon_groups`` / ``--group``) the facts give the GPU
model (nvidia-smi's names, else the PCI ids), the GPU count, NVSwitch presence and the driver
branch loaded now (so the first ``up`` keeps the driver the host runs instead of changing it:
``up`` never changes a loaded driver, see upgrade-driver). A value every GPU host shares goes to
``group_vars/gpu.yml``, a value that differs to ``host_vars/<host>.yml``; the mapping of the
product's groups given with ``--group`` to ``group_vars/all.yml``. A value the inventory already
declares is left as it is: the same is reported as such, a different one as a mismatch (which the
preflight would refuse). A file that exists is never rewritten: what would go in it is printed,
to be merged by hand. Files are written atomically, 0644 (nothing here is a secret).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployer.facts import HostFacts
from deployer.gpu.matrix import models_from_gpu_names

GPU_VARS = ("gpu_model", "gpu_count", "nvswitch", "nvidia_driver_branch")


@dataclass
class Finding:
    host: str
    found: dict[str, Any]  # what the facts show, by variable
    declared: dict[str, Any]  # what the inventory already says, by variable
    problems: list[str] = field(default_factory=list)  # what could not be read


def finding(host: str, facts: HostFacts, declared: Mapping[str, Any]) -> Finding:
    """What ``facts`` say of ``host``'s GPU variables."""
    out = Finding(host, {}, {k: declared[k] for k in GPU_VARS if declared.get(k) not in (None, "")})
    version = declared.get("nvidia_driver_version")
    if version not in (None, "") and "nvidia_driver_branch" not in out.declared:
        out.declared["nvidia_driver_branch"] = str(version).split(".")[0]
    names, where = facts.gpu_names()
    if not names:
        out.problems.append("no GPU seen (no nvidia-smi answer, no NVIDIA GPU on the PCI bus)")
    else:
        # The model as the plan reads it (gpu/rules.py: one model, every name known).
        models, unknown = models_from_gpu_names(names)
        if unknown is not None or len(models) != 1:
            out.problems.append(f"GPU model not recognised from {where}: {', '.join(set(names))}")
        else:
            (out.found["gpu_model"],) = models
        out.found["gpu_count"] = len(names)
    out.found["nvswitch"] = bool(facts.nvswitch)
    if facts.driver_loaded:
        out.found["nvidia_driver_branch"] = facts.driver_loaded.split(".")[0]
    return out


@dataclass
class VarsPlan:
    """Where each value goes: ``files`` maps a path to the variables for it."""

    files: dict[Path, dict[str, Any]]
    same: list[str]  # "host: var = value" already declared so
    mismatches: list[str]  # "host: var declared A, found B"


def plan_files(
    base: Path, findings: list[Finding], group_map: Mapping[str, list[str]] | None
) -> VarsPlan:
    """The files to write beside the inventory (``base``: its directory)."""
    same, mismatches = [], []
    missing: dict[str, dict[str, Any]] = {}
    for f in findings:
        for key, value in f.found.items():
            if key in f.declared:
                have = f.declared[key]
                if str(have).lower() == str(value).lower():
                    same.append(f"{f.host}: {key} = {have}")
                else:
                    mismatches.append(f"{f.host}: {key} declared {have}, found {value}")
                continue
            missing.setdefault(f.host, {})[key] = value
    files: dict[Path, dict[str, Any]] = {}
    hosts = [f.host for f in findings]
    shared: dict[str, Any] = {}
    keys = {k for values in missing.values() for k in values}
    for key in sorted(keys):
        values = [missing.get(h, {}).get(key, _UNSET) for h in hosts]
        if _UNSET not in values and len({repr(v) for v in values}) == 1:
            shared[key] = values[0]
    if shared:
        files[base / "group_vars" / "gpu.yml"] = shared
    for host, values in missing.items():
        own = {k: v for k, v in values.items() if k not in shared}
        if own:
            files[base / "host_vars" / f"{host}.yml"] = own
    if group_map:
        files[base / "group_vars" / "all.yml"] = {"gpumon_groups": dict(group_map)}
    return VarsPlan(files, same, mismatches)


_UNSET = object()


def document(values: Mapping[str, Any]) -> str:
    head = "# Written by `gpumon-deploy init` from the hosts' facts; edit freely.\n"
    return head + yaml.safe_dump(dict(values), sort_keys=False, default_flow_style=False)


def write_new(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` if it does not exist (atomically, 0644); False if it exists."""
    if path.exists() or any(path.with_suffix(s).exists() for s in ("", ".yaml", ".json")):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)  # fails if the file appeared meanwhile: never replaced
        except FileExistsError:
            return False
    finally:
        os.unlink(tmp)
    return True
