"""YAML loading reads a large inventory's lines straight (``_build_from_lines``) when every line is
one of a few plain shapes (block mappings of plain keys; plain or simply quoted values; one-line
flow mappings of those; comments), and leaves anything else to the event builder and then the
full loader: whatever it reads, it reads as they do (values, types, key order, ``SourceDict``
file and lines), and whatever YAML refuses, it never accepts."""

from __future__ import annotations

import random

import pytest
import yaml

from deployer import yamlsrc
from deployer.errors import InputError
from deployer.yamlsrc import load_yaml_text
from tests.unit.test_yaml_events import assert_same, full_load, yaml_files

INVENTORY = """\
---
# a rack of GPU hosts
all:
  vars:
    ansible_user: root   # the hosts' login
    nvidia_driver_branch: "580"
    dcgm_version: '4.4.2'
    empty:
    tilde: ~
    enabled: yes
    count: 8
    ratio: 0.5
    when: 2026-12-02
  children:  # groups
    gpu:
      hosts:
        gpu01: {ansible_host: 10.0.0.1}
        gpu02: {ansible_host: 10.0.0.2, ansible_port: 2222, rack: "r 1, {a}"}
        gpu03:

        gpu04: { }
      vars: {gpu_model: H100}
    monitoring:
"""


def both(text: str) -> tuple[object, object]:
    return yamlsrc._build_from_lines(text, "inv.yml"), full_load(text, "inv.yml")


def test_an_inventory_of_plain_lines_reads_as_the_full_loader_reads_it() -> None:
    built, full = both(INVENTORY)
    assert_same(built, full)
    assert built["all"]["vars"]["nvidia_driver_branch"] == "580"
    assert built["all"]["vars"]["enabled"] is True and built["all"]["vars"]["empty"] is None
    assert built.line == 3 and built["all"].line == 4 and built["all"].line_of("children") == 14
    hosts = built["all"]["children"]["gpu"]["hosts"]
    assert hosts.line == 17 and hosts.line_of("gpu04") == 21
    assert hosts["gpu02"] == {"ansible_host": "10.0.0.2", "ansible_port": 2222, "rack": "r 1, {a}"}
    assert built["all"]["children"]["monitoring"] is None


def test_every_shipped_and_corpus_yaml_file_it_reads_reads_the_same() -> None:
    read = 0
    for path in yaml_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            full = full_load(text, str(path))
        except (yaml.YAMLError, InputError):
            with pytest.raises(yamlsrc._NotPlain):
                yamlsrc._build_from_lines(text, str(path))
            continue
        try:
            built = yamlsrc._build_from_lines(text, str(path))
        except yamlsrc._NotPlain:
            continue
        assert_same(built, full, str(path))
        read += 1
    assert read > 40  # the product's own files alone give 45; the corpus, where present, more


def test_the_benchs_large_inventories_read_the_same_either_way() -> None:
    from bench.planning import inventory_yaml

    for layout, shards in (("racks", 0), ("flat", 0), ("racks", 4)):
        text = inventory_yaml(3000, layout, shards)
        assert_same(yamlsrc._build_from_lines(text, "big.yml"), full_load(text, "big.yml"))


@pytest.mark.parametrize(
    "text",
    [
        "a:\n  - x\n",
        "a: [1, 2]\n",
        "a: |\n  text\n",
        "a: !unsafe '{{ x }}'\n",
        "a: &b 1\nc: *b\n",
        "a:\n  <<: {x: 1}\n",
        'a: "tab\\tescaped"\n',
        "a: 'it''s'\n",
        "a: {x: 1,\n  y: 2}\n",
        "a:\n\tb: 1\n",
        "a: 1\r\nb: 2\r\n",
        "a: caf\u00e9\n",
        "# caf\u00e9\na: 1\n",
        "a: 1\n# \u2028\nb: 2\n",
        "a: two words\n",
        "gpu[01:04]: {}\n",
        "a:\n  foo\n",
        "a: 1\n...\n",
        "--- {a: 1}\n",
        "a: =\n",
        "x" * 1100 + ": 1\n",
    ],
    ids=[
        "sequence",
        "flow-sequence",
        "block-scalar",
        "tag",
        "anchor",
        "merge-key",
        "escape",
        "quote-in-quote",
        "multi-line-flow",
        "tab",
        "crlf",
        "not-ascii",
        "not-ascii-comment",
        "line-separator",
        "spaces-in-plain",
        "host-pattern",
        "multi-line-plain",
        "document-end",
        "inline-document",
        "value-key",
        "long-key",
    ],
)
def test_other_yaml_is_left_to_the_event_builder_and_the_full_loader(text: str) -> None:
    with pytest.raises(yamlsrc._NotPlain):
        yamlsrc._build_from_lines(text, "f.yml")
    try:
        full = full_load(text, "f.yml")
    except yaml.YAMLError:
        with pytest.raises(InputError):
            load_yaml_text(text, "f.yml")
    else:
        assert_same(load_yaml_text(text, "f.yml"), full)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb:\n  c: 2\n  c: 3\n",
        "a: 1\n1: x\ntrue: y\n",
        "a: {x: 1, x: 2}\n",
        "a:\n    b: 1\n  c: 2\n",
        "a: 1\n  b: 2\n",
        "  a: 1\nb: 2\n",
        "a: 1\n---\nb: 2\n",
        'a: "x" y\n',
        "a: 1 b: 2\n",
        "a: -\n",
        "a:#x\n",
    ],
    ids=[
        "duplicate",
        "duplicate-as-equal",
        "duplicate-in-flow",
        "indent-no-mapping-has",
        "deeper-after-a-value",
        "less-than-the-document",
        "second-document",
        "after-a-quote",
        "second-key-on-a-line",
        "sequence-entry-as-value",
        "no-space-after-colon",
    ],
)
def test_what_yaml_refuses_or_reads_otherwise_it_never_accepts(text: str) -> None:
    with pytest.raises(yamlsrc._NotPlain):
        yamlsrc._build_from_lines(text, "f.yml")


KEYS = ["a", "b", "gpu01", "on", "1", "0x1F", "~", "2026-12-02", "x.y", "/p", "1.5", "-1", "k-2"]
VALUES = [
    "1", "-1", "+1", "0o17", "017", "1_000", "1.5", ".inf", "-.Inf", ".NaN", "1e3", "yes", "No",
    "off", "null", "~", "2026-12-02", "10.0.0.1", "fd00::1", "...", "-", "--x", "=", "==", "a=b",
    "x@y", "50%", '"580"', "'08'", '"a, b}"', "'#x'", '"quote \\" here"', "''", '""', "a b",
    "{}", "{ }", "{k: v}", "{k: 1, on: x}", "{k: '1,2', j: \"}\"}", "{k: v,j: w}", "{k: v,}",
    "{k}", "[1]", "#c", "x #c", "x#c", "'a''b'", "!t x", "&a x", "*a", "|", ">-", "%x", "@x",
    "`x`", "?x", "? x", ":x", "x:", "x: y",
]  # fmt: skip


def random_document(rng: random.Random) -> str:
    lines = []
    if rng.random() < 0.2:
        lines.append("---")
    indent = 0
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.1:
            lines.append(" " * rng.randint(0, 6) + rng.choice(["# note", "#", ""]))
            continue
        if roll < 0.3:
            indent += rng.choice([1, 2, 4])
        elif roll < 0.5:
            indent = max(0, indent - rng.choice([1, 2, 4]))
        key = rng.choice(KEYS)
        if rng.random() < 0.35:
            lines.append(f"{' ' * indent}{key}:" + rng.choice(["", "  ", " # c"]))
        else:
            value = rng.choice(VALUES)
            sep = rng.choice([" ", "  "])
            tail = rng.choice(["", "", " ", " # c", "#c"])
            lines.append(f"{' ' * indent}{key}:{sep}{value}{tail}")
    return "\n".join(lines) + rng.choice(["\n", ""])


def test_random_documents_read_as_the_full_loader_reads_them_or_are_left_to_it() -> None:
    rng = random.Random(20261206)
    read = 0
    for _ in range(4000):
        text = random_document(rng)
        try:
            built = yamlsrc._build_from_lines(text, "r.yml")
        except yamlsrc._NotPlain:
            continue
        try:
            full = full_load(text, "r.yml")
        except (yaml.YAMLError, InputError) as exc:  # pragma: no cover - the failure
            raise AssertionError(f"read what YAML refuses ({exc}):\n{text}") from exc
        assert_same(built, full, text)
        read += 1
    assert read > 300, read
