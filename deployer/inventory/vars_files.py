"""``group_vars/`` and ``host_vars/``, read beside the inventory (the directory given, or the
file's directory). Each entry is ``<name>``, ``<name>.yml``, ``<name>.yaml`` or ``<name>.json``, a
file or a directory of such files (read recursively in name order, later files overriding earlier
ones). Stricter than Ansible, which silently reads only one: both ``group_vars/x`` and
``group_vars/x.yml`` present is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.inventory.files import YAML_EXTENSIONS, first_content_line, read_text, refuse_vault
from deployer.inventory.model import Origin
from deployer.inventory.names import check_var_name
from deployer.yamlsrc import SourceDict, load_yaml_text


def _vars_file_paths(base: Path, name: str) -> list[Path]:
    """The files holding ``name``'s variables in ``base`` (group_vars/ or host_vars/)."""
    candidates = [base / name] + [base / f"{name}{ext}" for ext in YAML_EXTENSIONS]
    existing = [p for p in candidates if p.exists()]
    if len(existing) > 1:
        listed = ", ".join(str(p) for p in existing)
        raise InputError(
            f"variables for {name!r} are defined more than once ({listed}); keep one",
            source=str(existing[0]),
            key=name,
        )
    if not existing:
        return []
    if existing[0].is_dir():
        return _vars_dir_files(existing[0])
    return [existing[0]]


def _vars_dir_files(directory: Path) -> list[Path]:
    files: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            files.extend(_vars_dir_files(entry))
        elif entry.is_file() and (not entry.suffix or entry.suffix in YAML_EXTENSIONS):
            files.append(entry)
    return files


def _load_vars_file(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    text = read_text(path)
    refuse_vault(text, path)
    data = load_yaml_text(text, str(path))
    if data is None:
        return {}, {}
    if not isinstance(data, SourceDict):
        raise InputError(
            f"a variables file is a mapping of variable names, got a {type(data).__name__}",
            source=str(path),
            line=first_content_line(text),
        )
    origins: dict[str, Origin] = {}
    for key in data:
        origins[key] = (str(path), data.line_of(key))
        check_var_name(key, origins[key])
    return dict(data), origins


def load_entity_vars(base: Path, name: str) -> tuple[dict[str, Any], dict[str, Origin]]:
    merged: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    for path in _vars_file_paths(base, name):
        values, where = _load_vars_file(path)
        merged.update(values)
        origins.update(where)
    return merged, origins


def entity_names(base: Path) -> list[str]:
    """Names that entries of group_vars/ or host_vars/ are for."""
    names = []
    for entry in sorted(base.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        name = entry.name
        if entry.is_file() and entry.suffix in YAML_EXTENSIONS:
            name = entry.name[: -len(entry.suffix)]
        names.append(name)
    return names
