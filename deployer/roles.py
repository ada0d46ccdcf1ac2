"""Roles and the site file: loading ``roles/<role>/{defaults,tasks,handlers}/main.yml`` and plays.

A task is one module with its arguments plus optional ``name``, ``when``, ``loop``, ``notify``,
``tags`` and ``ha_peers`` (``{hosts: [...], url: ...}``: the other replicas of this service and
the readiness URL of each, rendered with ``peer`` bound to its name; the engine never takes the
service down while one of them does not answer). Loading checks the structure and that every
module exists; argument checks happen when the plan is built, also before any connection. Every
error names the role file and line.

``meta/argument_specs.yml`` (Ansible's layout: ``argument_specs.main.options``) lists variables
whose values must have a format (deployer/varformats.py): the flags a role passes to its daemon,
checked for every host before any connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.modules import MODULES
from deployer.varformats import FORMATS
from deployer.yamlsrc import SourceDict, load_yaml_file

# The product's own site, roles and shared templates (the session's defaults).
PRODUCT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SITE = PRODUCT_ROOT / "site.yml"
DEFAULT_ROLES = PRODUCT_ROOT / "roles"
SHARED_TEMPLATES = PRODUCT_ROOT / "templates"

TASK_KEYWORDS = {"name", "when", "loop", "loop_var", "notify", "tags", "ha_peers"}
HA_PEERS_KEYS = ("hosts", "url")
# The keys of one option in meta/argument_specs.yml (Ansible's, plus format and allow_empty).
SPEC_KEYS = {"type", "elements", "format", "allow_empty", "description", "required", "default"}
# ``- meta: flush_handlers`` runs the handlers notified so far, here, instead of after the role
# (so a verification after it sees the restarted service). The only meta action there is.
META = "meta"
META_ACTIONS = ("flush_handlers",)
# The module whose arguments may be given as a bare string (``command: systemctl daemon-reload``).
FREE_FORM = {"command": "cmd"}


@dataclass(frozen=True)
class Task:
    """One step of a role: a module, its (unrendered) arguments, and where it was written."""

    role: str
    name: str
    module: str
    args: dict[str, Any]
    source: str
    line: int | None
    when: Any = None
    loop: Any = None
    loop_var: str = "item"
    notify: tuple[str, ...] = ()
    tags: frozenset[str] = frozenset()
    ha_peers: Any = None  # {hosts, url}, unrendered


@dataclass(frozen=True)
class VariableSpec:
    """A role variable whose value (or, for a list, each element) must have ``format``."""

    name: str
    format: str
    elements: bool = False
    allow_empty: bool = False
    description: str = ""
    source: str = ""
    line: int | None = None


@dataclass(frozen=True)
class Role:
    name: str
    path: Path
    defaults: dict[str, Any]
    tasks: tuple[Task, ...]
    handlers: tuple[Task, ...]
    variables: tuple[VariableSpec, ...] = ()

    def find(self, kind: str, relative: str, shared_templates: Path | None) -> Path | None:
        """A role file (``files``/``templates``), falling back to the shared templates dir."""
        candidate = self.path / kind / relative
        if candidate.is_file():
            return candidate
        if kind == "templates" and shared_templates is not None:
            shared = shared_templates / relative
            if shared.is_file():
                return shared
        return None


@dataclass(frozen=True)
class Play:
    """Roles applied to the hosts matching a pattern; ``serial`` hosts at a time (0 = all)."""

    name: str
    hosts: str
    roles: tuple[str, ...]
    serial: int = 0
    tags: frozenset[str] = field(default_factory=frozenset)
    source: str = ""
    line: int | None = None


def _tags(value: Any, source: str, line: int | None, key: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        value = [t.strip() for t in value.split(",") if t.strip()]
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InputError(
            "tags must be a string or a list of strings", source=source, line=line, key=key
        )
    return frozenset(value)


def parse_task(role: str, data: Any, source: str, index: int) -> Task:
    if not isinstance(data, SourceDict):
        raise InputError(f"task #{index + 1} must be a mapping", source=source)
    line = data.line
    if META in data:
        action = data[META]
        extra = [k for k in data if k not in (META, "name", "when", "tags")]
        if action not in META_ACTIONS or extra:
            raise InputError(
                f"meta supports only {', '.join(META_ACTIONS)} (with name, when, tags)",
                source=source,
                line=data.line_of(META),
                key=META,
            )
        return Task(
            role=role,
            name=str(data.get("name") or action),
            module=META,
            args={"action": action},
            source=source,
            line=line,
            when=data.get("when"),
            tags=_tags(data.get("tags"), source, data.line_of("tags"), "tags"),
        )
    unknown = [k for k in data if k not in TASK_KEYWORDS and k not in MODULES]
    modules = [k for k in data if k in MODULES]
    if unknown:
        key = unknown[0]
        raise InputError(
            f"unknown module or task keyword {key!r} (modules: {', '.join(sorted(MODULES))})",
            source=source,
            line=data.line_of(key),
            key=str(key),
        )
    if len(modules) != 1:
        what = "no module" if not modules else f"several modules ({', '.join(modules)})"
        raise InputError(f"a task needs exactly one module, found {what}", source=source, line=line)
    module = modules[0]
    args = data[module]
    if isinstance(args, str) and module in FREE_FORM:
        args = {FREE_FORM[module]: args}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InputError(
            f"arguments of {module} must be a mapping",
            source=source,
            line=data.line_of(module),
            key=module,
        )
    name = data.get("name") or f"{module}"
    if not isinstance(name, str):
        raise InputError(
            "name must be a string", source=source, line=data.line_of("name"), key="name"
        )
    notify = data.get("notify") or ()
    if isinstance(notify, str):
        notify = (notify,)
    if not isinstance(notify, (list, tuple)) or not all(isinstance(n, str) for n in notify):
        raise InputError(
            "notify must be a handler name or a list of them",
            source=source,
            line=data.line_of("notify"),
            key="notify",
        )
    when = data.get("when")
    if isinstance(when, list):
        # Ansible's list form: all must hold.
        when = " and ".join(f"({w})" for w in when)
    loop = data.get("loop")
    if loop is not None and not isinstance(loop, (list, str)):
        raise InputError(
            "loop must be a list or a Jinja expression",
            source=source,
            line=data.line_of("loop"),
            key="loop",
        )
    loop_var = data.get("loop_var", "item")
    if not isinstance(loop_var, str) or not loop_var.isidentifier():
        raise InputError(
            "loop_var must be an identifier",
            source=source,
            line=data.line_of("loop_var"),
            key="loop_var",
        )
    ha_peers = data.get("ha_peers")
    if ha_peers is not None and (
        not isinstance(ha_peers, dict)
        or sorted(ha_peers) != sorted(HA_PEERS_KEYS)
        or not isinstance(ha_peers["url"], str)
    ):
        raise InputError(
            "ha_peers must be a mapping {hosts: <peer host names>, url: <readiness URL of peer>}",
            source=source,
            line=data.line_of("ha_peers"),
            key="ha_peers",
        )
    return Task(
        role=role,
        name=name,
        module=module,
        args=args,
        source=source,
        line=line,
        when=when,
        loop=loop,
        loop_var=loop_var,
        notify=tuple(notify),
        tags=_tags(data.get("tags"), source, data.line_of("tags"), "tags"),
        ha_peers=ha_peers,
    )


def _task_list(role: str, path: Path) -> tuple[Task, ...]:
    if not path.exists():
        return ()
    data = load_yaml_file(path)
    if data is None:
        return ()
    if not isinstance(data, list):
        raise InputError("must be a list of tasks", source=str(path), line=getattr(data, "line", 1))
    return tuple(parse_task(role, item, str(path), i) for i, item in enumerate(data))


def load_role(roles_path: list[Path], name: str) -> Role:
    for base in roles_path:
        path = base / name
        if path.is_dir():
            break
    else:
        raise InputError(f"role {name!r} not found in {', '.join(map(str, roles_path))}", key=name)
    defaults_file = path / "defaults" / "main.yml"
    defaults: Any = load_yaml_file(defaults_file) if defaults_file.exists() else {}
    if defaults is None:
        defaults = {}
    if not isinstance(defaults, dict):
        raise InputError("role defaults must be a mapping", source=str(defaults_file), line=1)
    tasks = _task_list(name, path / "tasks" / "main.yml")
    handlers = _task_list(name, path / "handlers" / "main.yml")
    seen: dict[str, Task] = {}
    for h in handlers:
        if h.name in seen:
            raise InputError(
                f"duplicate handler name {h.name!r}", source=h.source, line=h.line, key="name"
            )
        seen[h.name] = h
    variables = _variable_specs(path / "meta" / "argument_specs.yml")
    return Role(
        name=name,
        path=path,
        defaults=dict(defaults),
        tasks=tasks,
        handlers=handlers,
        variables=variables,
    )


def _variable_specs(path: Path) -> tuple[VariableSpec, ...]:
    if not path.exists():
        return ()
    source = str(path)
    data = load_yaml_file(path)
    main = data.get("argument_specs", {}).get("main") if isinstance(data, dict) else None
    options = main.get("options") if isinstance(main, dict) else None
    if not isinstance(options, dict):
        raise InputError("expected argument_specs: {main: {options: {...}}}", source=source, line=1)
    specs = []
    for name, spec in options.items():
        line = options.line_of(name) if isinstance(options, SourceDict) else None
        if not isinstance(spec, dict):
            raise InputError("an option must be a mapping", source=source, line=line, key=name)
        unknown = sorted(set(spec) - SPEC_KEYS)
        if unknown:
            raise InputError(
                f"unknown option key {unknown[0]!r}", source=source, line=line, key=name
            )
        fmt = spec.get("format")
        if fmt not in FORMATS:
            raise InputError(
                f"format must be one of {', '.join(sorted(FORMATS))}",
                source=source,
                line=line,
                key=f"{name}.format",
            )
        kind = spec.get("type", "str")
        if kind not in ("str", "int", "list") or (kind == "list") != ("elements" in spec):
            raise InputError(
                "type must be str, int, or list with elements: str",
                source=source,
                line=line,
                key=f"{name}.type",
            )
        specs.append(
            VariableSpec(
                name=str(name),
                format=fmt,
                elements=kind == "list",
                allow_empty=bool(spec.get("allow_empty", False)),
                description=str(spec.get("description", "")),
                source=source,
                line=line,
            )
        )
    return tuple(specs)


def load_site(path: Path) -> tuple[Play, ...]:
    """A site file: a list of plays ``{name, hosts, roles, serial, tags}``."""
    data = load_yaml_file(path)
    source = str(path)
    if not isinstance(data, list) or not data:
        raise InputError("a site file is a non-empty list of plays", source=source, line=1)
    plays = []
    for i, item in enumerate(data):
        if not isinstance(item, SourceDict):
            raise InputError(f"play #{i + 1} must be a mapping", source=source)
        unknown = set(item) - {"name", "hosts", "roles", "serial", "tags"}
        if unknown:
            key = sorted(unknown)[0]
            raise InputError("unknown play keyword", source=source, line=item.line_of(key), key=key)
        hosts = item.get("hosts")
        if not isinstance(hosts, str) or not hosts:
            raise InputError(
                "hosts must be a pattern string",
                source=source,
                line=item.line_of("hosts"),
                key="hosts",
            )
        roles = item.get("roles")
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise InputError(
                "roles must be a list of role names",
                source=source,
                line=item.line_of("roles"),
                key="roles",
            )
        serial = item.get("serial", 0)
        if not isinstance(serial, int) or isinstance(serial, bool) or serial < 0:
            raise InputError(
                "serial must be a non-negative integer",
                source=source,
                line=item.line_of("serial"),
                key="serial",
            )
        plays.append(
            Play(
                name=str(item.get("name") or hosts),
                hosts=hosts,
                roles=tuple(roles),
                serial=serial,
                tags=_tags(item.get("tags"), source, item.line_of("tags"), "tags"),
                source=source,
                line=item.line,
            )
        )
    return tuple(plays)
