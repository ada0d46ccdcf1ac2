"""INI inventories (Ansible's ``ini`` inventory plugin): ``[group]``, ``[group:vars]``,
``[group:children]`` sections, host lines with ``key=value`` variables. Values are typed as Ansible
types them: Python literals (``8``, ``True``, ``[1, 2]``) become ints, bools, lists; anything else
(``yes``, ``true``, ``H100``) stays a string. A group may be named in ``:children`` before it is
declared; one never declared is an error."""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from typing import Any

from deployer.errors import InputError
from deployer.inventory.draft import Draft
from deployer.inventory.model import Origin
from deployer.inventory.names import check_group_name, expand_host_pattern
from deployer.secrets import MASK, is_secret_key

INI_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_INI_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:[#;].*)?$")


def _ini_value(text: str) -> Any:
    """Type an INI value as Ansible does: a Python literal if it is one, else the string."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _ini_coerce(value)


def _ini_coerce(value: Any) -> Any:
    if isinstance(value, list | tuple | set | frozenset):
        return [_ini_coerce(v) for v in value]
    if isinstance(value, dict):
        return {_ini_coerce(k): _ini_coerce(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def parse_ini(draft: Draft, text: str, path: str) -> None:
    group, state = "ungrouped", "hosts"
    # Groups referenced before being declared: name -> (state, origin, [(parent, origin)]).
    pending: dict[str, tuple[str, Origin, list[tuple[str, Origin]]]] = {}

    def declare(name: str) -> None:
        entry = pending.pop(name, None)
        if entry and entry[0] == "children":
            for parent, at in entry[2]:
                draft.add_child(parent, name, at)

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        at: Origin = (path, number)
        if not line or line[0] in "#;":
            continue
        section = INI_SECTION.match(line)
        if section:
            group, kind = section.group(1), section.group(2) or "hosts"
            check_group_name(group, at)
            if kind not in ("hosts", "children", "vars"):
                raise InputError(
                    f"section [{group}:{kind}] has unknown type {kind!r} "
                    "(expected [group], [group:vars] or [group:children])",
                    source=path,
                    line=number,
                )
            state = kind
            if group not in draft.groups:
                if kind == "vars" and group not in pending:
                    pending[group] = ("vars", at, [])
                draft.add_group(group, at)
            if group in pending and kind != "vars":
                declare(group)
            continue
        if line.startswith("[") and line.endswith("]"):
            raise InputError(
                f"invalid section header {line!r}: no spaces, one ':' and a type at most",
                source=path,
                line=number,
            )
        if state == "hosts":
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as exc:
                raise InputError(
                    f"cannot parse host line: {exc}", source=path, line=number
                ) from None
            if tokens and tokens[0] == "---":
                raise InputError(
                    "'---' in an INI inventory: is this a YAML file without .yml?",
                    source=path,
                    line=number,
                )
            names, port = expand_host_pattern(tokens[0], at)
            variables: dict[str, Any] = {}
            key = ""
            for token in tokens[1:]:
                after = key
                key, sep, value = token.partition("=")
                if not sep:
                    # After a secret, a stray word is the rest of it (an unquoted space).
                    secret = is_secret_key(after)
                    shown = MASK if secret else token
                    raise InputError(
                        f"expected key=value host variable, got {shown!r}"
                        + (
                            f" after the value of {after} (quote a value with spaces)"
                            if after
                            else ""
                        ),
                        source=path,
                        line=number,
                        key=after if secret else token,
                    )
                variables[key] = _ini_value(value)
            for host in names:
                draft.add_host(host, group, variables, lambda _k, at=at: at, port, at)
        elif state == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise InputError(
                    f"expected key=value in [{group}:vars], got {line!r}", source=path, line=number
                )
            draft.set_group_var(group, key.strip(), _ini_value(value.strip()), at)
        else:
            match = _INI_GROUP_NAME.match(line)
            if not match:
                raise InputError(
                    f"expected a group name in [{group}:children], got {line!r}",
                    source=path,
                    line=number,
                )
            child = check_group_name(match.group(1), at)
            if child in draft.groups:
                draft.add_child(group, child, at)
            elif child in pending:
                pending[child][2].append((group, at))
            else:
                pending[child] = ("children", at, [(group, at)])

    for name, (kind, at, parents) in pending.items():
        if kind == "vars":
            raise InputError(
                f"section [{name}:vars] is for a group that is never declared "
                f"(add a [{name}] or [{name}:children] section)",
                source=at[0],
                line=at[1],
                key=name,
            )
        parent, parent_at = parents[-1]
        raise InputError(
            f"[{parent}:children] names group {name!r}, which is never declared",
            source=parent_at[0],
            line=parent_at[1],
            key=name,
        )
