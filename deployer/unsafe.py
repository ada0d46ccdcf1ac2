"""Text that is never templated: Ansible's ``!unsafe`` YAML tag.

A value tagged ``!unsafe`` in an inventory, a variables file or a role (``password: !unsafe
'{{ not a template }}'``) is read as the literal text it is, and every renderer leaves it as it is
(deployer/templating.py, the connection variables in deployer/inventory/connection_vars.py): a
variable that holds one, or an expression whose value is one, yields that text, never its
rendering. As in ansible-core 2.19 (lib/ansible/_internal/_yaml/_constructor.py,
``construct_yaml_unsafe``), the tag applies to every string inside a tagged list or mapping, and a
tagged number or boolean keeps its type.
"""

from __future__ import annotations

from typing import Any

import yaml


class UnsafeText(str):
    """A string read under ``!unsafe``: equal to, hashed as and shown as the plain string."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"UnsafeText({str.__repr__(self)})"


def is_unsafe(value: Any) -> bool:
    return isinstance(value, UnsafeText)


def mark_unsafe(value: Any) -> Any:
    """``value`` with every string in it (mapping values, list items) made UnsafeText; mappings
    and lists are changed in place, so a mapping keeps its type (and its source lines)."""
    if isinstance(value, str):
        return value if isinstance(value, UnsafeText) else UnsafeText(value)
    if isinstance(value, dict):
        for key in value:
            value[key] = mark_unsafe(value[key])
        return value
    if isinstance(value, list):
        value[:] = [mark_unsafe(v) for v in value]
        return value
    return value


def _represent(dumper: yaml.representer.SafeRepresenter, data: UnsafeText) -> yaml.Node:
    return dumper.represent_str(str(data))


# Dumped as the plain string it is (yaml.safe_dump refuses a str subclass otherwise, and the C
# emitter wants an exact str); SafeDumper and CSafeDumper share SafeRepresenter's table.
yaml.representer.SafeRepresenter.add_representer(UnsafeText, _represent)
