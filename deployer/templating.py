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

from deployer import file_sd, remote_write
from deployer.errors import InputError

_WHOLE_EXPR = re.compile(r"^\{\{(?P<expr>(?:(?!\}\}).)*)\}\}\Z", re.S)


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


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"yes", "true", "on", "1"}
    return bool(value)


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
        bool=_to_bool,
        quote=lambda v: shlex.quote(str(v)),
        regex_replace=_regex_replace,
        mandatory=_mandatory,
        basename=lambda p: str(p).rsplit("/", 1)[-1],
        dirname=lambda p: str(p).rsplit("/", 1)[0] if "/" in str(p) else "",
    )
    # The prometheus role's targets files (file_sd.json.j2) come from deployer/file_sd.py itself.
    env.globals["file_sd_targets_file"] = jinja2.pass_context(
        lambda context, job: file_sd.targets_file(context.parent, job)
    )
    # Its remote_write section (prometheus.yml.j2) from deployer/remote_write.py.
    env.globals["remote_write_section"] = jinja2.pass_context(
        lambda context: remote_write.remote_write_section(context.parent)
    )
    return env


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
        # compiling is most of the cost of rendering (1,600 tasks on 200 hosts: 2.4 s -> 0.1 s).
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
        except (jinja2.UndefinedError, jinja2.TemplateError, TypeError, ValueError) as exc:
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
        expression's native type (a list stays a list), as in Ansible."""
        if isinstance(value, str):
            if "{{" not in value and "{%" not in value:
                return value
            whole = _WHOLE_EXPR.match(value)
            try:
                if whole:
                    return self._eval(whole.group("expr"), variables)
                return self._render(self._from_string(value), variables)
            except jinja2.TemplateError as exc:
                raise InputError(
                    f"cannot render {value!r}: {exc}", source=source, line=line, key=key
                ) from exc
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise InputError(
                    f"cannot render {value!r}: {exc}", source=source, line=line, key=key
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
        except jinja2.TemplateError as exc:
            raise InputError(
                f"cannot evaluate {expression!r}: {exc}", source=source, line=line, key=key
            ) from exc
        except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:
            raise InputError(
                f"cannot evaluate {expression!r}: {exc}", source=source, line=line, key=key
            ) from exc


def _line_of(mapping: Any, key: Any, default: int | None) -> int | None:
    line_of = getattr(mapping, "line_of", None)
    return line_of(key) if line_of else default


def _defined(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return value


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(_has_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_template(v) for v in value)
    return False


class TemplatedVars(Mapping[str, Any]):
    """Variables whose values may themselves hold templates (a role default built from other
    variables), rendered on first use, as Ansible does; a variable that refers to itself is an
    error rather than a hang."""

    def __init__(
        self, raw: Mapping[str, Any], renderer: Renderer, source: str = "variables"
    ) -> None:
        self._raw = raw
        self._renderer = renderer
        self._source = source
        self._cache: dict[str, Any] = {}
        self._resolving: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        value = self._raw[key]
        if getattr(value, "renders_itself", False):
            pass  # hostvars: each host's variables render in that host's own scope
        elif isinstance(value, Mapping) and not isinstance(value, dict):
            # groups and other lazy mappings: render entry by entry when used (RenderedOnUse).
            value = RenderedOnUse(value, self, self._renderer, self._source, key)
        elif _has_template(value):
            if key in self._resolving:
                raise jinja2.UndefinedError(f"variable {key!r} refers to itself")
            self._resolving.add(key)
            try:
                value = self._renderer.render_value(value, self, self._source, None, key)
            finally:
                self._resolving.discard(key)
        self._cache[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


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
