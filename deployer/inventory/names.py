"""Names in an inventory: variable, group and host names, host ranges (``gpu[01:04]``,
``node[a:c]``, ``gpu[01:08:2]``) and ``name:port``.

Stricter than Ansible (which warns and carries on): a variable name that is not an identifier,
and an empty or reversed host range, are InputErrors.
"""

from __future__ import annotations

import ipaddress
import keyword
import re
import string
from typing import Any

from deployer.errors import InputError
from deployer.inventory.model import Origin

MAGIC_VARS = frozenset(
    {"inventory_hostname", "inventory_hostname_short", "group_names", "groups", "hostvars"}
)

# Letters and digits of any script, as Ansible's host name rule (lib/ansible/parsing/utils/
# addresses.py, re.UNICODE ``\w``): "příbor" and "česko" are names.
_GROUP_NAME = re.compile(r"^\w[\w.\-]*$")
_LABEL = r"\w(?:[\w\-]*\w)?"
_HOST_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")


def is_identifier(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and name.isascii()
        and not keyword.iskeyword(name)
        and name not in ("True", "False", "None")
    )


def check_var_name(name: Any, origin: Origin) -> str:
    if not is_identifier(name):
        raise InputError(
            f"invalid variable name {name!r}: use letters, digits and underscores, "
            "not starting with a digit",
            source=origin[0],
            line=origin[1],
            key=str(name),
        )
    if name in MAGIC_VARS:
        raise InputError(
            f"{name!r} is a magic variable set by the tool and cannot be defined",
            source=origin[0],
            line=origin[1],
            key=name,
        )
    return name


def check_group_name(name: Any, origin: Origin) -> str:
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        raise InputError(
            f"invalid group name {name!r}: use letters, digits, '_', '-' and '.'",
            source=origin[0],
            line=origin[1],
            key=str(name),
        )
    return name


def expand_host_range(pattern: str) -> list[str]:
    """Expand Ansible host ranges: ``gpu[01:04]``, ``n[a:c]``, ``gpu[1:9:2]-ib[0:1]``.

    Raises ValueError with the reason for a malformed range.
    """
    if "[" not in pattern and "]" not in pattern:
        return [pattern]
    start = pattern.find("[")
    end = pattern.find("]", start + 1)
    if start < 0 or end < 0:
        raise ValueError(f"unbalanced brackets in host range {pattern!r}")
    head, body, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError(f"host range [{body}] must be [begin:end] or [begin:end:step]")
    beg, stop = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not stop:
        raise ValueError(f"host range [{body}] has no end")
    try:
        step = int(step_text)
    except ValueError:
        raise ValueError(f"host range [{body}] has a step that is not an integer") from None
    if step < 1:
        raise ValueError(f"host range [{body}] must have a step of 1 or more")
    items: list[str]
    if beg in string.ascii_letters and stop in string.ascii_letters:
        i_beg, i_end = string.ascii_letters.index(beg), string.ascii_letters.index(stop)
        if i_beg > i_end:
            raise ValueError(f"host range [{body}] has begin after end")
        items = list(string.ascii_letters[i_beg : i_end + 1 : step])
    elif beg.isdigit() and stop.isdigit():
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if width and len(stop) != width:
            raise ValueError(f"host range [{body}] must give begin and end with the same width")
        if int(beg) > int(stop):
            raise ValueError(f"host range [{body}] has begin after end")
        items = [str(i).zfill(width) for i in range(int(beg), int(stop) + 1, step)]
    else:
        raise ValueError(f"host range [{body}] must be numbers or single letters")
    result: list[str] = []
    for item in items:
        result.extend(expand_host_range(f"{head}{item}{tail}"))
    return result


def _split_port(pattern: str) -> tuple[str, int | None]:
    """``name:port`` -> (name, port); ranges' colons and IPv6 addresses are left alone."""
    if pattern.startswith("[") and "]" in pattern:
        inner, _, rest = pattern[1:].partition("]")
        if ":" in inner and is_ipv6(inner):
            if not rest:
                return inner, None
            if rest.startswith(":") and rest[1:].isdigit():
                return inner, int(rest[1:])
            raise ValueError(f"invalid port in {pattern!r}")
    if is_ipv6(pattern):
        return pattern, None
    depth = 0
    colon = -1
    for i, ch in enumerate(pattern):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == ":" and depth == 0:
            if colon >= 0:
                raise ValueError(f"invalid host {pattern!r}: more than one ':'")
            colon = i
    if colon < 0:
        return pattern, None
    name, port = pattern[:colon], pattern[colon + 1 :]
    if not port:
        raise ValueError(f"invalid host {pattern!r}: ':' must be followed by a port")
    if not port.isdigit():
        raise ValueError(f"invalid port {port!r} in {pattern!r}")
    return name, int(port)


def is_ipv6(text: str) -> bool:
    if ":" not in text:  # every IPv6 address has one; skips a parse per plain host name
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def expand_host_pattern(pattern: Any, origin: Origin) -> tuple[list[str], int | None]:
    if not isinstance(pattern, str):
        raise InputError(
            f"host name {pattern!r} must be a string (quote numbers)",
            source=origin[0],
            line=origin[1],
            key=str(pattern),
        )
    plain = pattern.strip()
    if _HOST_NAME.match(plain):  # a plain name (no port, range or IPv6: none of ':[]')
        return [plain], None
    try:
        name, port = _split_port(plain)
        names = expand_host_range(name)
    except ValueError as exc:
        raise InputError(str(exc), source=origin[0], line=origin[1], key=pattern) from None
    if port is not None and not 1 <= port <= 65535:
        raise InputError(
            f"port {port} out of range 1-65535", source=origin[0], line=origin[1], key=pattern
        )
    for host in names:
        if not (_HOST_NAME.match(host) or is_ipv6(host)):
            raise InputError(
                f"invalid host name {host!r}", source=origin[0], line=origin[1], key=pattern
            )
    return names, port
