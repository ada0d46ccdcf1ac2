"""Loading an inventory: read every source into a Draft, reconcile as Ansible does (top-level
groups under ``all``, hosts in no group in ``ungrouped``), read group_vars/ and host_vars/, merge
each host's variables, register secret values, and build each host's connection settings."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.inventory import group_map as group_mapping
from deployer.inventory.connection_vars import (
    ConnectionSpecs,
    has_connection_template,
    render_connection_vars,
    sets_shared_connection_vars,
)
from deployer.inventory.draft import Draft
from deployer.inventory.model import Host, Inventory
from deployer.inventory.names import MAGIC_VARS, is_identifier
from deployer.inventory.precedence import Membership, compute_depths, resolve
from deployer.inventory.sources import inventory_files, parse_file
from deployer.inventory.vars_files import entity_names, load_entity_vars
from deployer.memory import collector_paused
from deployer.secrets import REGISTERED, SecretValues, is_secret_key, secret_values_in


def _secrets_in(values: Mapping[str, Any]) -> list[Any]:
    """``secret_values_in(values)``, without scanning when no key names a secret and no value
    nests more keys (a host's ``ansible_host`` line); ``is_secret_key`` remembers each name's
    verdict, so the names recurring on every host are judged once."""
    for key, value in values.items():
        if (
            (type(value) not in _SCALARS and isinstance(value, Mapping | list | tuple))
            or not isinstance(key, str)
            or is_secret_key(key)
        ):
            return secret_values_in(values)
    return []


# Values that nest no keys, told by their exact type before the slower check against the ABCs.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def load_inventory(
    path: str | Path,
    extra_vars: Mapping[str, Any] | None = None,
    secrets: SecretValues | None = None,
    *,
    keep: bool = False,
) -> Inventory:
    """Load and validate an inventory file or directory; every problem is an InputError.
    ``gpumon_groups`` maps the product's groups onto the inventory's
    (``deployer/inventory/group_map.py``).

    The values of secret variables are registered in ``secrets`` (by default the process-wide
    registry that :func:`deployer.secrets.mask_text` uses), so they are masked wherever they show.

    With ``keep`` (a command's inventory, alive for its whole run), what is alive once it is
    loaded is kept for the run (``memory.keep_for_the_run``) before the collector comes back.
    """
    # Loading builds millions of containers that all stay alive: the cyclic collector, left on,
    # rescans them again and again (a fifth of loading 30,000 hosts) and frees none. Paused for
    # the load only, and left as the caller had it. Kept for the run after it, the inventory is
    # out of the collector's sight before it comes back: frozen by the caller after the return,
    # the first allocation in between scanned all of it (100,000 hosts: a sixth of a second).
    with collector_paused(keep=keep):
        return _load_inventory(path, extra_vars, secrets)


def _load_inventory(
    path: str | Path,
    extra_vars: Mapping[str, Any] | None,
    secrets: SecretValues | None,
) -> Inventory:
    root = Path(path)
    if not root.exists():
        if "," in str(path):
            raise InputError(
                "a comma-separated host list (Ansible's host_list inventory plugin) is not "
                "supported: write the hosts in an inventory file",
                source=str(root),
            )
        raise InputError("inventory not found", source=str(root))
    draft = Draft()
    files = inventory_files(root) if root.is_dir() else [root]
    if not files:
        raise InputError("no inventory files in this directory", source=str(root))
    for file in files:
        parse_file(draft, file)

    groups = draft.groups
    base = root if root.is_dir() else root.parent
    warnings_: list[str] = []

    # Reconcile as Ansible does: every top-level group under all, hosts in no group ungrouped.
    declared_in_all = list(groups["all"].hosts)
    for name, group in groups.items():
        if name != "all" and not group.parents:
            draft.add_child("all", name, group.defined_at or (str(root), None))
    # Hosts leave all's and ungrouped's lists in one pass each after the loop (a remove per host
    # is quadratic in a flat `all: hosts:` of thousands).
    left_all: set[str] = set()
    left_ungrouped: set[str] = set()
    for host in draft.hosts.values():
        others = [g for g in host.groups if g not in ("all", "ungrouped")]
        if not others and "ungrouped" not in host.groups:
            host.groups.append("ungrouped")
            groups["ungrouped"].hosts.append(host.name)
        if "all" in host.groups:
            host.groups.remove("all")
            left_all.add(host.name)
        if others and "ungrouped" in host.groups:
            host.groups.remove("ungrouped")
            left_ungrouped.add(host.name)
    for name, left in (("all", left_all), ("ungrouped", left_ungrouped)):
        if left:
            groups[name].hosts = [h for h in groups[name].hosts if h not in left]
    # Ungrouped hosts come first in ``all`` only if defined first; hosts stay in definition order.

    for name in draft.hosts:
        if name in groups:
            warnings_.append(f"{name!r} is both a host and a group; a --limit of it means the host")

    compute_depths(groups)

    group_vars_dir, host_vars_dir = base / "group_vars", base / "host_vars"
    if group_vars_dir.is_dir():
        for name, group in groups.items():
            group.file_vars, group.file_var_origins = load_entity_vars(group_vars_dir, name)
        for name in entity_names(group_vars_dir):
            if name not in groups:
                warnings_.append(f"{group_vars_dir / name}: no group {name!r} in the inventory")
    if host_vars_dir.is_dir():
        for name, host in draft.hosts.items():
            host.file_vars, host.file_origins = load_entity_vars(host_vars_dir, name)
        for name in entity_names(host_vars_dir):
            if name not in draft.hosts:
                warnings_.append(f"{host_vars_dir / name}: no host {name!r} in the inventory")

    extra = dict(extra_vars or {})
    for key in extra:
        if not is_identifier(key) or key in MAGIC_VARS:
            raise InputError(f"invalid variable name {key!r}", source="-e", key=str(key))

    # The product's groups onto the inventory's (gpumon_groups / --group): parents added.
    mapping, origin = group_mapping.find_mapping(draft, extra)
    if mapping is not None:
        created = group_mapping.apply(draft, group_mapping.checked(mapping, origin, groups), origin)
        if group_vars_dir.is_dir():
            for name in created:
                group = groups[name]
                group.file_vars, group.file_var_origins = load_entity_vars(group_vars_dir, name)
            warnings_ = [
                w
                for w in warnings_
                if not any(w.startswith(f"{group_vars_dir / n}: ") for n in created)
            ]
        compute_depths(groups)

    secrets = REGISTERED if secrets is None else secrets
    for group in groups.values():
        secrets.add(_secrets_in(group.inventory_vars))
        secrets.add(_secrets_in(group.file_vars))
    secrets.add(_secrets_in(extra))

    # Hosts with the same direct groups (a rack's) share their group list and the merge of
    # their groups' variables: computed once per distinct membership, not per host.
    memberships: dict[tuple[str, ...], Membership] = {}
    member_groups: dict[str, Membership] = {}
    for name, draft_host in draft.hosts.items():
        direct = tuple(draft_host.groups)
        membership = memberships.get(direct)
        if membership is None:
            membership = memberships[direct] = Membership(groups, direct)
        member_groups[name] = membership
    group_members: dict[str, list[str]] = {g: [] for g in groups}
    for host_name, membership in member_groups.items():
        for g in membership.ordered:
            group_members[g].append(host_name)

    # Every host names the same key and known_hosts files: expand each path once per load.
    specs = ConnectionSpecs(functools.lru_cache(maxsize=None)(os.path.expanduser))
    # Whether a connection variable is a template is judged once per membership (the groups'
    # merged variables) and for extra vars, and per host on its own few variables only.
    templated_groups: dict[Membership, bool] = {}
    extra_templated = has_connection_template(extra)
    hosts: list[Host] = []
    elsewhere: list[tuple[str, str, str]] = []  # (host, where SSH goes, the tier's address)
    # Ansible's password variables, which gpumon-deploy does not use: what each host sets.
    not_used: dict[str, list[str]] = {}
    sets_password: dict[Membership, bool] = {}
    extra_sets_password = not _PASSWORD_VAR_NAMES.isdisjoint(extra)
    for name, draft_host in draft.hosts.items():
        # A host's own variables: its inventory line's, and its host_vars file's (most hosts
        # have none: each check below skips the empty one).
        inline, from_file = draft_host.inline_vars, draft_host.file_vars
        for own_vars in (inline, from_file) if from_file else (inline,):
            found = _secrets_in(own_vars)
            if found:
                secrets.add(found)
        membership = member_groups[name]
        variables, origins = resolve(membership, draft_host, extra)
        rendered = variables
        group_templated = templated_groups.get(membership)
        if group_templated is None:
            group_templated = templated_groups[membership] = has_connection_template(
                membership.variables
            )
        templated = (
            group_templated
            or extra_templated
            or has_connection_template(inline)
            or (bool(from_file) and has_connection_template(from_file))
        )
        if templated:
            rendered = render_connection_vars(
                variables,
                lambda name=name, membership=membership: {
                    "inventory_hostname": name,
                    "inventory_hostname_short": name.split(".")[0],
                    "group_names": list(membership.group_names),
                    "groups": group_members,
                },
                origins,
            )
        # Hosts of one set of groups whose own variables set no connection variable but the
        # address, none a template, read the same shared values: once per membership.
        own = sets_shared_connection_vars(inline) or (
            bool(from_file) and sets_shared_connection_vars(from_file)
        )
        same_as = None if templated or own else membership
        connection = specs.spec(name, rendered, origins, same_as)
        hosts.append(Host(name, membership.ordered, variables, connection, origins))
        # Judged on the merged variables (a host may set one back to null) only where a layer
        # sets one: the groups' once per membership, the host's own few.
        in_groups = sets_password.get(membership)
        if in_groups is None:
            in_groups = sets_password[membership] = extra_sets_password or not (
                _PASSWORD_VAR_NAMES.isdisjoint(membership.variables)
            )
        if (
            in_groups
            or not _PASSWORD_VAR_NAMES.isdisjoint(inline)
            or (bool(from_file) and not _PASSWORD_VAR_NAMES.isdisjoint(from_file))
        ):
            for what in _unused_auth(variables):
                if what != "become" or connection.become:
                    not_used.setdefault(what, []).append(name)
        if rendered.get("ansible_ssh_host") is not None:
            addressed = str(rendered.get("ansible_host", name))
            if addressed != connection.address:
                elsewhere.append((name, connection.address, addressed))
    if elsewhere:
        warnings_.append(_monitored_elsewhere(elsewhere))
    warnings_ += [_not_used(what, names) for what, names in not_used.items()]

    return Inventory(
        sources=[str(f) for f in files],
        groups=groups,
        hosts=hosts,
        extra_vars=extra,
        secrets=secrets,
        warnings_=warnings_,
        declared_in_all=declared_in_all,
    )


def _monitored_elsewhere(hosts: list[tuple[str, str, str]]) -> str:
    """The warning for hosts that SSH reaches at ``ansible_ssh_host`` (which wins, as in
    ansible-core) and the monitoring tier at another address: it reads ``ansible_host``, else
    the name, as Ansible roles write it (targets, peers, certificates' names, status)."""
    shown = _first_few(
        [f"{h}: SSH to {ssh}, the monitoring tier to {tier}" for h, ssh, tier in hosts], "; "
    )
    return (
        f"{len(hosts)} host(s) set ansible_ssh_host, which SSH uses, while the monitoring tier "
        f"addresses a host by ansible_host, else its name ({shown}): set ansible_host to "
        "the address Prometheus and the peers should use"
    )


def _first_few(items: list[str], sep: str) -> str:
    """The first three of ``items`` and how many more: a warning names a few of many hosts."""
    return sep.join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


# Ansible's password variables (its ssh connection plugin's password and private key passphrase,
# its sudo plugin's password): gpumon-deploy logs in with keys (a key file or the SSH agent) and
# becomes with ``sudo -n``, so none is read. Each kind is warned about once, naming its hosts.
_PASSWORD_VARS = {
    "password": ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password"),
    "passphrase": ("ansible_private_key_passphrase", "ansible_ssh_private_key_passphrase"),
    "become": ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass"),
}
_PASSWORD_VAR_NAMES = frozenset(k for keys in _PASSWORD_VARS.values() for k in keys)
_INSTEAD = {
    "password": "it does not log in with a password: give the user an SSH key "
    "(ansible_ssh_private_key_file, or the SSH agent)",
    "passphrase": "it does not unlock a key with a passphrase: load the key into the SSH agent",
    "become": "it becomes with 'sudo -n', which needs passwordless sudo for the user",
}


def _unused_auth(values: Mapping[str, Any]) -> list[str]:
    """The kinds of password variable ``values`` set (to something other than null)."""
    return [w for w, keys in _PASSWORD_VARS.items() if any(values.get(k) is not None for k in keys)]


def _not_used(what: str, hosts: list[str]) -> str:
    shown = _first_few(hosts, ", ")
    keys = " / ".join(_PASSWORD_VARS[what])
    who = "host(s) that become" if what == "become" else "host(s)"
    return f"{len(hosts)} {who} set {keys}, which gpumon-deploy does not read ({shown}): {_INSTEAD[what]}"
