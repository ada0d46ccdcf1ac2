"""Each host's SSH connection settings from its Ansible connection variables (``ansible_host``,
``ansible_port``, ``ansible_user``, their ``ansible_ssh_*`` aliases, ``ansible_become``, …) and
gpumon's host-key policy. Connection variables may be templates, as in Ansible."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Mapping
from typing import Any

import jinja2

from deployer.errors import InputError
from deployer.inventory.model import ConnectionSpec
from deployer.unsafe import is_unsafe

HOST_KEY_POLICIES = ("verify", "accept-new")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_ANSIBLE_TRUE = frozenset({"y", "yes", "on", "1", "true", "t"})
_ANSIBLE_FALSE = frozenset({"n", "no", "off", "0", "false", "f"})


def _as_bool(value: Any, key: str, origin: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _ANSIBLE_TRUE | _ANSIBLE_FALSE:
        return value.strip().lower() in _ANSIBLE_TRUE
    raise _var_error(f"must be a boolean (true/false, yes/no), got {value!r}", key, origin)


def _var_error(message: str, key: str, origin: str | None) -> InputError:
    source, line = None, None
    if origin:
        source, _, tail = origin.rpartition(":")
        if source and tail.isdigit():
            line = int(tail)
        else:
            source = origin
    return InputError(message, source=source, line=line, key=key)


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


def connection_spec(
    name: str,
    variables: Mapping[str, Any],
    origins: Mapping[str, str],
    expand_user: Callable[[str], str] = os.path.expanduser,
) -> ConnectionSpec:
    def pick(*keys: str) -> tuple[str | None, Any]:
        # Ansible reads the aliases in order; the last one present wins.
        chosen: tuple[str | None, Any] = (None, None)
        for key in keys:
            if key in variables and variables[key] is not None:
                chosen = (key, variables[key])
        return chosen

    def text(key: str | None, value: Any) -> str | None:
        if key is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _var_error(f"must be a string, got {value!r}", key, origins.get(key))
        value = str(value).strip()
        if not value:
            raise _var_error("must not be empty", key, origins.get(key))
        return value

    address = text(*pick("ansible_ssh_host", "ansible_host")) or name

    port_key, port_value = pick("ansible_ssh_port", "ansible_port")
    port = 22
    if port_key is not None:
        if isinstance(port_value, str) and port_value.strip().isdigit():
            port_value = int(port_value)
        if isinstance(port_value, bool) or not isinstance(port_value, int):
            raise _var_error(
                f"must be an integer port, got {port_value!r}", port_key, origins.get(port_key)
            )
        if not 1 <= port_value <= 65535:
            raise _var_error(
                f"port {port_value} out of range 1-65535", port_key, origins.get(port_key)
            )
        port = port_value

    user = text(*pick("ansible_ssh_user", "ansible_user")) or _local_user()
    key_file = text(*pick("ansible_private_key_file", "ansible_ssh_private_key_file"))
    become_key, become_value = pick("ansible_become")
    become = (
        _as_bool(become_value, become_key, origins.get(become_key, "")) if become_key else False
    )
    become_user = text(*pick("ansible_become_user")) or "root"
    known_hosts = text(*pick("gpumon_known_hosts_file")) or DEFAULT_KNOWN_HOSTS
    policy_key, policy = pick("gpumon_host_key_policy")
    if policy_key is None:
        policy = "verify"
    elif policy not in HOST_KEY_POLICIES:
        raise _var_error(
            f"must be one of {', '.join(HOST_KEY_POLICIES)}, got {policy!r}",
            policy_key,
            origins.get(policy_key),
        )
    return ConnectionSpec(
        name=name,
        address=address,
        port=port,
        user=user,
        private_key_file=expand_user(key_file) if key_file else None,
        become=become,
        become_user=become_user,
        known_hosts_file=expand_user(known_hosts),
        host_key_policy=policy,
    )


_CONNECTION_VARS = (
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_become",
    "ansible_become_user",
    "gpumon_known_hosts_file",
    "gpumon_host_key_policy",
)


# Built once (an Environment per host was 5% of loading 100,000 hosts); it holds no per-host state.
_CONNECTION_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def render_connection_vars(
    variables: dict[str, Any],
    context: Callable[[], dict[str, Any]],
    origins: Mapping[str, str],
) -> dict[str, Any]:
    """Connection variables may be templates (``"{{ inventory_hostname }}.mgmt"``) as in Ansible;
    ``context()`` gives the magic variables, built only for a host that has such a template."""
    rendered = variables
    for key in _CONNECTION_VARS:
        value = variables.get(key)
        if isinstance(value, str) and ("{{" in value or "{%" in value) and not is_unsafe(value):
            if rendered is variables:
                rendered = dict(variables)
                scope = {**variables, **context()}
            try:
                rendered[key] = _CONNECTION_ENV.from_string(value).render(scope)
            except jinja2.TemplateError as exc:
                raise _var_error(f"cannot render {value!r}: {exc}", key, origins.get(key)) from None
    return rendered
