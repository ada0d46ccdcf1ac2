"""YAML inventories (``.yml``, ``.yaml``, ``.json``; Ansible's ``yaml`` inventory plugin): groups
with ``hosts``, ``children`` and ``vars``, nested to any depth. Stricter than Ansible: an unknown
key in a group and a group that is not a mapping are errors; inventory plugin configuration
(``plugin:``) is refused by name."""

from __future__ import annotations

from typing import Any

from deployer.errors import InputError
from deployer.inventory.draft import Draft
from deployer.inventory.files import first_content_line
from deployer.inventory.model import Origin
from deployer.inventory.names import check_group_name, expand_host_pattern
from deployer.yamlsrc import SourceDict


def parse_yaml(draft: Draft, data: Any, path: str, text: str) -> None:
    if data is None:
        raise InputError("empty YAML inventory", source=path)
    if not isinstance(data, SourceDict):
        raise InputError(
            f"a YAML inventory is a mapping of group names, got a {type(data).__name__}",
            source=path,
            line=first_content_line(text),
        )
    if "plugin" in data:
        raise InputError(
            "inventory plugin configuration is not supported; give a static YAML, INI or TOML "
            "inventory",
            source=path,
            line=data.line_of("plugin"),
            key="plugin",
        )
    for name, body in data.items():
        _parse_yaml_group(draft, name, body, data, name)


_YAML_GROUP_KEYS = ("hosts", "children", "vars")


def _parse_yaml_group(
    draft: Draft, name: Any, body: Any, container: SourceDict, path_key: str
) -> str:
    origin: Origin = (container.source, container.line_of(name))
    check_group_name(name, origin)
    if body is not None and not isinstance(body, SourceDict):
        raise InputError(
            f"group {name!r} must be a mapping with hosts, children or vars, "
            f"got a {type(body).__name__}",
            source=origin[0],
            line=origin[1],
            key=str(path_key),
        )
    draft.add_group(name, origin)
    if body is None:
        return name
    for key in body:
        if key not in _YAML_GROUP_KEYS:
            raise InputError(
                f"unknown key {key!r} in group {name!r} (expected hosts, children, vars)",
                source=body.source,
                line=body.line_of(key),
                key=f"{path_key}.{key}",
            )
    for section in _YAML_GROUP_KEYS:
        if section not in body:
            continue
        value = body[section]
        line = body.line_of(section)
        if value is None:
            continue
        if isinstance(value, str):
            # Ansible accepts "hosts: gpu01" for a single member.
            single = SourceDict({value: None})
            single.source, single.line = body.source, line
            value = single
        if not isinstance(value, SourceDict):
            raise InputError(
                f"'{section}' of group {name!r} must be a mapping, got a {type(value).__name__}",
                source=body.source,
                line=line,
                key=f"{path_key}.{section}",
            )
        if section == "vars":
            for var, var_value in value.items():
                draft.set_group_var(name, var, var_value, (value.source, value.line_of(var)))
        elif section == "children":
            for child, child_body in value.items():
                child_name = _parse_yaml_group(
                    draft, child, child_body, value, f"{path_key}.children.{child}"
                )
                draft.add_child(name, child_name, (value.source, value.line_of(child)))
        else:
            for pattern, host_vars in value.items():
                at: Origin = (value.source, value.line_of(pattern))
                names, port = expand_host_pattern(pattern, at)
                if host_vars is None:
                    host_vars = SourceDict()
                if not isinstance(host_vars, SourceDict):
                    raise InputError(
                        f"variables of host {pattern!r} must be a mapping, "
                        f"got a {type(host_vars).__name__}",
                        source=at[0],
                        line=at[1],
                        key=f"{path_key}.hosts.{pattern}",
                    )

                def var_at(key: Any, hv: SourceDict = host_vars, at: Origin = at) -> Origin:
                    return (hv.source if hv.key_lines else at[0], hv.key_lines.get(key, at[1]))

                for host in names:
                    draft.add_host(host, name, host_vars, var_at, port, at)
    return name
