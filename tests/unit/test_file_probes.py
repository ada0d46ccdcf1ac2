"""A batch of reads answers every file probe in it from one ``stat`` and one ``sha256sum``, and each
probe reads exactly as it reads alone: the same output, whatever the path is (a file, an empty
one, a directory, a link, a dangling link, a FIFO, nothing), under dash (``sh``, as sudo runs it)
and bash (root's login shell)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deployer.connection import CommandResult, LocalConnection
from deployer.hostsession import _batch_script, _split_batch, batch_run
from deployer.modules import probe
from deployer.modules.files import parse_stat, stat_script
from deployer.modules.readout import sections

SHELLS = ("sh", "bash")


class ShellConnection(LocalConnection):
    """Runs commands with ``shell -c``, with ``path_first`` ahead of PATH."""

    def __init__(self, shell: str, path_first: Path | None = None) -> None:
        super().__init__("h1")
        self.shell = shell
        self.path_first = path_first

    def run(self, command: str, **kw: Any) -> CommandResult:
        env = dict(os.environ)
        if self.path_first is not None:
            env["PATH"] = f"{self.path_first}:{env['PATH']}"
        proc = subprocess.run(
            [self.shell, "-c", command], capture_output=True, text=True, env=env, timeout=30
        )
        return CommandResult(command, proc.returncode, proc.stdout, proc.stderr)


def _tree(tmp_path: Path) -> list[Path]:
    (tmp_path / "file").write_text("hello\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "with space 'and quote'").write_text("x")
    os.mkfifo(tmp_path / "fifo")  # [ -f ] is false: never opened (it would block the read)
    names = ["file", "empty", "dir", "to-file", "to-dir", "dangling", "with space 'and quote'",
             "fifo", "missing", "missing-dir/child"]  # fmt: skip
    return [tmp_path / n for n in names]


@pytest.mark.parametrize("shell", SHELLS)
def test_every_probe_reads_in_a_batch_as_it_reads_alone(tmp_path, shell):
    conn = ShellConnection(shell)
    scripts = [
        stat_script(str(p), with_hash) for p in _tree(tmp_path) for with_hash in (True, False)
    ]
    assert all(isinstance(s, probe.FileProbe) for s in scripts)
    together = batch_run(conn, scripts)
    for script, got in zip(scripts, together, strict=True):
        alone = conn.run(script)
        assert got is not None
        assert (got.rc, got.stdout) == (alone.rc, alone.stdout), script.path
    states = {
        Path(s.path).name: parse_stat(r)["state"] for s, r in zip(scripts, together, strict=True)
    }
    assert states == {"file": "file", "empty": "file", "dir": "directory", "to-file": "link",
                      "to-dir": "link", "dangling": "link", "with space 'and quote'": "file",
                      "fifo": "fifo", "missing": "absent", "child": "absent"}  # fmt: skip
    assert parse_stat(together[0])["sha256"] == (
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"  # sha256("hello\n")
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_the_other_reads_of_the_batch_keep_their_own_output_and_status(tmp_path, shell):
    (tmp_path / "a").write_text("a")
    scripts = [
        "echo first; false",
        stat_script(str(tmp_path / "a"), with_hash=True),
        "echo between",
        stat_script(str(tmp_path / "b"), with_hash=True),
        "echo last; (exit 3)",
    ]
    got = batch_run(ShellConnection(shell), scripts)
    assert [(r.rc, r.stdout) for r in got if r is not None][::2] == [
        (1, "first\n"),
        (0, "between\n"),
        (3, "last\n"),
    ]
    assert parse_stat(got[1])["state"] == "file" and parse_stat(got[3]) == {"state": "absent"}


def test_a_batch_of_probes_runs_one_stat_and_one_sha256sum(tmp_path):
    logged = tmp_path / "exec.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("stat", "sha256sum", "readlink"):
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True)
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\necho {tool} >> {logged}\nexec {real.stdout.strip()} "$@"\n')
        wrapper.chmod(0o755)
    files = [tmp_path / f"f{i}" for i in range(8)]
    for f in files:
        f.write_text(f.name)
    (tmp_path / "link").symlink_to(files[0])
    scripts = [stat_script(str(f), with_hash=True) for f in [*files, tmp_path / "link"]]
    got = batch_run(ShellConnection("sh", bin_dir), scripts)
    assert all(parse_stat(r)["state"] in ("file", "link") for r in got if r is not None)
    assert sorted(logged.read_text().split()) == ["readlink", "sha256sum", "stat"]


def test_the_shell_is_left_as_the_batch_found_it(tmp_path):
    scripts = [stat_script(str(tmp_path / n), with_hash=True) for n in ("a", "b")]
    script = "set -- one two\n" + _batch_script(scripts, "t0k") + '\necho "$# $1"\n'
    script += "command -v gpumon_probe_hash || echo unset"
    out = ShellConnection("sh").run(script).stdout
    assert out.endswith("2 one\nunset\n")


def test_a_batch_cut_short_reads_its_probes_again_each_alone(tmp_path):
    scripts = [stat_script(str(tmp_path / n), with_hash=True) for n in ("a", "b")]
    # the shell stopped before the probes' end: none of them is current
    assert _split_batch("@@t0k s /x\ntype=regular file\n", scripts, "t0k") == [None, None]


def test_a_path_sha256sum_would_escape_is_read_alone(tmp_path):
    odd = tmp_path / "back\\slash"
    odd.write_text("x")
    script = stat_script(str(odd), with_hash=True)
    assert not isinstance(script, probe.FileProbe)
    together = batch_run(ShellConnection("sh"), [script, stat_script(str(odd), with_hash=False)])
    assert parse_stat(together[0])["state"] == "file" and "sha256" in parse_stat(together[0])


def test_one_probe_alone_in_a_batch_runs_as_its_own_script(tmp_path):
    one = stat_script(str(tmp_path), with_hash=False)
    assert probe.batched([one, "echo x"]) == []
    assert "probes" not in _batch_script([one, "echo x"], "t0k")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sectioned_read_reads_its_sections_in_a_batch_as_alone(tmp_path, shell):
    """A repository's keyring and source, a unit's files beside ``systemctl show``: the probes
    are answered with the batch's others, the rest runs as the read's own script; the sections
    and the status are what the read gives alone."""
    (tmp_path / "unit").write_text("[Unit]\n")
    conn = ShellConnection(shell)
    unit, dropin = (stat_script(str(tmp_path / n), with_hash=True) for n in ("unit", "drop.in"))
    reads = [
        probe.SectionedRead([("unit", unit), ("dropin", dropin), ("show", "echo State=x; false")]),
        probe.SectionedRead([("first", "echo one; false"), ("unit", unit)]),
        probe.SectionedRead([("keyring", unit), ("source", dropin)]),
        "echo plain",
    ]
    together = batch_run(conn, reads)
    for read, got in zip(reads, together, strict=True):
        alone = conn.run(read)
        assert got is not None
        assert (got.rc, sections(got.stdout)) == (alone.rc, sections(alone.stdout)), read
    assert [r.rc for r in together if r is not None] == [1, 0, 0, 0]
    assert sections(together[0].stdout)["show"] == "State=x"


def test_a_sectioned_read_whose_own_part_is_cut_is_read_again(tmp_path):
    probes = [stat_script(str(tmp_path / n), with_hash=True) for n in ("a", "b")]
    read = probe.SectionedRead([("a", probes[0]), ("show", "echo x")])
    script = _batch_script([read, probes[1]], "t0k")
    # the probes' end came back, the read's own part did not
    cut = ShellConnection("sh").run(script).stdout.split("\n@@t0k 0 ")[0]
    assert _split_batch(cut, [read, probes[1]], "t0k")[0] is None
    assert _split_batch(cut, [read, probes[1]], "t0k")[1] is not None
