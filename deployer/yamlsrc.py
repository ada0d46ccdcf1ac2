"""YAML loading that remembers where each mapping and key came from, for errors naming file:line.

Ansible's own tags: ``!unsafe`` reads a value as text never templated (deployer/unsafe.py); an
inline ``!vault`` value is refused, naming vault and what to do instead."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from itertools import chain
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


class _NotPlain(Exception):
    """The text uses YAML that :func:`_build_from_lines` or :func:`_build_from_events` leaves to
    the next reader down (the event builder, then the full loader)."""


_TAG = "tag:yaml.org,2002:"
_STR_TAG = _TAG + "str"
# Tags of plain scalars built here by PyYAML's own constructors: immutable values, so one per
# distinct text serves every occurrence.
_SCALAR_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "timestamp"))
_CParser: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)


def _plain_scalars() -> tuple[dict[str, Any], Callable[[str], Any]]:
    """PyYAML's implicit resolution of a plain scalar (``Resolver.resolve``), built by its own
    constructors as the full loader builds it, without its call per distinct scalar (every host
    name and address of an inventory is one): the resolvers keyed by the first character, then
    those for any character; none matching is a string. Gives the memo of each distinct scalar's
    value (an immutable value, one per text) and the function that resolves one and fills it.
    A merge key (``<<``) or a value key (``=``), or a path resolver, raise ``_NotPlain``: the
    full loader's rules."""
    helper = _Loader("")
    by_first = helper.yaml_implicit_resolvers
    any_first = by_first.get(None, [])
    if helper.yaml_path_resolvers:  # none are added here
        raise _NotPlain
    plain: dict[str, Any] = {}

    def resolve(value: str) -> Any:
        tag = _STR_TAG
        for candidate, pattern in chain(by_first.get(value[:1], ()), any_first):
            if pattern.match(value):
                tag = candidate
                break
        if tag == _STR_TAG:
            known: Any = value
        elif tag in _SCALAR_TAGS:
            known = helper.yaml_constructors[tag](helper, yaml.ScalarNode(tag, value))
        else:
            raise _NotPlain
        plain[value] = known
        return known

    return plain, resolve


def _build_from_events(text: str, source: str) -> Any:
    """The document built straight from libyaml's events, for the YAML nearly every inventory
    and vars file is made of: untagged mappings, sequences and scalars, one document. It gives
    what the full loader (``_FastLoader``) gives, ``SourceDict`` lines included, without its
    node tree and its per-node constructor calls (about half of loading a large inventory:
    bench/README.md). Anything else (a tag such as ``!unsafe`` or ``!vault``, an anchor or alias,
    a merge key, a key that is not a scalar, a duplicate key, a second document, a syntax
    error) raises ``_NotPlain`` and is left to the full loader, with its errors."""
    plain, resolve = _plain_scalars()
    no_key = _NO_KEY
    # The innermost open container and its state; the enclosing ones wait on ``stack``.
    container: Any = None
    in_mapping = False
    key: Any = no_key
    key_line = 0
    lines: dict[Any, int] = {}
    stack: list[tuple[Any, bool, Any, int, dict[Any, int]]] = []
    result: Any = None
    documents = 0
    new_mapping = dict.__new__
    scalar_event, alias_event = yaml.ScalarEvent, yaml.AliasEvent
    mapping_start, mapping_end = yaml.MappingStartEvent, yaml.MappingEndEvent
    sequence_start, sequence_end = yaml.SequenceStartEvent, yaml.SequenceEndEvent
    parser = _CParser(text)
    next_event = parser.get_event
    try:
        while True:
            event = next_event()
            kind = type(event)
            if kind is scalar_event:
                if event.anchor is not None or event.tag is not None:
                    raise _NotPlain
                value = event.value
                if event.implicit[0]:
                    known = plain.get(value, no_key)
                    value = resolve(value) if known is no_key else known
                if in_mapping and key is no_key:
                    if value in container:
                        raise _NotPlain
                    key = value
                    key_line = event.start_mark.line + 1
                    continue
            elif kind is mapping_start or kind is sequence_start:
                if event.anchor is not None or event.tag is not None:
                    raise _NotPlain
                if in_mapping and key is no_key:  # a mapping or sequence as a key
                    raise _NotPlain
                stack.append((container, in_mapping, key, key_line, lines))
                if kind is mapping_start:
                    container = new_mapping(SourceDict)
                    container.source = source
                    container.line = event.start_mark.line + 1
                    lines = container.key_lines = {}
                    in_mapping = True
                else:
                    container = []
                    in_mapping = False
                key = no_key
                continue
            elif kind is mapping_end or kind is sequence_end:
                value = container
                container, in_mapping, key, key_line, lines = stack.pop()
            elif kind is yaml.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise _NotPlain
                continue
            elif kind is yaml.StreamEndEvent:
                return result
            elif kind is alias_event:
                raise _NotPlain
            else:  # stream start, document end
                continue
            if in_mapping:
                container[key] = value
                lines[key] = key_line
                key = no_key
            elif container is not None:
                container.append(value)
            else:
                result = value
    except yaml.YAMLError as exc:
        raise _NotPlain from exc
    finally:
        parser.dispose()


_NO_KEY = object()


# The shapes :func:`_build_from_lines` reads, each a subset of YAML's own (YAML 1.1 §9.1.3 plain
# scalars, §9.1.1-2 quoted, §10.2.1 flow mappings, §10.2.2 block mappings): a key is a plain
# scalar of these characters (no indicator first, never ":", "#", a space or a flow indicator
# within); a value is such a plain scalar (a "-" first only before another character, so never a
# sequence entry), a one-line quoted scalar with no escape, or a one-line flow mapping of those.
_KEY = r"[A-Za-z0-9_/~+=][A-Za-z0-9_./+~=@%-]*"
_PLAIN = r"(?:[A-Za-z0-9_./+~=]|-(?=[A-Za-z0-9_./+~=@%-]))[A-Za-z0-9_./+~=@%-]*"
# one line of printable ASCII: no closing quote within, nor a "\" in double quotes (no escapes)
_QUOTED = r"\"[ !#-\[\]-~]*\"|'[ -&(-~]*'"
_SCALAR = f"{_QUOTED}|{_PLAIN}"
_ITEM = rf"(?:{_KEY}): +(?:{_SCALAR})"
_FLOW = rf"\{{ *(?:{_ITEM}(?: *, *{_ITEM})*)? *\}}"
_COMMENT = r"(?: +#.*)?"
# indent, key, then a one-key flow mapping's key and value (the line of a host with its address),
# or any other value
_LINE = re.compile(
    rf"( *)({_KEY}):(?: +(?:\{{ *({_KEY}): +({_SCALAR}) *\}}|({_SCALAR}|{_FLOW})))? *{_COMMENT}",
    re.ASCII,
)
_FLOW_ITEMS = re.compile(rf"({_KEY}): +({_SCALAR})", re.ASCII)
_BLANK_OR_COMMENT = re.compile(r" *(?:#.*)?", re.ASCII)
# What YAML reads as a line break or refuses (YAML 1.1 §5.1, §5.4: printable characters, breaks
# \r, \x85, \u2028, \u2029) anywhere, comments included: the text is ASCII with "\n" breaks only.
_NOT_LINES = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
# libyaml's limit on an implicit key (1,024 characters), kept by no line being that long
_MAX_LINE = 1000


def _build_from_lines(text: str, source: str) -> Any:
    """The document built straight from the text's lines, for what a large inventory is made of:
    block mappings of plain keys whose values are plain or simply quoted scalars, or one-line
    flow mappings of those (``gpu000123: {ansible_host: 10.0.0.123}``), comments and a leading
    ``---``. It gives what :func:`_build_from_events` gives (values by the same resolution,
    ``SourceDict`` lines), without libyaml's event per token (a third of the time of reading a
    large inventory: bench/README.md). Any line of another shape (a sequence, a block scalar, a
    multi-line flow, a tag, an anchor, a quote with an escape, a tab, a character outside ASCII)
    and anything YAML refuses (an indentation no open mapping has, a duplicate key) raises
    ``_NotPlain``: the event builder reads the text, or the full loader gives its error."""
    if not text.isascii() or _NOT_LINES.search(text):
        raise _NotPlain
    plain, resolve = _plain_scalars()
    no_key = _NO_KEY

    def scalar(text: str) -> Any:
        """A key's or value's text read: a quoted one as it stands, a plain one resolved."""
        first = text[0]
        if first == '"' or first == "'":
            return text[1:-1]
        known = plain.get(text, no_key)
        return resolve(text) if known is no_key else known

    new_mapping = dict.__new__

    def mapping(line: int) -> Any:
        """A new mapping that starts on ``line``."""
        made = new_mapping(SourceDict)
        made.source, made.line, made.key_lines = source, line, {}
        return made

    match = _LINE.fullmatch
    flow_items = _FLOW_ITEMS.findall
    root: Any = None
    # The open block mappings, innermost last, and the indentation of each one's keys.
    indents: list[int] = []
    mappings: list[Any] = []
    # A key with no value on its line: its value is the block mapping of the next, deeper line,
    # else null.
    waiting: Any = no_key
    waiting_in: Any = None
    waiting_indent = 0
    started = False
    number = 0
    for line in text.split("\n"):
        number += 1
        m = match(line)
        if m is None:
            if _BLANK_OR_COMMENT.fullmatch(line):
                continue
            if not started and line.rstrip(" ") == "---":  # the document's start, explicit
                started = True
                continue
            raise _NotPlain
        started = True
        if len(line) > _MAX_LINE:
            raise _NotPlain
        spaces, key_text, one_key, one_value, value_text = m.groups()
        indent = len(spaces)
        if waiting is not no_key:
            if indent > waiting_indent:
                block = waiting_in[waiting] = mapping(number)
                indents.append(indent)
                mappings.append(block)
            waiting = no_key
        if mappings:
            while indent < indents[-1]:
                indents.pop()
                mappings.pop()
                if not mappings:  # less indented than the document's first key
                    raise _NotPlain
            if indent != indents[-1]:
                raise _NotPlain
        elif root is None:
            root = mapping(number)
            indents.append(indent)
            mappings.append(root)
        else:
            raise _NotPlain
        current = mappings[-1]
        key = plain.get(key_text, no_key)
        if key is no_key:
            key = resolve(key_text)
        if key in current:
            raise _NotPlain
        current.key_lines[key] = number
        if one_key is not None:
            # {key: value}, the line of a host with its address: read inline, as ``scalar`` and
            # ``mapping`` would (a call each for 100,000 hosts was a tenth of the whole read)
            value = new_mapping(SourceDict)
            value.source, value.line = source, number
            inner = plain.get(one_key, no_key)
            if inner is no_key:
                inner = resolve(one_key)
            first = one_value[0]
            if first == '"' or first == "'":
                value[inner] = one_value[1:-1]
            else:
                known = plain.get(one_value, no_key)
                value[inner] = resolve(one_value) if known is no_key else known
            value.key_lines = {inner: number}
        elif value_text is None:
            value = None  # until a deeper line opens its block mapping
            waiting, waiting_in, waiting_indent = key, current, indent
        elif value_text[0] == "{":
            value = mapping(number)
            lines = value.key_lines
            for item_key, item_value in flow_items(value_text):
                inner = scalar(item_key)
                if inner in value:
                    raise _NotPlain
                value[inner] = scalar(item_value)
                lines[inner] = number
        else:
            value = scalar(value_text)
        current[key] = value
    if root is None:
        raise _NotPlain
    return root


def load_yaml_text(text: str, source: str) -> Any:
    """Parse YAML text; syntax errors become InputError with the file and line. The cyclic GC
    is paused while the many small objects of a large file are built."""
    loader_cls = type("_SourceLoader", (_FastLoader,), {"source": source})
    try:
        with collector_paused():
            try:
                return _build_from_lines(text, source)
            except _NotPlain:
                pass
            if _CParser is not None:
                try:
                    return _build_from_events(text, source)
                except _NotPlain:
                    pass
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
