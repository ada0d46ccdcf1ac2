"""YAML loading builds plain documents straight from libyaml's events (``_build_from_events``)
and leaves everything else to PyYAML's full loader: both give the same values, types, key order
and ``SourceDict`` file and lines, on every YAML file the product ships and on the real
inventories of ``../shared/ansible_inventory_corpus``; what the event builder does not read
(tags, anchors, merge keys, duplicates, several documents, syntax errors) comes out of the full
loader exactly as before."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import yamlsrc
from deployer.errors import InputError
from deployer.unsafe import UnsafeText
from deployer.yamlsrc import SourceDict, load_yaml_text

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "ansible_inventory_corpus"

pytestmark = pytest.mark.skipif(yamlsrc._CParser is None, reason="PyYAML built without libyaml")


def full_load(text: str, source: str) -> Any:
    """What the full loader alone gives (the path before the event builder)."""
    loader = type("_Full", (yamlsrc._FastLoader,), {"source": source})
    return yaml.load(text, Loader=loader)


def assert_same(built: Any, full: Any, path: str = "") -> None:
    assert type(built) is type(full), (path, type(built), type(full))
    if isinstance(full, dict):
        assert list(built) == list(full), path
        assert (built.source, built.line, built.key_lines) == (
            full.source,
            full.line,
            full.key_lines,
        ), path
        for key in full:
            assert_same(built[key], full[key], f"{path}/{key}")
    elif isinstance(full, list):
        assert len(built) == len(full), path
        for i, (b, f) in enumerate(zip(built, full, strict=True)):
            assert_same(b, f, f"{path}[{i}]")
    elif isinstance(full, float) and math.isnan(full):
        assert math.isnan(built), path
    else:
        assert built == full, (path, built, full)


def yaml_files() -> list[Path]:
    found = [
        p
        for top in ("roles", "templates", "tests", "bench", "deployer", "docs")
        if (REPO / top).is_dir()
        for p in (REPO / top).rglob("*")
        if p.suffix in (".yml", ".yaml") and p.is_file()
    ]
    if CORPUS.is_dir():
        found += [p for p in CORPUS.rglob("*") if p.suffix in (".yml", ".yaml") and p.is_file()]
    return sorted(found)


def test_every_shipped_and_corpus_yaml_file_reads_the_same_either_way() -> None:
    built_count = 0
    for path in yaml_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            full = full_load(text, str(path))
        except (yaml.YAMLError, InputError):
            continue  # a deliberately broken fixture: the error cases below cover these
        try:
            built = yamlsrc._build_from_events(text, str(path))
        except yamlsrc._NotPlain:
            continue  # tags, anchors...: read by the full loader, as before
        assert_same(built, full, str(path))
        built_count += 1
    assert built_count > 100  # the builder reads nearly all of them


PLAIN = """\
all:
  vars:
    ansible_user: root
    quoted: "580"
    single: '08'
    empty:
    tilde: ~
    flags: [yes, No, on, off, true, False]
    numbers: [8, 0x1F, 0o17, 017, 1_000, -3, +4, 1.5, .inf, -.Inf, .NaN, 6.02e+23]
    when: 2026-12-02
    stamp: 2026-12-02T10:11:12Z
    text: |
      line one
      line two
    folded: >-
      a b
      c
  children:
    gpu:
      hosts:
        gpu01: {ansible_host: 10.0.0.1, port: 22}
        gpu02:
      vars: {list_of_maps: [{a: 1}, {b: [2, 3]}], nested: {deep: {deeper: [[], {}]}}}
"""


def test_scalars_of_every_implicit_type_and_nested_containers_read_the_same() -> None:
    built = yamlsrc._build_from_events(PLAIN, "inv.yml")
    assert_same(built, full_load(PLAIN, "inv.yml"))
    v = built["all"]["vars"]
    assert v["quoted"] == "580" and v["single"] == "08" and v["empty"] is None
    assert v["flags"] == [True, False, True, False, True, False]
    assert v["when"] == datetime.date(2026, 12, 2)
    assert built["all"].line_of("children") == 18
    assert built["all"]["children"]["gpu"]["hosts"].line_of("gpu02") == 22


@pytest.mark.parametrize(
    "scalar",
    ["", "~", "null", "Null", "NULL", "yes", "No", "on", "OFF", "y", "true", "False", "1", "-1",
     "+1", "0", "0x1f", "0o17", "017", "1_000", "0b101", "1.5", ".5", "1e3", "1.0e+3", "-1.5E-2",
     ".inf", "-.Inf", ".NaN", "1:20", "190:20:30.15", "2026-12-02", "2026-12-02 10:20:30",
     "2026-12-02T10:20:30.5Z", "2026-1-2", "10.0.0.1", "fd00::1", "gpu01", "r00012", ".",
     "+", "1.2.3", "0.", "e3", "_1"],
)  # fmt: skip
def test_every_implicit_scalar_resolves_as_the_full_loader_resolves_it(scalar: str) -> None:
    text = f"k: {scalar}\nl:\n  - {scalar}\n"
    assert_same(yamlsrc._build_from_events(text, "x.yml"), full_load(text, "x.yml"))


@pytest.mark.parametrize(
    "text",
    ["", "# only a comment\n", "just text\n", "42\n", "- a\n- b\n", "---\nx: 1\n...\n"],
    ids=["empty", "comment", "scalar", "int", "sequence", "markers"],
)
def test_documents_that_are_not_a_mapping_read_the_same(text: str) -> None:
    assert_same(yamlsrc._build_from_events(text, "f.yml"), full_load(text, "f.yml"))


@pytest.mark.parametrize(
    "text",
    [
        "a: !unsafe '{{ x }}'\n",
        "a: !!str 1\n",
        "a: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n",
        "base: &b {x: 1}\nother: *b\n",
        "base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n",
        "a: 1\na: 2\n",
        "? [1, 2]\n: v\n",
        "? {k: 1}\n: v\n",
        "a: 1\n---\nb: 2\n",
        "a: [1, 2\n",
        "a: =\n",
        "a: !!map {x: 1}\n",
    ],
    ids=[
        "unsafe",
        "explicit-str",
        "vault",
        "alias",
        "merge",
        "duplicate",
        "sequence-key",
        "mapping-key",
        "two-documents",
        "syntax-error",
        "value-key",
        "tagged-map",
    ],
)
def test_what_the_event_builder_does_not_read_is_left_to_the_full_loader(text: str) -> None:
    with pytest.raises(yamlsrc._NotPlain):
        yamlsrc._build_from_events(text, "f.yml")


def test_the_full_loader_still_gives_tags_aliases_and_merges_their_meaning() -> None:
    loaded = load_yaml_text(
        "a: !unsafe '{{ x }}'\nbase: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n", "f.yml"
    )
    assert isinstance(loaded["a"], UnsafeText)
    assert loaded["other"] == {"x": 1, "y": 2} and isinstance(loaded["other"], SourceDict)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("a: 1\nb:\n  c: 2\n  c: 3\n", 4, "duplicate key"),
        ("a: [1, 2\nb: 3\n", 2, "invalid YAML"),
        ("a: 1\n---\nb: 2\n", 2, "invalid YAML"),
        ("? [1, 2]\n: v\n", 1, "mapping key is not a scalar"),
        ("a: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n", 1, "vault"),
    ],
    ids=["duplicate", "syntax", "two-documents", "sequence-key", "vault"],
)
def test_errors_name_the_file_and_line_as_the_full_loader_does(
    text: str, line: int, message: str
) -> None:
    with pytest.raises(InputError, match=message) as caught:
        load_yaml_text(text, "inv.yml")
    assert (caught.value.source, caught.value.line) == ("inv.yml", line)


def test_a_large_synthetic_inventory_reads_the_same_either_way() -> None:
    from bench.planning import inventory_yaml

    text = inventory_yaml(2000)
    assert_same(yamlsrc._build_from_events(text, "big.yml"), full_load(text, "big.yml"))
