"""Runs ansible-core's own command-line tools over inventories, many times in one process.

This script runs under the reference virtualenv's Python (``.venv-ansible``, ansible-core
pinned by ``scripts/setup``), never the product's. It imports ansible once and then, for every
call asked for, forks a child that runs the real command line (``ansible-inventory -i X --list``,
``ansible-inventory -i X --host H``, and, for a batch of patterns on one load of the inventory, what
``ansible all -i X --list-hosts --limit PAT`` computes for each) exactly as the
``ansible-inventory`` / ``ansible`` executables do (``CLI.cli_executor``), with stdout and stderr
captured. A fork per call keeps ansible's process-wide state (its parsed-arguments
singleton, its caches) fresh for every call while paying Python's start-up and ansible's imports
once: a process per call took about a second each.

Reads a JSON request on stdin::

    {"jobs": [{"id": "...", "args": ["-i", "path", ...],
               "calls": [{"kind": "list"} | {"kind": "host", "host": "h"}
                         | {"kind": "limits", "patterns": ["p", ...]}
                         | {"kind": "connections", "hosts": ["h", ...]}]}]}

and writes ``{"results": {id: [{"rc": int, "stdout": str, "stderr": str}, ...]}}`` on stdout,
one result per call in the order asked. The caller sets ``ANSIBLE_*`` in the environment so
that nothing reads the user's configuration.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def _run_forked(main, argv: list[str]) -> dict[str, object]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the command line, as its executable runs it
            code = 255
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                sys.argv = argv
                main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 250
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": rc,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
        }


def _limits(adhoc_cli, patterns: list[str]):
    """For each pattern, on one load of the inventory, what ``AdHocCLI.run`` computes for
    ``--list-hosts`` (``CLI.get_host_list(inventory, subset, pattern)``): ``ansible all
    --list-hosts --limit PAT`` and ``ansible PAT --list-hosts``, each pattern's hosts, warnings
    and error, and ansible's groups (direct hosts, children, in its order) as JSON on stdout. The limit and the pattern cache are reset before each, so one
    answer does not depend on the one before."""

    def run(argv: list[str]) -> None:
        from ansible.cli import CLI
        from ansible.errors import AnsibleError
        from ansible.utils.display import Display

        heard: list[str] = []
        original = Display.warning

        def warning(self, msg, *args, **kwargs):
            heard.append(str(msg))
            return original(self, msg, *args, **kwargs)

        Display.warning = warning
        cli = adhoc_cli(argv)
        # AdHocCLI.run up to its host list: the arguments parsed and the plugin loader set up
        # (CLI.run), then the inventory loaded (_play_prereqs).
        CLI.run(cli)
        _loader, inventory, _vm = cli._play_prereqs()

        def hosts_for(subset, pattern) -> dict[str, object]:
            heard.clear()
            inventory.subset(None)  # as a fresh run finds it: get_host_list looks before it limits
            inventory.clear_pattern_cache()  # else a pattern's warning is heard only once
            try:
                hosts = cli.get_host_list(inventory, subset, pattern)
            except AnsibleError as exc:
                return {"error": str(exc), "warnings": list(heard)}
            names = [h if isinstance(h, str) else h.name for h in hosts]
            return {"hosts": names, "warnings": list(heard)}

        answers = [
            {
                "pattern": pattern,
                # ansible all -i X --list-hosts --limit PATTERN
                "limit": hosts_for(pattern, "all"),
                # ansible PATTERN -i X --list-hosts
                "hosts_pattern": hosts_for(None, pattern),
            }
            for pattern in patterns
        ]
        # The groups as ansible holds them, in its order: each one's direct hosts (all's too,
        # which --list leaves out) and children.
        structure = {
            name: {
                "hosts": [h.name for h in group.hosts],
                "children": [c.name for c in group.child_groups],
            }
            for name, group in inventory.groups.items()
        }
        sys.stdout.write(json.dumps({"patterns": answers, "groups": structure}))
        raise SystemExit(0)

    return run


# The options of the ssh connection plugin that say where and as whom a host is reached.
CONNECTION_OPTIONS = ("host", "port", "remote_user", "private_key_file")


def _connections(adhoc_cli, hosts: list[str]):
    """For each host, on one load of the inventory, the options its ssh connection would get,
    as ``TaskExecutor._set_connection_options`` gives them: every variable the ``ssh`` plugin
    reads (its ``vars:`` aliases, the last one set winning), templated, handed to
    ``set_options``; then ``get_option`` of ``CONNECTION_OPTIONS``; and ``become``
    (``ansible_become``) and the ``sudo`` become plugin's ``become_user``, read the same way; as
    JSON on stdout."""

    def run(argv: list[str]) -> None:
        from ansible import constants as C
        from ansible.cli import CLI
        from ansible.module_utils.parsing.convert_bool import boolean
        from ansible.playbook.play_context import PlayContext
        from ansible.plugins.loader import become_loader, connection_loader
        from ansible.template import Templar

        cli = adhoc_cli(argv)
        CLI.run(cli)
        loader, inventory, variables = cli._play_prereqs()
        connection_loader.get("ssh", PlayContext(), None)  # registers the plugin's options
        names = C.config.get_plugin_vars("connection", "ssh")
        become_loader.get("sudo")
        become_names = C.config.get_plugin_vars("become", "sudo")
        answers = {}
        for name in hosts:
            hostvars = variables.get_vars(host=inventory.get_host(name), include_hostvars=False)
            templar = Templar(loader=loader, variables=hostvars)
            conn = connection_loader.get("ssh", PlayContext(), None)
            given = {k: templar.template(hostvars[k]) for k in names if k in hostvars}
            conn.set_options(var_options=given)
            answers[name] = {o: conn.get_option(o) for o in CONNECTION_OPTIONS}
            # become: the play context's (ansible_become), the sudo plugin's user (its vars)
            sudo = become_loader.get("sudo")
            sudo.set_options(
                var_options={
                    k: templar.template(hostvars[k]) for k in become_names if k in hostvars
                }
            )
            answers[name]["become"] = boolean(
                templar.template(hostvars.get("ansible_become", False))
            )
            answers[name]["become_user"] = sudo.get_option("become_user")
        sys.stdout.write(json.dumps(answers, default=str))
        raise SystemExit(0)

    return run


def _warm_up_before_forking() -> None:
    """What every call loads, loaded once here so that each fork finds it ready: the plugin
    loader with the inventory and vars plugins (finding them reads ansible.builtin's routing
    metadata, most of a call's time). Each call then costs its own work: 0.15 -> 0.05 CPU-s.
    Configuration comes from the environment only, the same for every call, so what is loaded
    here is what each call would load. ``CLI.run`` configures the plugin loader again in each
    fork; that it already is, it says with a Python warning, silenced here."""
    import warnings

    from ansible.plugins.loader import init_plugin_loader, inventory_loader, vars_loader

    init_plugin_loader([])
    warnings.filterwarnings("ignore", message="AnsibleCollectionFinder has already been configured")
    for name in ("host_list", "script", "auto", "yaml", "ini", "toml"):
        inventory_loader.get(name)
    vars_loader.get("host_group_vars")


def main() -> None:
    request = json.load(sys.stdin)
    from ansible.cli.adhoc import AdHocCLI
    from ansible.cli.inventory import InventoryCLI

    _warm_up_before_forking()

    results: dict[str, list[dict[str, object]]] = {}
    for job in request["jobs"]:
        args = list(job["args"])
        answers = []
        for call in job["calls"]:
            if call["kind"] == "list":
                argv = ["ansible-inventory", *args, "--list"]
                answers.append(_run_forked(InventoryCLI.cli_executor, argv))
            elif call["kind"] == "host":
                argv = ["ansible-inventory", *args, "--host", call["host"]]
                answers.append(_run_forked(InventoryCLI.cli_executor, argv))
            elif call["kind"] == "connections":
                argv = ["ansible", "all", *args, "--list-hosts"]
                answers.append(_run_forked(_connections(AdHocCLI, call["hosts"]), argv))
            elif call["kind"] == "limits":
                argv = ["ansible", "all", *args, "--list-hosts"]
                answers.append(_run_forked(_limits(AdHocCLI, call["patterns"]), argv))
            else:
                raise ValueError(f"unknown call {call!r}")
        results[job["id"]] = answers
    json.dump({"results": results}, sys.stdout)


if __name__ == "__main__":
    main()
