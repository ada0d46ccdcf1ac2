"""YAML loading that remembers where each mapping and key came from, for errors naming file:line.

Ansible's own tags: ``!unsafe`` reads a value as text never templated (deployer/unsafe.py); an
inline ``!vault`` value is refused, naming vault and what to do instead."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from deployer.errors import InputError
from deployer.memory import collector_paused
from deployer.unsafe import mark_unsafe


class SourceDict(dict):
    """A dict loaded from YAML that knows its file and the line of each of its keys."""

    source: str = "<unknown>"
    line: int | None = None
    key_lines: dict[Any, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines = {}

    def line_of(self, key: Any) -> int | None:
        """Line (1-based) of ``key`` in the source, else the mapping's own line."""
        return self.key_lines.get(key, self.line)


class _Loader(yaml.SafeLoader):
    source = "<unknown>"


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> SourceDict:
    loader.flatten_mapping(node)
    result = SourceDict()
    result.source = loader.source
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError as exc:
            raise InputError(
                "mapping key is not a scalar",
                source=loader.source,
                line=key_node.start_mark.line + 1,
            ) from exc
        if key in result:
            raise InputError(
                "duplicate key",
                source=loader.source,
                line=key_node.start_mark.line + 1,
                key=str(key),
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_unsafe(loader: _Loader, node: yaml.Node) -> Any:
    """``!unsafe``: the node read as it would be untagged, every string in it never templated
    (deployer/unsafe.py)."""
    untagged = copy.copy(node)
    untagged.tag = loader.resolve(type(node), node.value, (True, False))
    return mark_unsafe(loader.construct_object(untagged, deep=True))


def _refuse_vault(loader: _Loader, node: yaml.Node) -> Any:
    raise InputError(
        f"an inline Ansible Vault value ({node.tag}) cannot be read: vault is not supported. "
        "Decrypt it (ansible-vault decrypt reads the value on stdin) and pass the secret with "
        "-e @file from a secret store, readable only by you (mode 0600)",
        source=loader.source,
        line=node.start_mark.line + 1,
    )


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("!unsafe", _construct_unsafe)
for _tag in ("!vault", "!vault-encrypted"):
    _Loader.add_constructor(_tag, _refuse_vault)


# Parse with libyaml when PyYAML has it (an inventory can hold 100,000 hosts, and the pure-Python
# parser is several times slower: bench/README.md), building the same line-tracking mappings with
# these constructors.
_CLoader = getattr(yaml, "CSafeLoader", None)
_FastLoader: Any = (
    type(
        "_FastLoader",
        (_CLoader,),
        {"source": "<unknown>", "yaml_constructors": dict(_Loader.yaml_constructors)},
    )
    if _CLoader is not None
    else _Loader
)


def load_yaml_text(text: str, source: str) -> Any:
    """Parse YAML text; syntax errors become InputError with the file and line. The cyclic GC
    is paused while the many small objects of a large file are built."""
    loader_cls = type("_SourceLoader", (_FastLoader,), {"source": source})
    try:
        with collector_paused():
            return yaml.load(text, Loader=loader_cls)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise InputError(f"invalid YAML: {exc.problem or exc}", source=source, line=line) from exc
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", source=source) from exc


def load_yaml_file(path: str | Path) -> Any:
    """Load one YAML file; unreadable or malformed files raise InputError naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(p)) from exc
    return load_yaml_text(text, str(p))


def where(data: Any, key: Any = None) -> tuple[str | None, int | None]:
    """(source, line) for a loaded mapping, or for one of its keys."""
    if isinstance(data, SourceDict):
        return data.source, (data.line_of(key) if key is not None else data.line)
    return None, None
