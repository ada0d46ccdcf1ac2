"""Each host's SSH connection settings from its Ansible connection variables (``ansible_host``,
``ansible_port``, ``ansible_user``, their ``ansible_ssh_*`` aliases, ``ansible_become``, …) and
gpumon's host-key policy. Connection variables may be templates, as in Ansible."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Hashable, Mapping
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


def _pick(variables: Mapping[str, Any], *keys: str) -> tuple[str | None, Any]:
    """(key, value) of the last of ``keys`` set (not None): Ansible reads the aliases in order,
    the last one present wins. ``keys`` go in the order of the ``vars:`` of ansible-core's ssh
    connection plugin (plugins/connection/ssh.py), which lists each ``ansible_ssh_`` alias after
    its plain name: where both are set, whatever layer each comes from, the alias wins
    (tests/parity: ansible-core's own ``set_options``/``get_option`` on every inventory)."""
    chosen: tuple[str | None, Any] = (None, None)
    for key in keys:
        value = variables.get(key)
        if value is not None:
            chosen = (key, value)
    return chosen


def _text(key: str | None, value: Any, origins: Mapping[str, str]) -> str | None:
    if key is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _var_error(f"must be a string, got {value!r}", key, origins.get(key))
    value = str(value).strip()
    if not value:
        raise _var_error("must not be empty", key, origins.get(key))
    return value


def _address(name: str, variables: Mapping[str, Any], origins: Mapping[str, str]) -> str:
    return _text(*_pick(variables, "ansible_host", "ansible_ssh_host"), origins) or name


def connection_spec(
    name: str,
    variables: Mapping[str, Any],
    origins: Mapping[str, str],
    expand_user: Callable[[str], str] = os.path.expanduser,
) -> ConnectionSpec:
    def pick(*keys: str) -> tuple[str | None, Any]:
        return _pick(variables, *keys)

    def text(key: str | None, value: Any) -> str | None:
        return _text(key, value, origins)

    address = _address(name, variables, origins)

    port_key, port_value = pick("ansible_port", "ansible_ssh_port")
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

    user = text(*pick("ansible_user", "ansible_ssh_user")) or _local_user()
    key_file = text(*pick("ansible_private_key_file", "ansible_ssh_private_key_file"))
    become_key, become_value = pick("ansible_become")
    become = (
        _as_bool(become_value, become_key, origins.get(become_key, "")) if become_key else False
    )
    # the sudo become plugin's vars: ansible_become_user, then its ansible_sudo_user alias
    become_user = text(*pick("ansible_become_user", "ansible_sudo_user")) or "root"
    method_key, method = pick("ansible_become_method")
    if become and method_key is not None and method != "sudo":
        raise _var_error(
            f"become method {method!r} is not supported: gpumon-deploy becomes another user with "
            "'sudo -n' only (give the user passwordless sudo, or connect as root)",
            method_key,
            origins.get(method_key),
        )
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


class ConnectionSpecs:
    """:func:`connection_spec` for every host of a load. Hosts whose connection variables other
    than the address are equal, with equal types (a fleet's hosts share their user, port, key
    and host-key policy), share one reading of them; each host's address is read on its own.
    A host with a bad value raises as :func:`connection_spec` does, naming its origin."""

    def __init__(self, expand_user: Callable[[str], str] = os.path.expanduser) -> None:
        self._expand_user = expand_user
        self._shared: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._by_caller: dict[Hashable, dict[str, Any]] = {}

    def spec(
        self,
        name: str,
        variables: Mapping[str, Any],
        origins: Mapping[str, str],
        same_as: Hashable | None = None,
    ) -> ConnectionSpec:
        """``same_as``: a key the caller knows stands for the shared variables' values (the
        hosts of one set of groups whose own variables set none of them), so that they are
        looked up once for it rather than read again for each host."""
        shared = self._by_caller.get(same_as) if same_as is not None else None
        if shared is None:
            values = tuple([variables.get(key) for key in _SHARED_CONNECTION_VARS])
            key = (values, tuple(map(type, values)))
            try:
                shared = self._shared.get(key)
            except TypeError:  # an unhashable value (a list where a user belongs): read alone
                return connection_spec(name, variables, origins, self._expand_user)
            first = None
            if shared is None:
                first = connection_spec(name, variables, origins, self._expand_user)
                shared = self._shared[key] = {
                    k: v for k, v in vars(first).items() if k not in ("name", "address")
                }
            if same_as is not None:
                self._by_caller[same_as] = shared
            if first is not None:
                return first
        # The frozen dataclass filled without its per-field __init__ (the shared fields were
        # checked when first read): a fifth of loading 100,000 hosts went to reading them.
        spec = object.__new__(ConnectionSpec)
        fields = spec.__dict__
        fields["name"] = name
        fields["address"] = _address(name, variables, origins)
        fields.update(shared)
        return spec


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
    "ansible_sudo_user",
    "ansible_become_method",
    "gpumon_known_hosts_file",
    "gpumon_host_key_policy",
)
_CONNECTION_VAR_NAMES = frozenset(_CONNECTION_VARS)
_SHARED_CONNECTION_VARS = tuple(
    k for k in _CONNECTION_VARS if k not in ("ansible_host", "ansible_ssh_host")
)
_SHARED_CONNECTION_VAR_NAMES = frozenset(_SHARED_CONNECTION_VARS)


# Built once (an Environment per host was 5% of loading 100,000 hosts); it holds no per-host state.
_CONNECTION_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def sets_shared_connection_vars(values: Mapping[str, Any]) -> bool:
    """Whether ``values`` set a connection variable other than the address (the ones hosts
    share in :class:`ConnectionSpecs`)."""
    return not _SHARED_CONNECTION_VAR_NAMES.isdisjoint(values)


def has_connection_template(values: Mapping[str, Any]) -> bool:
    """Whether a connection variable among ``values`` is a template
    (:func:`render_connection_vars` renders it), judged by ``values``' own few keys."""
    return any(key in _CONNECTION_VAR_NAMES and _is_template(v) for key, v in values.items())


def _is_template(value: Any) -> bool:
    """A connection variable's value that :func:`render_connection_vars` renders."""
    return isinstance(value, str) and ("{{" in value or "{%" in value) and not is_unsafe(value)


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
        if _is_template(value):
            if rendered is variables:
                rendered = dict(variables)
                scope = {**variables, **context()}
            try:
                rendered[key] = _CONNECTION_ENV.from_string(value).render(scope)
            except jinja2.TemplateError as exc:
                raise _var_error(f"cannot render {value!r}: {exc}", key, origins.get(key)) from None
    return rendered
