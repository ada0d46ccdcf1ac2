"""Jinja2 rendering with strict undefined: template files, task arguments and ``when`` expressions.

Every failure becomes an InputError naming the template (or role file) and line, raised at plan
time, before any host is contacted.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import ChainMap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2 import StrictUndefined

from deployer import alertmanager_config, dcgm_fields, rule_pack
from deployer.booleans import truthy
from deployer.errors import InputError
from deployer.monitoring import federation, file_sd, remote_write
from deployer.secrets import MASK, is_secret_path
from deployer.unsafe import UnsafeText


def _tls_material() -> Any:
    from deployer.tls import material

    return material


_WHOLE_EXPR = re.compile(r"^\{\{(?P<expr>(?:(?!\}\}).)*)\}\}\Z", re.S)
_UNDEFINED_NAME = re.compile(r"^'(?P<name>[A-Za-z_][A-Za-z0-9_]*)' is undefined$")
_NO_ATTRIBUTE = re.compile(r"^'(?P<obj>[^']*)' (?:object )?has no attribute '(?P<attr>[^']+)'$")
_ROOT = Path(__file__).resolve().parent.parent


class UndefinedVariable(InputError):
    """A variable (or a key of one) that a role file or a variable's value reads and the host
    does not have: the message names the host, the variable, where it is read and where to set
    it, as one sentence (``source``/``line``/``key`` keep the parts for callers)."""

    def __init__(
        self,
        what: str,
        fix: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(f"{what}; {fix}" if fix else what, source=source, line=line, key=key)
        self.what, self.fix = what, fix

    def read_by(self, where: str, *, source: str, line: int | None) -> UndefinedVariable:
        """The same error, saying also where the value that failed is read."""
        return UndefinedVariable(
            f"{self.what} (that value is read by {where})",
            self.fix,
            source=source,
            line=line,
            key=self.key,
        )

    def __str__(self) -> str:
        return self.message


def shown_path(path: str) -> str:
    """A role file as the user finds it: relative to the product's directory when it is one of
    the product's, else as given."""
    try:
        return str(Path(path).resolve().relative_to(_ROOT))
    except ValueError:
        return path


def _host_of(variables: Mapping[str, Any]) -> str | None:
    try:
        host = variables["inventory_hostname"]
    except (KeyError, jinja2.UndefinedError, InputError):
        return None
    return str(host)


def undefined_error(
    exc: jinja2.UndefinedError,
    variables: Mapping[str, Any],
    where: str,
    *,
    source: str | None,
    line: int | None,
) -> UndefinedVariable:
    """``exc`` (Jinja's "'x' is undefined" or "... has no attribute 'k'") as the error a user can
    act on: "host H: variable x is undefined (read by WHERE); set it in ..."."""
    host = _host_of(variables)
    who = f"host {host}: " if host else ""
    text = str(exc)
    name = _UNDEFINED_NAME.match(text)
    attr = _NO_ATTRIBUTE.match(text)
    if name:
        var = name.group("name")
        fix = (
            f"set it for {host if host else 'the host'} in the inventory (host_vars/"
            f"{host or 'HOST'}.yml, or group_vars/GROUP.yml of one of its groups) or with "
            f"-e {var}=..."
        )
        what = f"{who}variable {var} is undefined (read by {where})"
        key: str | None = var
    elif attr:
        part = attr.group("attr")
        what = (
            f"{who}a variable read by {where} has no key or attribute {part!r} "
            f"(it is a {attr.group('obj')})"
        )
        fix = f"add {part} to that variable where it is set"
        key = part
    else:
        what, fix, key = f"{who}{text} (read by {where})", "", None
    return UndefinedVariable(what, fix, source=source, line=line, key=key)


def _to_yaml(value: Any, indent: int = 2) -> str:
    return yaml.safe_dump(_plain(value), default_flow_style=False, sort_keys=False, indent=indent)


def _to_json(value: Any, indent: int | None = None) -> str:
    return json.dumps(_plain(value), indent=indent, sort_keys=indent is not None)


def _plain(value: Any) -> Any:
    """Plain dict/list copies (YAML SourceDicts and Mappings dump as ordinary mappings)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _regex_replace(value: str, pattern: str, replacement: str = "") -> str:
    return re.sub(pattern, replacement, str(value))


def _mandatory(value: Any, msg: str | None = None) -> Any:
    if isinstance(value, jinja2.Undefined):
        raise jinja2.UndefinedError(msg or "mandatory variable is not defined")
    return value


def make_environment(search_path: list[Path] | None = None) -> jinja2.Environment:
    """The one Jinja environment the engine uses (see the contracts in the README)."""
    env = jinja2.Environment(
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        loader=jinja2.FileSystemLoader([str(p) for p in search_path or []]),
        autoescape=False,
    )
    env.filters.update(
        to_yaml=_to_yaml,
        to_nice_yaml=_to_yaml,
        to_json=_to_json,
        to_nice_json=lambda v: _to_json(v, indent=2),
        bool=truthy,
        quote=lambda v: shlex.quote(str(v)),
        regex_replace=_regex_replace,
        mandatory=_mandatory,
        basename=lambda p: str(p).rsplit("/", 1)[-1],
        dirname=lambda p: str(p).rsplit("/", 1)[0] if "/" in str(p) else "",
    )
    # The prometheus role's targets files (file_sd.json.j2) come from deployer/monitoring/file_sd.py itself.
    env.globals["file_sd_targets_file"] = jinja2.pass_context(
        lambda context, job: file_sd.targets_file(context.parent, job)
    )
    # The replica's default cluster: the one the hosts it scrapes name (deployer/monitoring/file_sd.py).
    env.globals["file_sd_common_cluster"] = jinja2.pass_context(
        lambda context, fallback: file_sd.common_cluster(context.parent, fallback)
    )
    # The replicas of this replica's shard (or of the global pair): the restart handler's HA
    # peers (deployer/monitoring/shards.py, deployer/monitoring/federation.py).
    env.globals["prometheus_shard_peers"] = jinja2.pass_context(
        lambda context: federation.peers(context.parent)
    )
    # The federation tier: whether this replica is of the global pair, and its federate job.
    env.globals["federation_is_global"] = jinja2.pass_context(
        lambda context: federation.is_global(context.parent)
    )
    env.globals["federation_scrape_configs"] = jinja2.pass_context(
        lambda context, tls, tls_dir: federation.scrape_configs(context.parent, tls, tls_dir)
    )
    # The rule pack: DCGM metric names from the field registry (a rename is one edit there),
    # model facts and PromQL helpers (deployer/rule_pack.py), and the dcgm job's relabelling of
    # older exporters' field names onto the stored metric names.
    env.globals["dcgm_metric"] = dcgm_fields.METRICS
    env.globals["gpumon_rule_pack"] = rule_pack.template_values()
    env.globals["dcgm_metric_relabel_configs"] = dcgm_fields.metric_relabel_configs
    env.filters["promql_names_regex"] = rule_pack.promql_names_regex
    # alertmanager.yml as a document computed in Python (deployer/alertmanager_config.py).
    env.globals["alertmanager_config_document"] = jinja2.pass_context(
        lambda context: alertmanager_config.document(context.parent)
    )
    # The grafana role: secrets generated on the controller (deployer/controller_secrets.py)
    # and the dashboards and provisioning computed in Python (deployer/monitoring/dashboards/).
    env.globals["controller_secret"] = _controller_secret
    env.globals["gpumon_default_secrets_dir"] = _default_secrets_dir
    # TLS and basic auth of the tier (gpumon_tls; deployer/tls/material.py): this host's
    # certificate, key, CA, credentials and web config, from the cluster's CA on the controller.
    # Imported when a template first calls them: cryptography's x509 is a tenth of every
    # command's start-up (bench/README.md, "Round two"), and a run without TLS never needs it.
    env.globals["gpumon_tls_material"] = jinja2.pass_context(
        lambda context: _tls_material().host_tls(context.parent)
    )
    env.globals["gpumon_web_config"] = lambda *a, **k: _tls_material().web_config(*a, **k)
    env.globals["version_at_least"] = _version_at_least
    # The dashboards read other roles' variables as a host sees them, rendered by this layer.
    renderer = Renderer(env)

    def view(context: jinja2.runtime.Context) -> RoleScopes:
        return RoleScopes(context.parent, renderer)

    env.globals["grafana_dashboard_uids"] = jinja2.pass_context(
        lambda context: _dashboards().dashboard_uids(view(context))
    )
    env.globals["grafana_dashboard_uids_retired"] = jinja2.pass_context(
        lambda context: _dashboards().retired_uids(view(context))
    )
    env.globals["grafana_dashboard_json"] = jinja2.pass_context(
        lambda context, uid: _dashboards().dashboard_json(view(context), uid)
    )
    env.globals["grafana_provisioning"] = jinja2.pass_context(
        lambda context, kind: _dashboards().provisioning_document(view(context), kind)
    )
    # The prometheus role's remote_write section (prometheus.yml.j2), from deployer/monitoring/remote_write.py.
    env.globals["remote_write_section"] = jinja2.pass_context(
        lambda context: remote_write.remote_write_section(context.parent)
    )
    return env


def _version_at_least(version: Any, minimum: str) -> bool:
    """``version`` (``1.5.0``, ``v0.25.0``, ``1.5.0-1+b2``) is ``minimum`` or later; a version
    that is not dotted numbers counts as later (a site's own build)."""

    def parts(v: Any) -> tuple[int, ...] | None:
        m = re.match(r"^v?(\d+(?:\.\d+)*)", str(v).strip())
        return tuple(int(x) for x in m.group(1).split(".")) if m else None

    have, want = parts(version), parts(minimum)
    return have is None or want is None or have >= want


def _controller_secret(path: str) -> str:
    from deployer.controller_secrets import controller_secret

    return controller_secret(path)


def _default_secrets_dir() -> str:
    from deployer.controller_secrets import default_dir

    return default_dir()


def _dashboards() -> Any:
    # Imported on use: the SDK is only needed where a grafana host is planned.
    from deployer.monitoring import dashboards

    return dashboards


def _template_line(exc: BaseException, filename: str, template: Any = None) -> int | None:
    """The template line where a render-time error was raised (from the traceback; the compiled
    code's line numbers are mapped back to the template's)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
            if template is not None:
                line = template.get_corresponding_lineno(line)
        tb = tb.tb_next
    return line


class Renderer:
    """Renders strings, values and template files against one set of variables."""

    def __init__(self, env: jinja2.Environment) -> None:
        self.env = env
        self._file_cache: dict[str, jinja2.Template] = {}
        # Compiled once per distinct source: a site renders the same strings for every host, and
        # compiling is most of the cost of rendering (bench/README.md).
        self._string_cache: dict[str, jinja2.Template] = {}
        self._expression_cache: dict[str, jinja2.Template] = {}

    def render_file(self, path: str | Path, variables: Mapping[str, Any]) -> str:
        path = str(path)
        template = self._file_cache.get(path)
        try:
            if template is None:
                source = Path(path).read_text(encoding="utf-8")
                # Compiled with the path as filename so tracebacks (and our line numbers) name it.
                code = self.env.compile(source, filename=path)
                template = self.env.template_class.from_code(self.env, code, self.env.globals, None)
                self._file_cache[path] = template
            return self._render(template, variables)
        except jinja2.TemplateSyntaxError as exc:
            raise InputError(
                f"template syntax error: {exc.message}", source=path, line=exc.lineno
            ) from exc
        except jinja2.UndefinedError as exc:
            line = _template_line(exc, path, template)
            where = shown_path(path) + (f":{line}" if line is not None else "")
            raise undefined_error(exc, variables, where, source=path, line=line) from exc
        except UndefinedVariable as exc:
            # A variable's value read by this template failed: say where the template reads it.
            if exc.source is not None:
                raise
            line = _template_line(exc, path, template)
            where = shown_path(path) + (f":{line}" if line is not None else "")
            raise exc.read_by(where, source=path, line=line) from exc
        except KeyError as exc:
            # The product's Python that a template calls (file_sd, remote_write, ...) read a
            # variable, or a key of one, the host does not have.
            line = _template_line(exc, path, template)
            where = shown_path(path) + (f":{line}" if line is not None else "")
            raise _missing_key(exc, variables, where, source=path, line=line) from exc
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            re.error,
        ) as exc:
            raise InputError(
                f"template error: {exc}", source=path, line=_template_line(exc, path, template)
            ) from exc
        except OSError as exc:
            raise InputError(f"cannot read template: {exc}", source=path) from exc

    def _context(self, template: jinja2.Template, variables: Mapping[str, Any]) -> Any:
        # shared=True hands the mapping to Jinja as is (no dict() copy), so TemplatedVars stay lazy.
        return template.new_context(ChainMap(variables, self.env.globals), shared=True)  # type: ignore[arg-type]

    def _render(self, template: jinja2.Template, variables: Mapping[str, Any]) -> str:
        return self.env.concat(template.root_render_func(self._context(template, variables)))  # type: ignore[attr-defined]

    def _from_string(self, source: str) -> jinja2.Template:
        template = self._string_cache.get(source)
        if template is None:
            template = self._string_cache[source] = self.env.from_string(source)
        return template

    def _eval(self, expression: str, variables: Mapping[str, Any]) -> Any:
        template = self._expression_cache.get(expression)
        if template is None:
            compiled = self.env.compile_expression(expression, undefined_to_none=False)
            template = self._expression_cache[expression] = compiled._template
        ctx = self._context(template, variables)
        for _ in template.root_render_func(ctx):
            pass
        return _defined(ctx.vars["result"])

    def render_value(
        self, value: Any, variables: Mapping[str, Any], source: str, line: int | None, key: str
    ) -> Any:
        """Render every string inside ``value``. A string that is one ``{{ expr }}`` keeps the
        expression's native type (a list stays a list), as in Ansible; ``!unsafe`` text is
        never rendered."""
        if isinstance(value, str):
            if ("{{" not in value and "{%" not in value) or isinstance(value, UnsafeText):
                return value
            whole = _WHOLE_EXPR.match(value)
            try:
                if whole:
                    return self._eval(whole.group("expr"), variables)
                return self._render(self._from_string(value), variables)
            except jinja2.UndefinedError as exc:
                own = source is None or source.startswith("variables of")
                if line is not None and "\n" in value:
                    # A block scalar: its text starts on the line after its key.
                    inner = _template_line(exc, "<template>", self._string_cache.get(value))
                    line += inner or 0
                raise undefined_error(
                    exc,
                    variables,
                    _read_by(source, line, key),
                    source=None if own else source,
                    line=None if own else line,
                ) from exc
            except UndefinedVariable as exc:
                # A variable's value read by this task failed: say where the task reads it.
                if exc.source is not None or source is None or source.startswith("variables of"):
                    raise
                raise exc.read_by(_read_by(source, line, key), source=source, line=line) from exc
            except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, re.error) as exc:
                raise InputError(
                    f"cannot render {_shown(value, key)}: {exc}", source=source, line=line, key=key
                ) from exc
        if isinstance(value, Mapping):
            return {
                k: self.render_value(v, variables, source, _line_of(value, k, line), f"{key}.{k}")
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [
                self.render_value(v, variables, source, line, f"{key}[{i}]")
                for i, v in enumerate(value)
            ]
        return value

    def evaluate(
        self, expression: Any, variables: Mapping[str, Any], source: str, line: int | None, key: str
    ) -> Any:
        """Evaluate a bare Jinja expression (``when``, ``loop`` given as a string)."""
        if not isinstance(expression, str):
            return expression
        text = expression.strip()
        whole = _WHOLE_EXPR.match(text)  # "{{ x }}" is accepted where a bare expression is meant
        if whole:
            text = whole.group("expr")
        try:
            return self._eval(text, variables)
        except jinja2.UndefinedError as exc:
            raise undefined_error(
                exc, variables, _read_by(source, line, key), source=source, line=line
            ) from exc
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            ArithmeticError,
            AttributeError,
            re.error,
        ) as exc:
            raise InputError(
                f"cannot evaluate {_shown(expression, key)}: {exc}",
                source=source,
                line=line,
                key=key,
            ) from exc


def _python_frame(exc: BaseException) -> str | None:
    """The innermost frame of the product's own Python (not this module, not Jinja) in ``exc``'s
    traceback, as ``deployer/...py:LINE``."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith(str(_ROOT / "deployer")) and not name.endswith("templating.py"):
            found = f"{shown_path(name)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _missing_key(
    exc: KeyError, variables: Mapping[str, Any], where: str, *, source: str, line: int | None
) -> UndefinedVariable:
    host = _host_of(variables)
    who = f"host {host}: " if host else ""
    key = str(exc.args[0]) if exc.args else "?"
    by = _python_frame(exc)
    read = f"{by}, called from {where}" if by else where
    return UndefinedVariable(
        f"{who}{key!r} is missing: a variable, or a key of a mapping variable (read by {read})",
        f"set it (or add the key to the variable) in the inventory for {host or 'the host'}, "
        "or with -e",
        source=source,
        line=line,
        key=key,
    )


def _read_by(source: str | None, line: int | None, key: str) -> str:
    """Where a value is read: a role file's line and the task key, or (a variable's own value,
    rendered on use) the variable."""
    if source is None or source.startswith("variables of"):
        return f"the value of {key}"
    return f"{shown_path(source)}{f':{line}' if line is not None else ''} ({key})"


_MISSING = object()


class NamesOnly(dict):  # type: ignore[type-arg]
    """A dict its maker vouches holds no template: the inventory's group members, whose host
    and group names cannot hold ``{{`` or ``{%`` (deployer/inventory/names.py). Read as it is,
    never scanned (scanning every name of 100,000 hosts' groups was a tenth of a targets file)."""


# Values read as they are, nothing to render (also by plan.LazyHostVars.values_of).
PLAIN_TYPES = frozenset({int, float, bool, type(None), NamesOnly})


def _shown(value: str, key: str) -> str:
    """``value`` as an error repeats it: masked whole under a secret key (a literal password
    with a stray ``{{`` is still the password)."""
    return repr(MASK) if is_secret_path(key) else repr(value)


def _line_of(mapping: Any, key: Any, default: int | None) -> int | None:
    line_of = getattr(mapping, "line_of", None)
    return line_of(key) if line_of else default


def _defined(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return value


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return ("{{" in value or "{%" in value) and not isinstance(value, UnsafeText)
    if isinstance(value, Mapping):
        return any(_has_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_template(v) for v in value)
    return False


class TemplatedVars(Mapping[str, Any]):
    """Variables whose values may themselves hold templates (a role default built from other
    variables), rendered on first use, as Ansible does; a variable that refers to itself is an
    error rather than a hang."""

    # A run keeps one per host it reads ``hostvars`` of (every host, for a targets file).
    __slots__ = ("_cache", "_raw", "_renderer", "_resolving", "_source")

    def __init__(
        self, raw: Mapping[str, Any], renderer: Renderer, source: str = "variables"
    ) -> None:
        self._raw = raw
        self._renderer = renderer
        self._source = source
        self._cache: dict[str, Any] = {}
        self._resolving: set[str] | None = None  # made when a template is first rendered

    def __getitem__(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        return self._resolved(key, self._raw[key])

    def _resolved(self, key: str, value: Any) -> Any:
        """``value`` (the raw variable ``key``) rendered, and remembered."""
        kind = type(value)
        if (kind is str and "{{" not in value and "{%" not in value) or kind in PLAIN_TYPES:
            return value  # nothing to render (the common case, checked first), nothing kept
        if getattr(value, "renders_itself", False):
            pass  # hostvars: each host's variables render in that host's own scope
        elif isinstance(value, Mapping) and not isinstance(value, dict):
            # groups and other lazy mappings: render entry by entry when used (RenderedOnUse).
            value = RenderedOnUse(value, self, self._renderer, self._source, key)
        elif _has_template(value):
            if self._resolving is None:
                self._resolving = set()
            if key in self._resolving:
                raise jinja2.UndefinedError(f"variable {key!r} refers to itself")
            self._resolving.add(key)
            try:
                value = self._renderer.render_value(value, self, self._source, None, key)
            finally:
                self._resolving.discard(key)
        self._cache[key] = value
        return value

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._cache:
            return self._cache[key]
        value = self._raw.get(key, _MISSING)  # no KeyError raised and caught per missing name
        if value is _MISSING:
            return default
        kind = type(value)
        if (kind is str and "{{" not in value and "{%" not in value) or kind in PLAIN_TYPES:
            return value  # as _resolved returns it, without the call (a targets file's labels)
        return self._resolved(key, value)

    def sibling(self, raw: Mapping[str, Any], source: str) -> TemplatedVars:
        """Other variables rendered as these are (the same renderer): another role's variables
        as a host sees them (the grafana role reads the prometheus role's)."""
        return TemplatedVars(raw, self._renderer, source=source)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


class RoleScopes(Mapping[str, Any]):
    """A template's variables, and ``sibling``: other variables (another role's, as this host
    sees them) rendered the same way, lazily. What the dashboards are computed from
    (``deployer/monitoring/dashboards/scope.py`` ``role_scope``), without importing this layer."""

    def __init__(self, variables: Mapping[str, Any], renderer: Renderer) -> None:
        self._variables = variables
        self._renderer = renderer

    def sibling(self, raw: Mapping[str, Any], source: str) -> TemplatedVars:
        return TemplatedVars(raw, self._renderer, source=source)

    def __getitem__(self, key: str) -> Any:
        return self._variables[key]

    def __contains__(self, key: object) -> bool:
        return key in self._variables

    def __iter__(self) -> Iterator[str]:
        return iter(self._variables)

    def __len__(self) -> int:
        return len(self._variables)


class RenderedOnUse(Mapping[str, Any]):
    """A lazy mapping variable (``hostvars``, ``groups``) whose entries are rendered, against
    the variables it was looked up in, only when a template uses them.

    Rendering it whole on first use (every host's every variable, to read one address) made one
    host's plan cost O(hosts x variables) and a 1,000-host file_sd template 15 s. An entry that is
    itself a mapping is rendered on use the same way.
    """

    def __init__(
        self,
        raw: Mapping[str, Any],
        variables: Mapping[str, Any],
        renderer: Renderer,
        source: str,
        key: str,
    ) -> None:
        self._raw = raw
        self._variables = variables
        self._renderer = renderer
        self._source = source
        self._key = key
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self._cache:
            return self._cache[name]
        value = self._raw[name]
        key = f"{self._key}.{name}"
        if getattr(value, "renders_itself", False):
            pass
        elif isinstance(value, Mapping):
            value = RenderedOnUse(value, self._variables, self._renderer, self._source, key)
        elif _has_template(value):
            value = self._renderer.render_value(value, self._variables, self._source, None, key)
        self._cache[name] = value
        return value

    def __contains__(self, name: object) -> bool:
        return name in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"RenderedOnUse({self._key})"
