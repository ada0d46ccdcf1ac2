"""Which files ``-i`` names and which parser reads each.

``-i`` names a file or a directory. A directory is read like Ansible reads one: every file in it,
recursively and sorted by name, except hidden files, ``group_vars/``, ``host_vars/`` and files
ending ``.orig .cfg .retry .pyc .pyo .swp .bak ~ .rpm .md .txt .rst``. A file ending
``.yml``/``.yaml``/``.json`` is a YAML inventory, ``.toml`` a TOML one, ``.ini`` (or any other
extension) an INI one; a file without an extension is INI when it has a ``[section]`` line, else
YAML.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from deployer.errors import InputError
from deployer.inventory.draft import Draft
from deployer.inventory.files import YAML_EXTENSIONS, read_text, refuse_vault
from deployer.inventory.yaml_source import parse_yaml
from deployer.yamlsrc import load_yaml_text

IGNORED_EXTENSIONS = (".orig", ".cfg", ".retry", ".pyc", ".pyo", ".swp", ".bak", "~", ".rpm")
IGNORED_EXTENSIONS += (".md", ".txt", ".rst")
IGNORED_NAMES = frozenset({"group_vars", "host_vars", "vars_plugins"})


def _refuse_script(text: str, path: Path) -> None:
    """An executable file that starts with ``#!`` is a dynamic inventory script, which Ansible's
    script plugin runs; gpumon-deploy runs nothing from an inventory."""
    if text.startswith("#!") and os.access(path, os.X_OK):
        raise InputError(
            "dynamic inventory scripts (Ansible's script inventory plugin) are not run: give a "
            "static YAML, INI or TOML inventory",
            source=str(path),
            line=1,
        )


def _looks_like_yaml(text: str) -> bool:
    from deployer.inventory.ini_source import INI_SECTION

    return any(
        re.match(r"^\s*[^#;\s][^=]*:(\s|$)", line) for line in text.splitlines()
    ) and not any(INI_SECTION.match(line.strip()) for line in text.splitlines())


def parse_file(draft: Draft, path: Path) -> None:
    text = read_text(path)
    refuse_vault(text, path)
    _refuse_script(text, path)
    source = str(path)
    ext = path.suffix.lower()
    if ext in YAML_EXTENSIONS:
        parse_yaml(draft, load_yaml_text(text, source), source, text)
        return
    # The INI and TOML readers (and tomllib) are imported for the inventories written so.
    if ext == ".toml":
        from deployer.inventory.toml_source import parse_toml

        parse_toml(draft, text, source)
        return
    if ext == "" and _looks_like_yaml(text):
        parse_yaml(draft, load_yaml_text(text, source), source, text)
        return
    from deployer.inventory.ini_source import parse_ini

    parse_ini(draft, text, source)


def inventory_files(root: Path) -> list[Path]:
    found: list[Path] = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise InputError(f"cannot read directory: {exc}", source=str(root)) from None
    for entry in entries:
        if entry.name.startswith(".") or entry.name in IGNORED_NAMES:
            continue
        if entry.is_dir():
            found.extend(inventory_files(entry))
        elif not entry.name.endswith(IGNORED_EXTENSIONS):
            found.append(entry)
    return found
