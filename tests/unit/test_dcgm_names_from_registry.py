"""Every DCGM field name the product's code uses comes from the field registry
(``deployer.dcgm_fields.metric(key)``), so that a DCGM rename is one edit there: no string of
gpumon-deploy's own code spells a ``DCGM_FI_*`` / ``DCGM_EXP_*`` name, docstrings and comments
aside. Exempt: the registry itself, the lab's GPU simulator (which prints what NVIDIA's tools
print, per version)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

DEPLOYER = Path(__file__).resolve().parents[2] / "deployer"
EXEMPT_FILES = ("dcgm_fields.py",)
EXEMPT_DIR = "lab/gpusim/"
NAME = re.compile(r"DCGM_(?:FI|EXP)_[A-Z0-9_]+")


def docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def literal_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [
                f"{path.relative_to(DEPLOYER)}:{node.lineno} {n}" for n in NAME.findall(node.value)
            ]
    return found


def test_no_code_outside_the_registry_spells_a_dcgm_field_name():
    found = []
    for path in sorted(DEPLOYER.rglob("*.py")):
        rel = path.relative_to(DEPLOYER).as_posix()
        if rel not in EXEMPT_FILES and not rel.startswith(EXEMPT_DIR):
            found += literal_names(path)
    assert found == []
