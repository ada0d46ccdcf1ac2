"""docs/unverified.md is the one list of unverified facts, and agrees with compat.yml's marks."""

from __future__ import annotations

import re
from pathlib import Path

from deployer import unverified

ROOT = Path(__file__).resolve().parents[2]
TEXT = unverified.DOC.read_text(encoding="utf-8")
POINTER = re.compile(r"docs/unverified\.md#([a-z0-9-]+)")
SEARCHED = ("deployer", "roles", "docs", "README.md", "site.yml", "scripts", "tests")


def pointers() -> dict[str, list[str]]:
    """{id: [files pointing to it]} over the repository's own text files."""
    found: dict[str, list[str]] = {}
    for top in SEARCHED:
        for path in [ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix in (".pyc",) or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for m in POINTER.finditer(text):
                found.setdefault(m.group(1), []).append(str(path.relative_to(ROOT)))
    return found


def test_every_compat_mark_has_its_row_as_the_data_says_now():
    assert unverified.render(TEXT) == TEXT, "stale: run python -m deployer.unverified"


def test_every_row_id_is_unique():
    ids = re.findall(r'<a id="([^"]+)"></a>', TEXT)
    assert len(ids) == len(set(ids))


def test_every_mark_of_compat_yml_is_a_row():
    ids = set(re.findall(r'<a id="([^"]+)"></a>', TEXT))
    assert {m.id for m in unverified.marks()} <= ids
    assert len(unverified.marks()) > 40


def test_every_hand_written_row_is_pointed_to_from_the_code():
    found = pointers()
    for row in unverified.hand_written_ids(TEXT):
        assert any(f != "docs/unverified.md" for f in found.get(row, [])), row


def test_every_pointer_in_the_code_names_a_row():
    ids = set(re.findall(r'<a id="([^"]+)"></a>', TEXT))
    dangling = {k: v for k, v in pointers().items() if k not in ids}
    assert dangling == {}


def test_check_mode_says_when_the_list_is_stale(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "unverified.md"
    doc.write_text(TEXT.replace(unverified.END, "| stale row |\n" + unverified.END))
    monkeypatch.setattr(unverified, "DOC", doc)
    assert unverified.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
