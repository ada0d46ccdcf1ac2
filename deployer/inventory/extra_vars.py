"""Extra variables (``-e``), read as Ansible reads them."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.inventory.files import first_content_line, read_text, refuse_vault
from deployer.inventory.names import MAGIC_VARS, check_var_name, is_identifier
from deployer.yamlsrc import load_yaml_text


def parse_extra_vars(items: Iterable[str]) -> dict[str, Any]:
    """Merge ``-e`` items as Ansible does: ``k=v k2=v2`` (values are strings), ``@file.yml``,
    or inline YAML/JSON ``{"k": 1}``. Later items override earlier ones."""
    result: dict[str, Any] = {}
    for item in items:
        if not item:
            continue
        data: Any
        if item.startswith("@"):
            path = Path(item[1:]).expanduser()
            text = read_text(path)
            refuse_vault(text, path)
            data = load_yaml_text(text, str(path))
            if not isinstance(data, dict):
                raise InputError(
                    f"extra vars file must hold a mapping, got a {type(data).__name__}",
                    source=str(path),
                    line=first_content_line(text),
                    key=item,
                )
            for key in data:
                check_var_name(key, (str(path), data.line_of(key)))
        elif item[0] in "/.":
            raise InputError("an extra vars file must be prefixed with '@'", source="-e", key=item)
        elif item[0] in "[{":
            data = load_yaml_text(item, f"-e {item}")
            if not isinstance(data, dict):
                raise InputError("extra vars must be a mapping, not a list", source="-e", key=item)
            for key in data:
                check_var_name(key, ("-e", None))
        else:
            data = {}
            try:
                tokens = shlex.split(item)
            except ValueError as exc:
                raise InputError(f"cannot parse: {exc}", source="-e", key=item) from None
            for token in tokens:
                key, sep, value = token.partition("=")
                if not sep or not key:
                    raise InputError(f"expected key=value, got {token!r}", source="-e", key=item)
                if not is_identifier(key) or key in MAGIC_VARS:
                    raise InputError(f"invalid variable name {key!r}", source="-e", key=item)
                data[key] = value
        result.update(data)
    return result
