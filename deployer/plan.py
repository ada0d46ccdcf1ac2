"""The plan: every host's concrete task list, built and validated before any connection.

For each play and each selected host: variables resolved (role defaults < group vars < host vars
< extra vars), the roles' flag variables checked against their daemons' formats, ``when``
evaluated, loops expanded, arguments rendered and checked by the module, files read and templates
rendered, HA peers resolved. Anything wrong is an InputError naming the role file and line, or the
variable, where it was set, and the host.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from deployer.errors import InputError
from deployer.inventory.model import MagicVars
from deployer.modules import MODULES
from deployer.modules.base import ArgError, Module, PrepareContext
from deployer.roles import META, Play, Role, Task, VariableSpec, load_role
from deployer.secrets import mask_text
from deployer.templating import (
    PLAIN_TYPES,
    NamesOnly,
    Renderer,
    TemplatedVars,
    UndefinedVariable,
    make_environment,
    shown_path,
)
from deployer.varformats import FORMATS

ALWAYS = "always"
_MAGIC = frozenset(MagicVars.KEYS)
_MISSING = object()
EMPTY: Mapping[str, Any] = MappingProxyType({})


def resolve(
    inventory: Any, host: str, defaults: dict[str, Any], overrides: Mapping[str, Any] = EMPTY
) -> dict[str, Any]:
    """The one variable rule: the defaults of the roles in scope < the inventory's layers (group,
    host, ``-e``) < the run's overrides (what a command sets for its own converge, such as the
    rollout's target driver). A new dict, the caller's to extend."""
    variables = inventory.resolve_vars(host, defaults)
    if overrides:
        variables.update(overrides)
    return variables


def resolve_view(
    inventory: Any, host: str, defaults: Mapping[str, Any], overrides: Mapping[str, Any] = EMPTY
) -> Mapping[str, Any]:
    """What :func:`resolve` gives, as a read-only view over the layers (nothing copied): for the
    reads of every GPU host's plan, which at 100,000 hosts copied 140 MiB of merged dicts."""
    return inventory.layered_vars(host, defaults, overrides)


@dataclass
class PlannedTask:
    """A task made concrete for one host: module instance and final arguments."""

    role: str
    name: str
    module: Module | None  # None: a flush_handlers point, not a module task
    args: dict[str, Any]
    source: str
    line: int | None
    notify: tuple[str, ...] = ()
    secret_args: frozenset[str] = frozenset()
    handler: bool = False
    # The task's tags with its play's: how a caller finds a task (never by its name).
    tags: frozenset[str] = frozenset()
    # (peer host, readiness URL): the engine takes this task's service down only while every
    # peer answers (deployer/executor.py, the HA invariant).
    ha_peers: tuple[tuple[str, str], ...] = ()

    @property
    def flush_handlers(self) -> bool:
        return self.module is None

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line else self.source


@dataclass
class HostPlay:
    """One play's work on one host: tasks in order and the handlers they may notify."""

    play: Play
    tasks: list[PlannedTask]
    handlers: dict[str, PlannedTask]
    handler_order: list[str]


@dataclass
class HostPlan:
    host: str
    plays: list[HostPlay] = field(default_factory=list)


class LazyHostVars(Mapping[str, Any]):
    """``hostvars[name]``: other hosts' resolved variables, computed only when a template asks."""

    renders_itself = True  # entries are TemplatedVars: each host renders in its own scope

    def __init__(
        self,
        inventory: Any,
        defaults: dict[str, Any],
        renderer: Renderer,
        overrides: Mapping[str, Any] = EMPTY,
    ) -> None:
        self._inventory = inventory
        self._defaults = defaults
        # The entry's own inventory_hostname and hostvars win over the run's overrides.
        self._overrides = {
            k: v for k, v in overrides.items() if k not in ("inventory_hostname", "hostvars")
        }
        self._renderer = renderer
        self._cache: dict[str, TemplatedVars] = {}
        # The layers above and below a host's own variables, once an entry was built
        # (``values_of``).
        self._layers: tuple[Mapping[str, Any], ...] | None = None

    def __getitem__(self, name: str) -> TemplatedVars:
        if name not in self._cache:
            if name not in self._inventory.hosts:
                raise KeyError(name)
            # The layers as ``resolve`` merges them, the entry's own on top, not copied: a
            # targets file reads a few variables of every host (merged copies of 100,003 hosts'
            # variables were half the memory of planning them).
            v = self._inventory.layered_vars(name, self._defaults, self._overrides, self)
            self._cache[name] = TemplatedVars(v, self._renderer, source=f"variables of {name}")
        return self._cache[name]

    def values_of(self, name: str, keys: Sequence[str]) -> tuple[Any, ...]:
        """``self[name].get(key)`` for each of ``keys``. When none of them is a magic variable
        and each value is plain (a number, a string with no template), read from the host's
        layers as its entry would read them (the run's overrides, the host's variables, the
        defaults), without building the entry: what every host's target labels, shard key and
        scrape interval are read by (building 100,003 entries that are read once each was a
        seventh of planning them: bench/README.md), also when the entry was built (by a
        template that read it). Otherwise through the entry, which renders them."""
        if self._layers is not None and _MAGIC.isdisjoint(keys):
            host = self._inventory.hosts.get(name)
            if host is None:
                raise KeyError(name)
            # The layers, top first: the run's overrides (when any), the host's, the defaults.
            above, own, below = self._layers[0], host.vars, self._layers[-1]
            values = []
            for key in keys:
                if above is not below and key in above:
                    value = above[key]
                else:
                    value = own.get(key, _MISSING)
                    if value is _MISSING:
                        value = below.get(key)
                kind = type(value)
                if not (
                    (kind is str and "{{" not in value and "{%" not in value) or kind in PLAIN_TYPES
                ):
                    break  # a template (or a container): the entry renders it
                values.append(value)
            else:
                return tuple(values)
        entry = self[name]
        if self._layers is None:
            # The first entry built registers the defaults' secrets (Inventory.layered_vars);
            # from then on, reading the layers directly leaves nothing unregistered.
            self._layers = (
                (self._overrides, self._defaults) if self._overrides else (self._defaults,)
            )
        return tuple([entry.get(key) for key in keys])

    def __iter__(self) -> Iterator[str]:
        return iter(self._inventory.hosts)

    def __len__(self) -> int:
        return len(self._inventory.hosts)


class Planner:
    """Builds HostPlans from an inventory, plays and role content."""

    def __init__(
        self,
        inventory: Any,
        roles_path: list[Path],
        shared_templates: Path | None,
        *,
        tags: frozenset[str] = frozenset(),
        skip_tags: frozenset[str] = frozenset(),
    ) -> None:
        self.inventory = inventory
        self.roles_path = roles_path
        self.shared_templates = shared_templates
        self.tags = tags
        self.skip_tags = skip_tags
        self._roles: dict[str, Role] = {}
        self._defaults: dict[tuple[str, ...], dict[str, Any]] = {}
        self.renderer = Renderer(make_environment())
        self._groups = NamesOnly(  # group_hosts returns a fresh list: not copied again
            (name, self.inventory.group_hosts(name)) for name in self.inventory.groups
        )
        # Membership sets: a host's group_names by list search cost O(hosts) per host.
        self._group_sets = {name: set(hosts) for name, hosts in self._groups.items()}
        self._hostvars: list[
            tuple[dict[str, Any], Mapping[str, Any], dict[str, Any], LazyHostVars]
        ] = []

    def role(self, name: str) -> Role:
        if name not in self._roles:
            self._roles[name] = load_role(self.roles_path, name)
        return self._roles[name]

    def load_roles(self, plays: tuple[Play, ...]) -> None:
        """Load and structurally validate every role the plays name (no hosts needed)."""
        for play in plays:
            for r in play.roles:
                self.role(r)

    def defaults_of(self, roles: tuple[str, ...]) -> dict[str, Any]:
        """The defaults of ``roles`` merged in order (once per distinct tuple; read-only)."""
        merged = self._defaults.get(roles)
        if merged is None:
            merged = {}
            for r in roles:
                merged.update(self.role(r).defaults)
            self._defaults[roles] = merged
        return merged

    def play_defaults(self, play: Play) -> dict[str, Any]:
        """The defaults a play's tasks see: those of the play's roles (Ansible's scope with
        private_role_vars off: a play's roles share their defaults, other plays' roles do not)."""
        return self.defaults_of(play.roles)

    def variables(
        self, host: str, roles: tuple[str, ...], overrides: Mapping[str, Any] = EMPTY
    ) -> Mapping[str, Any]:
        """``host``'s variables in the scope of ``roles`` (the rule: :func:`resolve`), read-only
        (:func:`resolve_view`)."""
        return resolve_view(self.inventory, host, self.defaults_of(roles), overrides)

    def scope(
        self,
        host: str,
        roles: tuple[str, ...],
        context: Mapping[str, Any] = EMPTY,
        overrides: Mapping[str, Any] = EMPTY,
    ) -> Mapping[str, Any]:
        """What templates on ``host`` see in the scope of ``roles``: its variables, the magic
        variables, and ``context`` (per-host values the session computes: ``facts``,
        ``gpu_plan``), every value rendered when read."""
        defaults = self.defaults_of(roles)
        variables = resolve(self.inventory, host, defaults, overrides)
        variables.update(
            inventory_hostname=host,
            group_names=sorted(
                g for g, members in self._group_sets.items() if host in members and g != "all"
            ),
            groups=self._groups,
            hostvars=self.hostvars(defaults, overrides),
        )
        variables.update(context)
        return TemplatedVars(variables, self.renderer, source=f"variables of {host}")

    def hostvars(self, defaults: dict[str, Any], overrides: Mapping[str, Any]) -> LazyHostVars:
        """``hostvars``: one mapping for every host planned with these defaults and overrides, as
        Ansible has one. Each host's variables are then resolved once however many hosts read
        them, and what is computed from every host's (a sharded tier's shard assignment, the
        targets' labels: deployer/monitoring/) is computed once, not once per replica. A host's
        entry renders in its own scope, whoever reads it. The last few kept (the objects, so
        their ids are not reused), with what the overrides held: changed in place since, they
        make a new one."""
        for d, o, held, found in self._hostvars:
            if d is defaults and o is overrides and held == overrides:
                return found
        made = LazyHostVars(self.inventory, defaults, self.renderer, overrides)
        self._hostvars.insert(0, (defaults, overrides, dict(overrides), made))
        del self._hostvars[4:]
        return made

    def host_vars(
        self,
        host: str,
        play: Play,
        context: Mapping[str, Any] = EMPTY,
        overrides: Mapping[str, Any] = EMPTY,
    ) -> Mapping[str, Any]:
        """What the play's tasks on ``host`` see (:meth:`scope` of the play's roles)."""
        return self.scope(host, play.roles, context, overrides)

    def plan_host(
        self,
        host: str,
        plays: list[Play],
        context: Mapping[str, Any] = EMPTY,
        overrides: Mapping[str, Any] = EMPTY,
    ) -> HostPlan:
        """``host``'s tasks of ``plays``; ``context`` and ``overrides`` as for :meth:`scope`."""
        plan = HostPlan(host=host)
        for play in plays:
            variables = self.host_vars(host, play, context, overrides)
            tasks: list[PlannedTask] = []
            handlers: dict[str, PlannedTask] = {}
            order: list[str] = []
            for role_name in play.roles:
                role = self.role(role_name)
                for spec in role.variables:
                    self._check_variable(host, spec, variables)
                for task in role.tasks:
                    if not self._selected(task, play):
                        continue
                    tasks.extend(
                        self._expand(
                            role, task, variables, handler=False, tags=task.tags | play.tags
                        )
                    )
                for h in role.handlers:
                    planned = self._expand(role, h, variables, handler=True)
                    if planned:
                        handlers[h.name] = planned[0]
                        order.append(h.name)
            known = set(handlers)
            for t in tasks:
                for n in t.notify:
                    if n not in known:
                        raise InputError(
                            f"notifies unknown handler {n!r}",
                            source=t.source,
                            line=t.line,
                            key="notify",
                        )
            plan.plays.append(
                HostPlay(play=play, tasks=tasks, handlers=handlers, handler_order=order)
            )
        return plan

    def _check_variable(self, host: str, spec: VariableSpec, variables: Mapping[str, Any]) -> None:
        """A flag variable's value, as the host's tasks see it, in its daemon's format."""
        if spec.name not in variables:
            return
        try:
            value = variables[spec.name]
        except UndefinedVariable as exc:
            found = getattr(self.inventory.hosts.get(host), "origins", {}).get(spec.name)
            where = f"{shown_path(spec.source)}:{spec.line}, {spec.name}'s argument spec"
            if found:
                where += f"; {spec.name} is set at {found}"
            raise exc.read_by(where, source=spec.source, line=spec.line) from exc
        values = value if spec.elements and isinstance(value, list) else [value]
        if spec.elements and not isinstance(value, list):
            why = f"must be a list, got {type(value).__name__}"
        else:
            why = None
            for v in values:
                text = "" if v is None else str(v)
                if spec.allow_empty and text == "":
                    continue
                why = FORMATS[spec.format](text)
                if why is not None:
                    break
        if why is None:
            return
        found = getattr(self.inventory.hosts.get(host), "origins", {}).get(spec.name)
        where = f"set at {found}" if found else "the role default"
        flag = f" (the daemon's {spec.description})" if spec.description else ""
        raise InputError(
            mask_text(f"on host {host}: {value!r} is refused{flag}: {why}; {where}"),
            source=spec.source,
            line=spec.line,
            key=spec.name,
        )

    def _ha_peers(
        self, task: Task, scope: Mapping[str, Any], host: str
    ) -> tuple[tuple[str, str], ...]:
        """The task's HA peers (other than ``host``) with each one's readiness URL."""
        spec = task.ha_peers
        hosts = self.renderer.render_value(
            spec["hosts"], scope, task.source, task.line, "ha_peers.hosts"
        )
        if isinstance(hosts, str):
            hosts = [hosts]
        if not isinstance(hosts, (list, tuple)) or not all(isinstance(h, str) for h in hosts):
            raise InputError(
                f"ha_peers.hosts must give a list of host names, got {hosts!r}",
                source=task.source,
                line=task.line,
                key="ha_peers.hosts",
            )
        out = []
        for peer in hosts:
            if peer == host:
                continue
            if peer not in self.inventory.hosts:
                raise InputError(
                    f"HA peer {peer!r} of {host} is not in the inventory",
                    source=task.source,
                    line=task.line,
                    key="ha_peers.hosts",
                )
            url = self.renderer.render_value(
                spec["url"], ChainMap({"peer": peer}, scope), task.source, task.line, "ha_peers.url"
            )
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise InputError(
                    f"ha_peers.url must render to an http(s) URL, got {url!r}",
                    source=task.source,
                    line=task.line,
                    key="ha_peers.url",
                )
            out.append((peer, url))
        return tuple(out)

    def _selected(self, task: Task, play: Play) -> bool:
        tags = task.tags | play.tags
        if self.skip_tags and tags & self.skip_tags:
            return False
        if not self.tags:
            return True
        return bool(tags & self.tags) or ALWAYS in tags

    def _expand(
        self,
        role: Role,
        task: Task,
        variables: Mapping[str, Any],
        *,
        handler: bool,
        tags: frozenset[str] = frozenset(),
    ) -> list[PlannedTask]:
        items: list[Any] = [None]
        if task.loop is not None:
            loop = self.renderer.evaluate(task.loop, variables, task.source, task.line, "loop")
            if not isinstance(loop, (list, tuple)):
                raise InputError(
                    f"loop must give a list, got {type(loop).__name__}",
                    source=task.source,
                    line=task.line,
                    key="loop",
                )
            items = list(loop)
        out = []
        for item in items:
            scope = variables if task.loop is None else ChainMap({task.loop_var: item}, variables)
            if task.when is not None:
                cond = self.renderer.evaluate(task.when, scope, task.source, task.line, "when")
                if not isinstance(cond, bool):
                    raise InputError(
                        f"when must evaluate to true or false, got {cond!r}",
                        source=task.source,
                        line=task.line,
                        key="when",
                    )
                if not cond:
                    continue
            out.append(self._concrete(role, task, scope, item, handler, tags))
        return out

    def _concrete(
        self,
        role: Role,
        task: Task,
        scope: Mapping[str, Any],
        item: Any,
        handler: bool,
        tags: frozenset[str],
    ) -> PlannedTask:
        if task.module == META:
            return PlannedTask(
                role=role.name,
                name=task.name,
                module=None,
                args={},
                source=task.source,
                line=task.line,
            )
        module = MODULES[task.module]()
        args = self.renderer.render_value(task.args, scope, task.source, task.line, task.module)
        name = self.renderer.render_value(task.name, scope, task.source, task.line, "name")
        if task.loop is not None and "{{" not in task.name:
            name = f"{name} ({item})"
        try:
            args = module.validate(args)
            args = module.prepare(args, self._prepare_context(role, task, scope))
        except ArgError as exc:
            line = task.args.line_of(exc.key) if hasattr(task.args, "line_of") else task.line
            raise InputError(
                exc.message, source=task.source, line=line, key=f"{task.module}.{exc.key}"
            ) from exc
        return PlannedTask(
            role=role.name,
            name=str(name),
            module=module,
            args=args,
            source=task.source,
            line=task.line,
            notify=task.notify,
            secret_args=frozenset(module.secret_args(args)),
            handler=handler,
            tags=tags,
            ha_peers=(
                self._ha_peers(task, scope, str(scope["inventory_hostname"]))
                if task.ha_peers is not None
                else ()
            ),
        )

    def _prepare_context(self, role: Role, task: Task, scope: Mapping[str, Any]) -> PrepareContext:
        def find_file(kind: str, relative: str) -> str:
            found = role.find(kind, relative, self.shared_templates)
            if found is None:
                raise InputError(
                    f"{kind[:-1]} {relative!r} not found in role {role.name} ({role.path / kind})",
                    source=task.source,
                    line=task.line,
                    key="src",
                )
            return str(found)

        def render_template(path: str) -> str:
            return self.renderer.render_file(path, scope)

        return PrepareContext(find_file=find_file, render_template=render_template)
