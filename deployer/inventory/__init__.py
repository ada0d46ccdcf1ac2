"""Ansible-compatible inventories: YAML, INI and TOML files, group_vars/ and host_vars/, extra vars, and
each host's resolved variables and SSH connection settings. Pure data: nothing here connects.

Callers use this package's names (``from deployer import inventory as inv``;
``inv.load_inventory``, ``inv.parse_extra_vars``); each concern lives in one module:

- ``sources``: which files ``-i`` names and which parser reads each; ``files``: reading one file;
- ``yaml_source``, ``ini_source``, ``toml_source``: the inventory formats, building a
  ``draft.Draft``;
- ``names``: variable, group and host names, host ranges, ``name:port``;
- ``vars_files``: group_vars/ and host_vars/;
- ``precedence``: the merge order of a host's groups and variable layers;
- ``order``: the order a group lists its hosts in (what a subscript picks from);
- ``connection_vars``: each host's SSH settings from its connection variables;
- ``extra_vars``: ``-e``;
- ``loader``: :func:`load_inventory`, putting it together;
- ``model``: the loaded :class:`Inventory`, its hosts and groups, and its masked view.

Groups. ``all`` contains every group and host; ``ungrouped`` holds the hosts in no other group.
``children`` nest groups (a cycle is an error). Magic variables (``inventory_hostname``,
``inventory_hostname_short``, ``group_names``, ``groups``, ``hostvars``) are provided on top and
cannot be set in an inventory.

Where this is stricter than Ansible (which warns and carries on), it refuses with an InputError:
an unknown key in a YAML group, a group that is not a mapping, a variable name that is not an
identifier, both ``group_vars/x`` and ``group_vars/x.yml`` present (Ansible silently reads only
one), an empty or reversed host range. Refused by name: inventory plugins, dynamic inventory
scripts, a comma-separated host list, vault (a file or an inline ``!vault`` value). A host and a
group sharing a name, and group_vars/host_vars entries naming no group or host, are reported in
``Inventory.warnings``.
"""

from __future__ import annotations

from deployer.inventory.extra_vars import parse_extra_vars
from deployer.inventory.loader import load_inventory
from deployer.inventory.model import ConnectionSpec, Group, Host, Inventory, dumps
from deployer.inventory.names import expand_host_range

__all__ = [
    "ConnectionSpec",
    "Group",
    "Host",
    "Inventory",
    "dumps",
    "expand_host_range",
    "load_inventory",
    "parse_extra_vars",
]
