"""Reading one inventory, variables or extra-vars file: text, a vault-encrypted file refused by
name, and the first line that holds content (for an error about the whole document)."""

from __future__ import annotations

from pathlib import Path

from deployer.errors import InputError

YAML_EXTENSIONS = (".yml", ".yaml", ".json")


def first_content_line(text: str) -> int | None:
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped != "---":
            return number
    return None


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from None


def refuse_vault(text: str, path: Path) -> None:
    if text.lstrip().startswith("$ANSIBLE_VAULT;"):
        raise InputError(
            "vault-encrypted files are not supported; pass secrets with -e @file from a "
            "secret store, readable only by you (mode 0600)",
            source=str(path),
            line=1,
        )
