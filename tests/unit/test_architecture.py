"""The structure of ``deployer/``, drawn from the code's own imports (docs/architecture.md):
no import circle, no module over ~800 lines, no use of another module's private names, and no
per-host context left on the planner between hosts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "deployer"
MAX_LINES = 800


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> dict[str, list[tuple[str, int]]]:
    """Every deployer module ``name`` imports (module -> [(imported name or '', line)]),
    function-level and TYPE_CHECKING imports included: a circle broken at run time by a late
    import is still a circle."""
    tree = ast.parse(MODULES[name].read_text())
    is_package = MODULES[name].name == "__init__.py"
    out: dict[str, list[tuple[str, int]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    out.setdefault(alias.name, []).append(("", node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_package else name.split(".")[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:  # from deployer.gpu import rules: the module itself
                    out.setdefault(sub, []).append(("", node.lineno))
                elif base in MODULES:
                    out.setdefault(base, []).append((alias.name, node.lineno))
    out.pop(name, None)
    return out


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_import_graph_of_deployer_has_no_circle():
    # strongly connected components (Tarjan): a component of more than one module is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert circles == []


def test_no_module_is_over_800_lines():
    long = {
        name: len(path.read_text().splitlines())
        for name, path in MODULES.items()
        if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert long == {}


def test_no_module_imports_another_modules_private_names():
    found = [
        f"{name}:{line} imports {target}.{what}"
        for name, targets in GRAPH.items()
        for target, names in targets.items()
        for what, line in names
        if what.startswith("_") and not what.startswith("__")
    ]
    assert found == []


def test_no_module_reaches_into_another_modules_private_attributes():
    """``module._name`` for an imported deployer module, and ``x._open``-style calls on objects
    of other modules (any ``._name`` not on ``self``/``cls`` or a module-local name)."""
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    aliases[(alias.asname or alias.name).split(".")[0]] = alias.name
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in MODULES:
                        aliases[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and aliases[node.value.id] in MODULES
            ):
                found.append(f"{name}:{node.lineno} {node.value.id}.{node.attr}")
    assert found == []


def test_no_caller_sets_a_context_on_the_planner():
    found = [
        f"{name}:{node.lineno}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "extra_context"
        and isinstance(node.ctx, ast.Store)
    ]
    assert found == []


def test_no_task_is_found_by_its_name_nor_an_error_by_its_message():
    """Between layers pass data: the rollout and the monitoring tier know a task by its tags and
    an empty tier by its data, never by a substring of a name or a message."""
    for name in ("deployer.rollout.controller", "deployer.monitoring.tier"):
        text = MODULES[name].read_text()
        assert " in t.task" not in text and "in exc.message" not in text, name


# docs/architecture.md's layers, top first: a module imports only from its own layer and below.
LAYERS = [
    ["cli", "lab"],
    ["rollout", "unverified", "restore", "init_inventory", "monitoring.targets", "monitoring.tier",
     "monitoring.capacity_plan", "monitoring.capacity_view"],
    # status reads what a rollout leaves on disk and on Slurm nodes: the rollout's leaf modules of
    # state, options and drain naming sit in status' layer (they import only the bottom line)
    ["monitoring.status", "monitoring.expect", "monitoring.check", "monitoring.checks_driver",
     "monitoring.checks_gpus", "monitoring.checks_loaded", "monitoring.checks_scrape",
     "monitoring.checks_shards", "monitoring.checks_global", "monitoring.checks_thanos",
     "monitoring.store", "monitoring.slurm", "monitoring.slurm_state", "monitoring.rollouts",
     "monitoring.silences",
     "rollout.drain", "rollout.state", "rollout.options", "rollout.batching"],
    ["session"],
    ["executor", "hostsession", "owed", "report"],
    ["plan", "roles", "templating", "hostpattern", "inventory", "rule_pack", "alertmanager_config",
     "monitoring.file_sd", "monitoring.remote_write", "monitoring.capacity",
     "monitoring.shards", "monitoring.shard_memo", "monitoring.handoff", "monitoring.host_values",
     "monitoring.federation",  # what the prometheus templates render
     "monitoring.dashboards"],  # what the grafana templates render
    ["gpu"],
    ["modules", "results"],
    ["hostaccess", "boot", "facts", "connection", "known_hosts",
     "monitoring.http"],  # the one HTTP client: status, silences, the store, the dashboards' proof
    ["errors", "secrets", "booleans", "varformats", "yamlsrc", "memory", "spans", "dcgm_fields",
     "library_logs", "unsafe", "controller_secrets", "run_lock", "tls", "dpkg_arch", "debversion",
     "__init__"],
]  # fmt: skip


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    sub = ".".join(parts[1:3])
    for name in (sub, top):  # a submodule named in a layer is there, else its package's layer
        for i, names in enumerate(LAYERS):
            if name in names:
                return i
    raise AssertionError(f"{module} is in no layer of docs/architecture.md")


def test_every_import_goes_down_the_layers_of_the_architecture_page():
    upward = [
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if not name.startswith("deployer.lab")
        for target in targets
        if not target.startswith("deployer.lab.") or name == "deployer.cli"
        if layer_of(target) < layer_of(name)
    ]
    assert upward == []
