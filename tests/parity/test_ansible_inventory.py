"""gpumon-deploy reads every inventory as ansible-core reads it.

ansible-core itself (pinned, in a virtualenv of its own: tests/parity/reference.py) runs over every
inventory of ``../shared/ansible_inventory_corpus/`` (read through ``tests/reality.py``, never
copied) and over a few inventories written here that the corpus does not hold (IPv6 and non-ASCII
host names, a group whose order is not the definition order, ``!unsafe``, timestamps,
``ansible_group_priority``, TOML; and, in tests/fixtures/inventories/parity/, a Slurm cluster's
INI with ranges and group_vars/host_vars files, a kubespray-like YAML nested four deep with
group_vars and host_vars directories, an inventory directory of two sources). For each it runs ``ansible-inventory -i X --list``,
``ansible-inventory -i X --host H`` for the first and the last host, and, for a batch of
patterns built from the inventory's own groups and hosts (group, host, ``a:b``, ``a:&b``,
``a:!b``, ``a,b``, ``!g``, ``~regex``, ``prefix*``, ``name?``, subscripts ``g[0]``, ``g[-1]``,
``g[1:]``, ``g[0:1]``, IPv6 addresses), what ``ansible all -i X --list-hosts --limit PAT`` and
``ansible PAT -i X --list-hosts`` list. gpumon-deploy must agree on:

- whether the inventory is valid: one ansible-core rejects, gpumon-deploy rejects too (exit 2,
  naming the file and line);
- the hosts and the groups with their hosts and children, and the groups' order;
- each host's variables (``--list``'s hostvars and ``--host``), as JSON;
- the hosts each pattern selects as ``--limit`` (``select_limit``) and as a play's ``hosts:``
  (``select``), in order, and which patterns are errors; and ``gpumon-deploy inventory --limit``.

Where ansible-core's own order is left to a Python set (tests/parity/ansible_order.py), any order
it could give is accepted, and a subscript there is held to the number of hosts it picks.

ansible-core runs twice per session (one process for every ``--list``/``--host``, one for every
pattern batch, a fork per call inside it), and its answers are kept for the session.

Where gpumon-deploy differs on purpose, ``DELIBERATE`` says so and why, and gpumon-deploy refuses
the inventory by name (the README lists these); where it is stricter about a pattern than
ansible-core's warning, ``test_unmatched_pattern_is_an_error_where_ansible_warns`` says so.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deployer.cli import cli
from deployer.errors import InputError
from deployer.hostpattern import NoHostsMatched, select, select_limit
from deployer.inventory import Inventory, load_inventory
from deployer.secrets import SecretValues
from deployer.unsafe import UnsafeText
from tests.parity.ansible_order import possible_orders
from tests.parity.reference import run_reference
from tests.reality import SHARED_ENV, inventory_corpus_dir

UNMATCHED = "Could not match supplied host pattern"


@dataclass(frozen=True)
class Deliberate:
    """A corpus inventory gpumon-deploy reads differently from ansible-core, on purpose."""

    reason: str
    # What gpumon-deploy's error says (it refuses the inventory by name); None: it reads the
    # inventory where ansible-core fails.
    refused_with: str | None


DELIBERATE: dict[str, Deliberate] = {
    "ansible/constructed-plugin": Deliberate(
        "inventory plugins (ansible.builtin.constructed and every other 'plugin:' file) are "
        "not run: an inventory is static YAML, INI or TOML",
        refused_with="inventory plugin",
    ),
    "ansible/vaulted-inventory": Deliberate(
        "Ansible Vault is not supported: secrets come from -e @file (mode 0600) or a secret store",
        refused_with="vault",
    ),
    "ansible/ansible-inventory-invalid_sample": Deliberate(
        "a variable name must be an identifier; ansible-core accepts '7.2' with a deprecation "
        "(removed in ansible-core 2.23)",
        refused_with="invalid variable name",
    ),
    "ansible/path_with_comma": Deliberate(
        "ansible-core 2.19.14 fails on an inventory path that contains commas ('Origin.path "
        "must be str', its own target path_with_comma_in_inventory); gpumon-deploy reads the "
        "file the path names",
        refused_with=None,
    ),
}


# ----------------------------------------------------------------------------- the cases


@dataclass
class Case:
    id: str
    inventory: Path
    ref_args: list[str] = field(default_factory=list)
    # Patterns tried besides the ones built from the inventory's groups and hosts.
    extra_patterns: list[str] = field(default_factory=list)


# Inventories the corpus does not hold, written for this test: name -> (file name, text, patterns).
WRITTEN: dict[str, tuple[str, str, list[str]]] = {
    "written/group-order": (
        "hosts",
        "n1\nn2\nn3\n[g]\nn2\nn1\nn3\n[h:children]\ng\n[h]\nn3\n",
        ["g[0]", "g[-1]", "g[1:]", "g[0:1]", "h[0]", "h[1:]", "all[0]", "n*[0]"],
    ),
    "written/ipv6": (
        "hosts",
        "fe80::1610:9fff:fedd:654b\n"
        "[v6]\n2001:db8::1\n2001:db8::2 ansible_port=2222\n[2001:db8::3]:2200\n"
        "[v4]\n192.0.2.10\n",
        [
            "fe80::1610:9fff:fedd:654b",
            "2001:db8::1",
            "2001:db8::1,2001:db8::3",
            "v6:!2001:db8::2",
            "v6,!2001:db8::2",
            "v6[0]",
            "2001:db8::*",
            "2001:db8::*,",
            "~2001:db8::[12]",
            "~2001:db8::[12],",
            "[2001:db8::3]:2200",
        ],
    ),
    "written/non-ascii": (
        "hosts.yml",
        "all:\n  hosts:\n    příbor:\n      city: Příbor\n  children:\n    česko:\n"
        "      hosts:\n        ostrava.cz:\n        příbor:\n",
        ["příbor", "česko", "česko[0]", "př*", "~ostr"],
    ),
    "written/deep-order": (
        "hosts.yml",
        "all:\n  hosts:\n    top1:\n  children:\n    a:\n      children:\n        a1:\n"
        "          hosts:\n            deep1:\n        a2:\n          hosts:\n            deep2:\n"
        "      hosts:\n        mid1:\n    b:\n      hosts:\n        mid2:\n        deep1:\n",
        ["a[0]", "a[-1]", "all[0]", "all[-1]", "a:b", "b:a"],
    ),
    "written/unsafe-timestamps-priority": (
        "hosts.yml",
        "all:\n  vars:\n    when: 2017-03-07 10:20:49Z\n    day: 2024-02-29\n"
        "  children:\n    low:\n      vars:\n        ansible_group_priority: 10\n"
        "        color: low\n      hosts:\n        h1:\n          raw: !unsafe '{{ not templated }}'\n"
        "          nested: {list: [!unsafe '{% raw %}', plain]}\n    high:\n      vars:\n"
        "        color: high\n      hosts:\n        h1:\n",
        ["low", "high[0]"],
    ),
    "written/connection-aliases": (
        "hosts.yml",
        "all:\n  vars:\n    ansible_user: everyone\n    ansible_ssh_port: 2200\n"
        "  hosts:\n    both:\n      ansible_host: 192.0.2.1\n      ansible_ssh_host: 192.0.2.2\n"
        "      ansible_port: 2201\n      ansible_ssh_user: root\n"
        "      ansible_private_key_file: /keys/a\n      ansible_ssh_private_key_file: /keys/b\n"
        "    plain:\n      ansible_host: 192.0.2.3\n      ansible_port: 2203\n"
        "    templated:\n      ansible_ssh_host: '{{ inventory_hostname }}.example.net'\n"
        "  children:\n    g:\n      vars:\n        ansible_ssh_user: admin\n"
        "      hosts:\n        plain:\n        last:\n          ansible_user: mine\n"
        "          ansible_become: 'yes'\n          ansible_become_user: ops\n"
        "          ansible_sudo_user: gpu-admin\n          ansible_become_method: sudo\n",
        ["g", "both"],
    ),
    "written/toml": (
        "hosts.toml",
        '[all.vars]\nregion = "eu"\n\n[gpu]\nhosts.gpu01 = { ansible_host = "10.0.0.1", n = 8 }\n'
        'hosts.gpu02 = {}\nvars = { driver = "580", when = 1979-05-27T07:32:00Z }\n'
        'children = ["a100"]\n\n[a100.hosts.gpu03]\nansible_port = 2222\n\n'
        "[ungrouped.hosts.lonely]\n",
        ["gpu", "gpu[0]", "a100", "gpu:!a100", "lonely"],
    ),
}


# Multi-file inventories the corpus does not hold, shaped like real clusters, in the tests' own
# data (tests/fixtures/inventories/parity/README.md): name -> (inventory path there, patterns).
WRITTEN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "inventories" / "parity"
WRITTEN_TREES: dict[str, tuple[str, list[str]]] = {
    "written/slurm-ini": (
        "slurm-ini/hosts",
        [
            "slurm-node[0]",
            "slurm-node[-1]",
            "slurm-node[2:4]",
            "gpu-a100:&slurm-node",
            "slurm-cluster:!gpu-h100",
            "gpu0*",
            "gpu1?",
            "~gpu(0[89]|1[0-2])",
            "cpu-*",
            "spares",
            "storage,head01",
            "!slurm-node",
        ],
    ),
    "written/k8s-nested-yaml": (
        "k8s-nested-yaml/hosts.yml",
        [
            "kube_node",
            "gpu_nodes[0]",
            "gpu_nodes[-1]",
            "k8s_cluster[1:3]",
            "kube_node:!h100_nodes",
            "etcd:&kube_control_plane",
            "node0[5-8]",
            "node0*",
            "calico_rr",
            "~^cp[12]$",
        ],
    ),
    "written/multi-source-dir": (
        "multi-source-dir/inventory",
        ["gpu", "gpu[0]", "gpu[-1]", "monitoring", "monitoring:!prometheus", "prom?"],
    ),
}


def corpus_cases() -> list[Case]:
    manifest = inventory_corpus_dir() / "MANIFEST.json"
    if not manifest.is_file():
        return []
    cases = []
    for entry in json.loads(manifest.read_text(encoding="utf-8")):
        case_dir = inventory_corpus_dir() / entry["case"]
        args = [a.replace("{case}", str(case_dir)) for a in entry.get("ref_args", [])]
        cases.append(Case(entry["case"], inventory_corpus_dir() / entry["inventory"], args))
    return cases


CORPUS_IDS = [c.id for c in corpus_cases()] or ["corpus-missing"]
ALL_IDS = [*CORPUS_IDS, *WRITTEN, *WRITTEN_TREES]
COMPARED_IDS = [i for i in ALL_IDS if i not in DELIBERATE]


@pytest.fixture(scope="session")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    found = {c.id: c for c in corpus_cases()}
    if not found:
        message = f"inventory corpus not found: {inventory_corpus_dir()} (set {SHARED_ENV})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("written-inventories")
    for case_id, (name, text, patterns) in WRITTEN.items():
        folder = root / case_id.replace("/", "-")
        folder.mkdir()
        (folder / name).write_text(text, encoding="utf-8")
        found[case_id] = Case(case_id, folder / name, extra_patterns=patterns)
    for case_id, (path, patterns) in WRITTEN_TREES.items():
        found[case_id] = Case(case_id, WRITTEN_DIR / path, extra_patterns=patterns)
    return found


# ----------------------------------------------------------------------------- ansible-core


@dataclass
class Reference:
    """What ansible-core answered for one inventory."""

    rc: int
    stderr: str
    listing: dict[str, Any]
    host_answers: dict[str, dict[str, Any]]
    patterns: dict[str, dict[str, Any]] = field(default_factory=dict)
    # ansible's groups in its order: direct hosts (all's too) and children.
    structure: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # the ssh connection plugin's options of each host (the first and the last of a large
    # inventory; ansible_driver.py)
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def orders(self, group: str) -> set[tuple[str, ...]] | None:
        """Every order ansible-core may list ``group``'s hosts in (tests/parity/ansible_order.py)."""
        return possible_orders(self.structure, group)

    def settled(self) -> bool:
        """Whether ansible-core lists every group's hosts in one order, whatever its set order."""
        return all(len(self.orders(g) or ()) == 1 for g in self.structure)

    @property
    def groups(self) -> dict[str, dict[str, list[str]]]:
        return {k: v for k, v in self.listing.items() if k != "_meta"}

    @property
    def hostvars(self) -> dict[str, dict[str, Any]]:
        return self.listing.get("_meta", {}).get("hostvars", {})

    def hosts(self) -> list[str]:
        """Every host, as ``ansible all --list-hosts`` lists them."""
        return self.patterns["all"]["limit"].get("hosts", []) if "all" in self.patterns else []


def _host_names(listing: dict[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for name, group in listing.items():
        if name != "_meta":
            for host in group.get("hosts", []):
                seen.setdefault(host, None)
    return list(seen)


def patterns_for(listing: dict[str, Any], extra: list[str]) -> list[str]:
    """The patterns tried on one inventory, built from its own groups and hosts."""
    groups = [g for g in listing if g not in ("_meta", "all", "ungrouped")]
    hosts = _host_names(listing)
    found = ["all", "*", *extra]
    if "ungrouped" in listing:
        found.append("ungrouped")
    found += groups[:6]
    if hosts:
        found += [hosts[0], hosts[-1]]
    if len(groups) >= 2:
        a, b = groups[0], groups[1]
        found += [f"{a}:{b}", f"{a}:&{b}", f"{a}:!{b}", f"{a},{b}", f"!{a}", f"{b}:!{a}"]
    if groups:
        found.append(f"!{groups[0]}")
    big = [g for g in groups if len(listing[g].get("hosts", [])) >= 2]
    for g in big[:2]:
        found += [f"{g}[0]", f"{g}[-1]", f"{g}[1:]", f"{g}[0:1]"]
    for h in hosts[:2]:
        if len(h) >= 2:
            found += [f"{h[:2]}*", f"~{re.escape(h[:3])}", f"{h[:-1]}?"]
    found += ["all[0]", "all[-1]", "nosuchgroup", f"{groups[0]},nosuchgroup" if groups else "*x"]
    return list(dict.fromkeys(p for p in found if p))


@pytest.fixture(scope="session")
def reference(cases: dict[str, Case]) -> dict[str, Reference]:
    """ansible-core's answers for every case: two runs of the driver for the whole session."""
    jobs = []
    for case in cases.values():
        args = ["-i", str(case.inventory), *case.ref_args]
        calls: list[dict[str, Any]] = [{"kind": "list"}]
        jobs.append({"id": case.id, "args": args, "calls": calls})
    listed = run_reference(jobs)
    answers: dict[str, Reference] = {}
    second = []
    for case in cases.values():
        result = listed[case.id][0]
        listing = json.loads(result["stdout"]) if result["rc"] == 0 else {}
        answers[case.id] = Reference(result["rc"], result["stderr"], listing, {})
        if result["rc"] != 0:
            continue
        hosts = _host_names(listing)
        calls = [{"kind": "host", "host": h} for h in dict.fromkeys(hosts[:1] + hosts[-1:])]
        calls.append({"kind": "limits", "patterns": patterns_for(listing, case.extra_patterns)})
        # every host of a small inventory, the first and the last of a large one
        reached = hosts if len(hosts) <= 20 else list(dict.fromkeys(hosts[:1] + hosts[-1:]))
        calls.append({"kind": "connections", "hosts": reached})
        args = ["-i", str(case.inventory), *case.ref_args]
        second.append({"id": case.id, "args": args, "calls": calls})
    for case_id, results in run_reference(second).items():
        ref = answers[case_id]
        *host_results, limits, connections = results
        for call, result in zip(
            [c for job in second if job["id"] == case_id for c in job["calls"]],
            host_results,
            strict=False,
        ):
            assert result["rc"] == 0, result["stderr"]
            ref.host_answers[call["host"]] = json.loads(result["stdout"])
        assert limits["rc"] == 0, limits["stderr"]
        batch = json.loads(limits["stdout"])
        ref.patterns = {a["pattern"]: a for a in batch["patterns"]}
        ref.structure = batch["groups"]
        assert connections["rc"] == 0, connections["stderr"]
        ref.connections = json.loads(connections["stdout"])
    return answers


# ----------------------------------------------------------------------------- gpumon-deploy


def load(case: Case) -> Inventory:
    return load_inventory(case.inventory, secrets=SecretValues())


def our_groups(inventory: Inventory) -> dict[str, dict[str, list[str]]]:
    """gpumon-deploy's groups in ansible-inventory --list's shape: direct hosts (none for
    ``all``) and children, empty keys and empty groups left out."""
    view = inventory.to_dict(mask_secrets=False)["groups"]
    shaped: dict[str, dict[str, list[str]]] = {}
    for name, group in view.items():
        entry = {"hosts": [] if name == "all" else group["hosts"], "children": group["children"]}
        entry = {k: v for k, v in entry.items() if v}
        if entry:
            shaped[name] = entry
    return shaped


def _as_ansible_lists(value: Any) -> Any:
    """``ansible-inventory --list`` (its ``inventory_legacy`` JSON profile) wraps ``!unsafe``
    text as ``{"__ansible_unsafe": text}``, ``--host`` shows the text; gpumon-deploy shows the
    text and keeps it unsafe, which is compared here."""
    if isinstance(value, UnsafeText):
        return {"__ansible_unsafe": str(value)}
    if isinstance(value, dict):
        return {k: _as_ansible_lists(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_ansible_lists(v) for v in value]
    return value


def our_vars(inventory: Inventory, host: str, listed: bool = False) -> dict[str, Any]:
    shown = inventory.to_dict(host=host, mask_secrets=False)["vars"]
    return json.loads(json.dumps(_as_ansible_lists(shown) if listed else shown))


def _case(cases: dict[str, Case], case_id: str) -> Case:
    if case_id not in cases:
        pytest.skip(f"no case {case_id}")
    return cases[case_id]


# ----------------------------------------------------------------------------- the checks


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_an_inventory_is_valid_where_ansible_reads_it(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc == 0:
        load(case)  # raises with file and line if gpumon-deploy refuses it
        return
    with pytest.raises(InputError) as refused:
        load(case)
    assert refused.value.source, f"the error names no file: {refused.value}"
    assert refused.value.line is not None, f"the error names no line: {refused.value}"
    result = CliRunner().invoke(cli, ["inventory", "-i", str(case.inventory)])
    assert result.exit_code == 2, result.output
    assert f"{refused.value.source}:{refused.value.line}" in result.output


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_hosts_and_groups_are_ansibles(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc != 0:
        pytest.skip("ansible-core rejects this inventory (checked for a rejection here too)")
    inventory = load(case)
    assert our_groups(inventory) == ref.groups
    assert list(inventory.groups) == list(ref.structure)  # the order glob patterns match in
    ours = tuple(h.name for h in select(inventory, None))
    orders = ref.orders("all")
    if orders is None:
        assert set(ours) == set(ref.hosts())
    else:
        assert tuple(ref.hosts()) in orders, "the replay of ansible's walk is wrong"
        assert ours in orders


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_each_hosts_variables_are_ansibles(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc != 0:
        pytest.skip("ansible-core rejects this inventory (checked for a rejection here too)")
    inventory = load(case)
    for host in inventory.hosts:
        assert our_vars(inventory, host, listed=True) == ref.hostvars.get(host, {}), host
    for host, answer in ref.host_answers.items():
        assert our_vars(inventory, host) == answer, f"--host {host}"


def _in_an_order_of_all(ref: Reference, ours: list[str], theirs: list[str]) -> bool:
    """``ours`` holds ``theirs``'s hosts in an order ansible-core's ``all`` may have."""
    if set(ours) != set(theirs) or len(ours) != len(theirs):
        return False
    orders = ref.orders("all")
    if orders is None:
        return True
    return any(ours == [h for h in order if h in set(theirs)] for order in orders)


def _differences(
    inventory: Inventory, ref: Reference, how: str, pick, same_order
) -> dict[str, Any]:
    """The patterns whose selection differs from ansible-core's: ``how`` names the answer
    (``limit`` or ``hosts_pattern``), ``pick`` is gpumon-deploy's, ``same_order(ours, theirs)``
    says whether two selections of the same hosts agree in order."""
    differ = {}
    for pattern, both in ref.patterns.items():
        answer = both[how]
        try:
            ours: Any = [h.name for h in pick(inventory, pattern)]
        except InputError as exc:
            ours = exc
        if (
            "error" in answer
            or not answer["hosts"]
            or any(UNMATCHED in w for w in answer["warnings"])
        ):
            # ansible-core fails, selects nothing (an empty inventory: only a warning), or
            # ignores a pattern matching nothing (a warning): gpumon-deploy refuses the limit,
            # naming the pattern (deliberately stricter).
            if not isinstance(ours, InputError):
                differ[pattern] = (answer, ours)
        elif isinstance(ours, InputError) or not same_order(pattern, ours, answer["hosts"]):
            differ[pattern] = (answer["hosts"], ours)
    return differ


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_each_limit_leaves_ansibles_hosts(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    """``--limit PAT``: the hosts ``ansible all --list-hosts --limit PAT`` lists, in ``all``'s
    order (one of ansible-core's, where its walk leaves the order to chance)."""
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc != 0:
        pytest.skip("ansible-core rejects this inventory (checked for a rejection here too)")

    def same_order(_pattern: str, ours: list[str], theirs: list[str]) -> bool:
        return _in_an_order_of_all(ref, ours, theirs)

    assert not _differences(load(case), ref, "limit", select_limit, same_order)


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_each_pattern_selects_ansibles_hosts(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    """A play's ``hosts: PAT``: what ``ansible PAT --list-hosts`` lists, in order. Where
    ansible-core leaves a group's order to chance (tests/parity/ansible_order.py), the same
    hosts, and as many as it picks for a subscript."""
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc != 0:
        pytest.skip("ansible-core rejects this inventory (checked for a rejection here too)")
    exact = ref.settled()

    def same_order(pattern: str, ours: list[str], theirs: list[str]) -> bool:
        if exact:
            return ours == theirs
        if "[" in pattern:  # a subscript picks by an order ansible-core does not settle
            return len(ours) == len(theirs)
        return sorted(ours) == sorted(theirs)

    assert not _differences(load(case), ref, "hosts_pattern", select, same_order)


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_inventory_limit_shows_ansibles_selection(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    """``gpumon-deploy inventory --limit PAT`` lists exactly the hosts ansible-core selects."""
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc != 0:
        pytest.skip("ansible-core rejects this inventory (checked for a rejection here too)")
    chosen = [
        (p, a["limit"]["hosts"])
        for p, a in ref.patterns.items()
        if "hosts" in a["limit"] and not a["limit"]["warnings"] and p not in ("all", "*")
    ]
    if not chosen:
        pytest.skip("no pattern selects hosts here")
    pattern, hosts = chosen[min(3, len(chosen) - 1)]
    result = CliRunner().invoke(
        cli, ["inventory", "-i", str(case.inventory), "--limit", pattern, "--output", "json"]
    )
    assert result.exit_code == 0, result.output
    assert _in_an_order_of_all(ref, list(json.loads(result.stdout)["hosts"]), hosts)


@pytest.mark.parametrize("case_id", COMPARED_IDS)
def test_each_host_is_reached_where_ansibles_ssh_connection_goes(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    """The address, port, user and key ansible-core's ssh connection would use for each host
    (the first and the last of an inventory of more than 20): where both a variable and its ``ansible_ssh_`` alias are set, the alias
    (the ssh plugin's ``vars:`` list it last, and the last set wins), whatever layer each
    comes from. A port or key ansible-core leaves unset is 22 or none; a user it leaves unset
    is the controller's user, as OpenSSH's. Become and the user become: ``ansible_become``, and
    the sudo plugin's ``become_user`` (``ansible_sudo_user`` over ``ansible_become_user``)."""
    case, ref = _case(cases, case_id), reference[case_id]
    if ref.rc != 0:
        pytest.skip("ansible-core rejects this inventory (checked for a rejection here too)")
    inventory = load(case)
    for host, theirs in ref.connections.items():
        ours = inventory.connection(host)
        key = theirs["private_key_file"]
        assert (ours.address, ours.port, ours.private_key_file) == (
            theirs["host"],
            int(theirs["port"] or 22),
            os.path.expanduser(key) if key else None,
        ), host
        if theirs["remote_user"] is not None:
            assert ours.user == theirs["remote_user"], host
        assert (ours.become, ours.become_user) == (theirs["become"], theirs["become_user"]), host


@pytest.mark.parametrize("case_id", sorted(DELIBERATE))
def test_deliberate_difference_is_refused_by_name(
    case_id: str, cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    case, why = _case(cases, case_id), DELIBERATE[case_id]
    if why.refused_with is None:
        assert reference[case_id].rc != 0, "ansible-core reads it now: compare it again"
        load(case)
        return
    with pytest.raises(InputError, match=why.refused_with) as refused:
        load(case)
    assert refused.value.source


def test_unmatched_pattern_is_an_error_where_ansible_warns(
    cases: dict[str, Case], reference: dict[str, Reference]
) -> None:
    """Deliberately stricter: ansible-core ignores a pattern that matches nothing (a warning)
    and goes on with the rest; gpumon-deploy refuses the limit, naming the pattern, so a typo
    in --limit never silently shrinks a rollout."""
    case = _case(cases, "docs/01-basic-ini")
    answer = reference[case.id].patterns["nosuchgroup"]["limit"]
    assert any(UNMATCHED in w for w in answer["warnings"])
    with pytest.raises(NoHostsMatched, match="matches no host or group"):
        select(load(case), "nosuchgroup")
