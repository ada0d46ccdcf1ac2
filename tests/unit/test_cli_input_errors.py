"""Bad role content, site files and flags: exit 2, the file and line or key named, no connection."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer import session as session_mod
from deployer.cli import _register_subcommands, cli

INVENTORY = """\
all:
  children:
    monitoring:
      hosts:
        m1: {ansible_host: 192.0.2.10}
"""

GOOD_TASK = """\
- name: a file
  copy:
    dest: /tmp/x
    content: "x"
"""


@pytest.fixture(autouse=True)
def no_connections(monkeypatch):
    """Any attempt to open a connection fails the test: bad input must stop before that."""

    def refuse(self, host):
        raise AssertionError(f"a connection to {host} was attempted")

    monkeypatch.setattr(session_mod.DeploySession, "open_connection", refuse)


def write_site(tmp_path: Path, tasks: str, *, handlers: str = "", templates: dict | None = None,
               site: str | None = None, defaults: str = "") -> Path:  # fmt: skip
    role = tmp_path / "roles" / "r"
    (role / "tasks").mkdir(parents=True)
    (role / "tasks" / "main.yml").write_text(textwrap.dedent(tasks))
    if handlers:
        (role / "handlers").mkdir()
        (role / "handlers" / "main.yml").write_text(textwrap.dedent(handlers))
    if defaults:
        (role / "defaults").mkdir()
        (role / "defaults" / "main.yml").write_text(defaults)
    for name, text in (templates or {}).items():
        (role / "templates").mkdir(exist_ok=True)
        (role / "templates" / name).write_text(text)
    site_file = tmp_path / "site.yml"
    site_file.write_text(site or "- hosts: all\n  roles: [r]\n")
    (tmp_path / "inv.yml").write_text(INVENTORY)
    return site_file


def run_up(tmp_path: Path, site: Path, *extra: str):
    _register_subcommands()
    return CliRunner().invoke(
        cli, ["up", "-i", str(tmp_path / "inv.yml"), "--site", str(site), *extra]
    )


CASES = [
    # (id, tasks, kwargs, expected fragments of the error)
    ("unknown module", "- name: x\n  copi:\n    dest: /tmp/x\n", {}, ["tasks/main.yml:2", "copi"]),
    (
        "two modules",
        "- copy: {dest: /a, content: b}\n  file: {path: /a}\n",
        {},
        ["tasks/main.yml:1", "exactly one module"],
    ),
    (
        "unknown argument",
        "- name: x\n  copy:\n    dest: /tmp/x\n    content: y\n    colour: red\n",
        {},
        ["tasks/main.yml:5", "copy.colour"],
    ),
    (
        "missing argument",
        "- name: x\n  copy:\n    content: y\n",
        {},
        ["tasks/main.yml", "copy.dest", "required"],
    ),
    (
        "wrong type",
        "- name: x\n  copy:\n    dest: /tmp/x\n    content: y\n    secret: maybe\n",
        {},
        ["copy.secret"],
    ),
    (
        "integer mode",
        "- name: x\n  copy:\n    dest: /tmp/x\n    content: y\n    mode: 0644\n",
        {},
        ["copy.mode", "quoted"],
    ),
    (
        "relative path",
        "- name: x\n  copy:\n    dest: tmp/x\n    content: y\n",
        {},
        ["copy.dest", "absolute"],
    ),
    (
        "undefined variable",
        "- name: x\n  copy:\n    dest: /tmp/x\n    content: '{{ nope }}'\n",
        {},
        ["tasks/main.yml:4", "nope"],
    ),
    (
        "undefined in when",
        "- name: x\n  copy: {dest: /tmp/x, content: y}\n  when: nope > 1\n",
        {},
        ["tasks/main.yml", "when", "nope"],
    ),
    (
        "when not boolean",
        "- name: x\n  copy: {dest: /tmp/x, content: y}\n  when: '\"text\"'\n",
        {},
        ["when", "true or false"],
    ),
    (
        "loop not a list",
        "- name: x\n  copy: {dest: /tmp/x, content: y}\n  loop: 5\n",
        {},
        ["tasks/main.yml", "loop"],
    ),
    (
        "unknown handler",
        "- name: x\n  copy: {dest: /tmp/x, content: y}\n  notify: restart it\n",
        {},
        ["notifies unknown handler", "restart it"],
    ),
    (
        "template undefined",
        "- name: x\n  template: {src: t.j2, dest: /tmp/x}\n",
        {"templates": {"t.j2": "a\n{{ missing_var }}\n"}},
        ["t.j2:2", "missing_var"],
    ),
    (
        "template syntax",
        "- name: x\n  template: {src: t.j2, dest: /tmp/x}\n",
        {"templates": {"t.j2": "{% for %}\n"}},
        ["t.j2:1", "syntax"],
    ),
    (
        "template missing",
        "- name: x\n  template: {src: nothere.j2, dest: /tmp/x}\n",
        {},
        ["nothere.j2", "not found"],
    ),
    ("command without guard", "- name: x\n  command: rm -rf /tmp/y\n", {}, ["command"]),
    ("tasks not a list", "name: x\n", {}, ["tasks/main.yml", "list of tasks"]),
    ("bad yaml", "- name: x\n  copy: {dest: /tmp/x\n", {}, ["tasks/main.yml", "invalid YAML"]),
    (
        "duplicate handler",
        GOOD_TASK,
        {
            "handlers": "- name: h\n  copy: {dest: /a, content: b}\n- name: h\n  copy: {dest: /b, content: b}\n"
        },
        ["handlers/main.yml:3", "duplicate handler"],
    ),
    (
        "unknown role",
        GOOD_TASK,
        {"site": "- hosts: all\n  roles: [missing]\n"},
        ["role 'missing' not found"],
    ),
    (
        "bad play keyword",
        GOOD_TASK,
        {"site": "- hosts: all\n  roles: [r]\n  become_method: su\n"},
        ["site.yml:3", "become_method"],
    ),
    (
        "bad serial",
        GOOD_TASK,
        {"site": "- hosts: all\n  roles: [r]\n  serial: -1\n"},
        ["site.yml:3", "serial"],
    ),
]


@pytest.mark.parametrize(
    ("tasks", "kwargs", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_role_content_is_refused_with_exit_2_and_names_where(
    tmp_path, tasks, kwargs, fragments
):
    site = write_site(tmp_path, tasks, **kwargs)
    result = run_up(tmp_path, site)
    assert result.exit_code == 2, result.output
    for fragment in fragments:
        assert fragment in result.output
    assert "no host was contacted" in result.output


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--limit", "nosuchhost"], "nosuchhost"),
        (["-e", "@/does/not/exist.yml"], "exist.yml"),
        (["-e", "not a pair"], "not a pair"),
    ],
    ids=["limit matches nothing", "missing extra-vars file", "malformed extra var"],
)
def test_bad_flags_are_refused_with_exit_2(tmp_path, flags, fragment):
    site = write_site(tmp_path, GOOD_TASK)
    result = run_up(tmp_path, site, *flags)
    assert result.exit_code == 2, result.output
    assert fragment in result.output


def test_check_offline_refuses_an_incompatible_plan_without_contacting_hosts(tmp_path):
    (tmp_path / "inv.yml").write_text(
        "all:\n  children:\n    gpu:\n      hosts:\n"
        "        g4: {ansible_host: 192.0.2.4, gpu_model: V100, gpu_count: 8,"
        " nvidia_driver_branch: '595'}\n"
    )
    _register_subcommands()
    result = CliRunner().invoke(cli, ["check", "-i", str(tmp_path / "inv.yml"), "--offline"])
    assert result.exit_code == 2, result.output
    assert "g4" in result.output and "V100" in result.output
