"""The one truthiness rule of the package: what counts as true or false in a variable, a task
argument or a template's ``bool`` filter.

Ansible's, so an inventory means here what it means to ansible-playbook: ansible/ansible
``lib/ansible/module_utils/parsing/convert_bool.py`` (commit 0c2cf9989507fa83fc3316cbc0f3c16afb4c8ecb,
``BOOLEANS_TRUE`` / ``BOOLEANS_FALSE`` and ``boolean(value, strict)``): the words ``y yes on 1
true t`` and ``n no off 0 false f`` in any case, the numbers 1 and 0, and the booleans. One
addition: surrounding whitespace is ignored (an INI value or an ``-e`` string with a stray space).

``as_boolean`` says True, False or None (not a boolean: the caller refuses it naming the key);
``truthy`` is the lenient reading of the ``bool`` filter: a string that is no boolean word is
false (Ansible's ``strict=False``), any other value has its Python truth (None and an empty list
are false).
"""

from __future__ import annotations

from typing import Any

TRUE_WORDS = frozenset({"y", "yes", "on", "1", "true", "t"})
FALSE_WORDS = frozenset({"n", "no", "off", "0", "false", "f"})
# For error messages: the forms a user is told to write.
SPELLINGS = "true/false, yes/no, on/off, 1/0"


def as_boolean(value: Any) -> bool | None:
    """``value`` as a boolean in Ansible's sense, or None when it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return True if value == 1 else False if value == 0 else None
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    return None


def truthy(value: Any) -> bool:
    """The ``bool`` filter's reading: a boolean word decides; any other string is false."""
    found = as_boolean(value)
    if found is not None:
        return found
    if isinstance(value, str):
        return False
    return bool(value)
