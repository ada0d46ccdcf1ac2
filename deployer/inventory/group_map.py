"""The product's groups mapped onto an inventory's own: ``gpumon_groups``.

The site applies roles to the groups ``gpu``, ``prometheus``, ``alertmanager``, ... An inventory
written for a cluster names its own (DeepOps' ``slurm-node``, kubespray's ``kube_node``). With

    gpumon_groups: {gpu: [slurm-node]}            # group_vars/all.yml, or -e, or
    gpumon-deploy up --group gpu=slurm-node       # one run

the product's group ``gpu`` gets ``slurm-node`` as a child, exactly as if the inventory said
``[gpu:children] slurm-node``: its hosts are ``gpu``'s hosts for every play, pattern, template
(``groups['gpu']``) and group_vars file (``group_vars/gpu.yml`` applies to them, below
``slurm-node``'s own, as a parent's does in Ansible). Where the product's group already exists
the mapped groups join it. A mapped group the inventory lacks is an error naming where the
mapping was read; so is a mapping that is not ``{group: [group, ...]}``.

Where the mapping is read, the first found wins (one mapping, never merged): ``-e`` (the
command line's ``--group`` flags arrive as the last ``-e gpumon_groups=...``, so they win), then
group ``all``'s variables (group_vars/all, then the inventory file's ``all: vars:``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deployer.errors import InputError
from deployer.inventory.draft import Draft
from deployer.inventory.model import Origin

VAR = "gpumon_groups"


def parse_flags(values: Sequence[str]) -> dict[str, list[str]]:
    """``--group PRODUCT=GROUP[,GROUP...]`` values as one mapping (repeated flags add up)."""
    out: dict[str, list[str]] = {}
    for value in values:
        product, sep, mapped = value.partition("=")
        groups = [g.strip() for g in mapped.split(",") if g.strip()]
        if not sep or not product.strip() or not groups:
            raise InputError(
                f"expected PRODUCT_GROUP=GROUP[,GROUP...] (e.g. gpu=slurm-node), got {value!r}",
                source="--group",
            )
        out.setdefault(product.strip(), []).extend(groups)
    return out


def find_mapping(draft: Draft, extra_vars: Mapping[str, Any]) -> tuple[Any, Origin]:
    """The mapping in force and where it was read (see the module docstring)."""
    if VAR in extra_vars:
        return extra_vars[VAR], ("-e / --group", None)
    group = draft.groups["all"]
    if VAR in group.file_vars:
        return group.file_vars[VAR], group.file_var_origins.get(VAR, ("group_vars/all", None))
    if VAR in group.inventory_vars:
        return group.inventory_vars[VAR], group.inventory_var_origins.get(VAR, ("inventory", None))
    return None, ("", None)


def checked(mapping: Any, origin: Origin, groups: Mapping[str, Any]) -> dict[str, list[str]]:
    """``mapping`` as {product group: [inventory group, ...]}, every inventory group existing."""
    source, line = origin

    def fail(message: str, key: str) -> InputError:
        return InputError(message, source=source, line=line, key=key)

    if not isinstance(mapping, Mapping):
        raise fail(
            f"must map a product group to inventory groups ({{gpu: [slurm-node]}}), "
            f"got {type(mapping).__name__}",
            VAR,
        )
    out: dict[str, list[str]] = {}
    for product, mapped in mapping.items():
        key = f"{VAR}.{product}"
        if not isinstance(product, str) or not product:
            raise fail("a product group name must be a string", VAR)
        names = [mapped] if isinstance(mapped, str) else mapped
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise fail("must be a group name or a list of group names", key)
        missing = [n for n in names if n not in groups]
        if missing:
            known = ", ".join(sorted(g for g in groups if g not in ("all", "ungrouped")))
            raise fail(
                f"no group {', '.join(map(repr, missing))} in the inventory (its groups: {known})",
                key,
            )
        out[product] = [n for n in names if n != product]
    return out


def apply(draft: Draft, mapping: Mapping[str, list[str]], origin: Origin) -> list[str]:
    """Make each product group a parent of the groups mapped onto it; the groups created."""
    created = []
    for product, names in mapping.items():
        if product not in draft.groups:
            draft.add_group(product, origin)
            draft.add_child("all", product, origin)
            created.append(product)
        for name in names:
            draft.add_child(product, name, origin)
    return created
