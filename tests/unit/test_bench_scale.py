"""Lightweight lab hosts' names and addresses, and the planning benchmark's synthetic inventory."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from bench.planning import HOSTS_PER_RACK, inventory_yaml
from deployer.inventory import load_inventory
from deployer.lab.light import MAX_HOSTS, LightError, LightFleet


def test_light_hosts_get_distinct_addresses_inside_the_reserved_subnet():
    fleet = LightFleet("bench")
    addresses = {fleet.host(i).address for i in range(1, MAX_HOSTS + 1)}
    assert len(addresses) == MAX_HOSTS
    assert all(ipaddress.IPv4Address(a) in fleet.subnet for a in addresses)
    assert fleet.gateway not in addresses


def test_light_interface_names_fit_the_kernel_limit():
    fleet = LightFleet("abcdef")
    assert len(fleet.veth(MAX_HOSTS)) <= 15
    assert len(fleet.bridge) <= 15


def test_light_fleet_names_are_short_and_plain():
    with pytest.raises(LightError):
        LightFleet("bench-1")
    with pytest.raises(LightError):
        LightFleet("toolongname")


def test_synthetic_inventory_has_every_gpu_host_in_racks_and_the_monitoring_groups(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(inventory_yaml(70))
    inv = load_inventory(path)
    assert len(inv.group_hosts("gpu")) == 70
    assert len([g for g in inv.groups if g.startswith("rack")]) == -(-70 // HOSTS_PER_RACK)
    assert inv.group_hosts("prometheus") == ["prom01", "prom02"]
    assert inv.hosts["gpu000000"].vars["gpu_count"] == 8


def test_the_flat_synthetic_inventory_lists_every_gpu_host_in_gpu_itself(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(inventory_yaml(70, "flat"))
    inv = load_inventory(path)
    assert inv.groups["gpu"].hosts == [f"gpu{i:06d}" for i in range(70)]
    assert not [g for g in inv.groups if g.startswith("rack")]
    assert inv.group_hosts("prometheus") == ["prom01", "prom02"]
    assert inv.hosts["gpu000069"].vars["rack"] == "r00002"


def _summary(tool: str, scenario: str, wall: float, rss: float) -> dict:
    return {"tool": tool, "scenario": scenario, "median_wall_s": wall, "median_peak_rss_mib": rss}


@pytest.mark.parametrize(
    ("wall_200", "rss_200", "expected"),
    [
        (6.6, 69.0, ["200 hosts no-op: 6.60 s (target < 10 s: met)",
                     "controller memory: +123 KiB per host (target < 1024 KiB: met)"]),
        (11.1, 300.0, ["200 hosts no-op: 11.10 s (target < 10 s: MISSED)",
                       "controller memory: +1312 KiB per host (target < 1024 KiB: MISSED)"]),
    ],
)  # fmt: skip
def test_scale_verdicts_judge_the_200_host_wall_and_memory_per_host(wall_200, rss_200, expected):
    from bench.scale import verdicts

    result = {
        "summaries": [
            _summary("gpumon", "noop@1", 0.4, 45.0),
            _summary("gpumon", "noop@200", wall_200, rss_200),
            _summary("pyinfra", "noop@200", 20.0, 83.0),
        ]
    }
    assert verdicts(result) == expected


def test_scale_verdicts_say_nothing_without_a_200_host_run():
    from bench.scale import verdicts

    assert verdicts({"summaries": [_summary("gpumon", "noop@10", 0.8, 46.0)]}) == []


def _sysctl_dir(tmp_path, thresh2: int, thresh3: int):
    d = tmp_path / "neigh"
    d.mkdir()
    (d / "gc_thresh2").write_text(f"{thresh2}\n")
    (d / "gc_thresh3").write_text(f"{thresh3}\n")
    return d


def test_a_thousand_light_hosts_raise_the_arp_table_past_two_entries_per_host(tmp_path):
    # Debian 12's defaults (512 / 1024) overflowed at about 700 hosts of a 1,000-host fleet.
    from deployer.lab.light import raise_neighbour_limits

    d = _sysctl_dir(tmp_path, 512, 1024)
    now = raise_neighbour_limits(1000, sysctl=d)
    assert now["gc_thresh3"] >= 4000 and now["gc_thresh2"] >= 2000
    assert int((d / "gc_thresh3").read_text()) == now["gc_thresh3"]


def test_light_hosts_never_lower_the_arp_table_limits(tmp_path):
    from deployer.lab.light import raise_neighbour_limits

    d = _sysctl_dir(tmp_path, 100000, 200000)
    assert raise_neighbour_limits(10, sysctl=d) == {"gc_thresh2": 100000, "gc_thresh3": 200000}
    assert (d / "gc_thresh3").read_text() == "200000\n"


def _fake_fleet(tmp_path, monkeypatch, sshd_script: str):
    """A light fleet whose network and sshd are stand-ins: ``sshd_script`` is run (no namespace)
    with its output in the host's sshd.log, as the real start does."""
    import subprocess

    from deployer.lab import light

    monkeypatch.setenv("GPUMON_LAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(light, "PRIVSEP_DIR", tmp_path / "privsep")
    monkeypatch.setattr(
        light.network, "ip", lambda *a, check=True: subprocess.CompletedProcess(a, 0, "[]", "")
    )
    monkeypatch.setattr(light.network, "link_exists", lambda name: False)
    monkeypatch.setattr(light, "raise_neighbour_limits", lambda count: {})
    fake = tmp_path / "sshd"
    fake.write_text(f"#!/bin/sh\n{sshd_script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(light, "ensure_sshd", lambda: (fake, fake))

    def start(self, h, sshd, sftp):
        with open(self.dir / "hosts" / h.name / "sshd.log", "ab") as log:
            return subprocess.Popen([str(sshd)], stdout=log, stderr=log)

    monkeypatch.setattr(light.LightFleet, "_start_sshd", start)
    return light.LightFleet("tst", "10.214.40.0/24")


def test_a_failed_light_start_names_a_log_that_outlives_the_teardown(tmp_path, monkeypatch):
    fleet = _fake_fleet(
        tmp_path,
        monkeypatch,
        "echo 'sshd: error while loading shared libraries: libwrap.so.0' >&2; exit 127",
    )
    with pytest.raises(LightError) as failed:
        fleet.up(2, ready_timeout=30)
    fleet.down()  # what the CLI and bench.scale do after a failed start
    assert not fleet.dir.exists()
    named = [w.rstrip(")") for w in str(failed.value).split() if w.endswith("sshd.log)")]
    assert named and Path(named[0]).is_file()
    assert "libwrap.so.0" in Path(named[0]).read_text()


def test_a_light_sshd_that_exits_fails_the_start_at_once_with_its_last_log_line(
    tmp_path, monkeypatch
):
    import time

    fleet = _fake_fleet(tmp_path, monkeypatch, "echo 'Bad configuration option: Foo' >&2; exit 255")
    began = time.monotonic()
    with pytest.raises(LightError, match="exit status 255: Bad configuration option: Foo"):
        fleet.up(1, ready_timeout=30)
    fleet.down()
    assert time.monotonic() - began < 20  # not the 30 s ready timeout


def test_an_sshd_lacking_a_library_is_refused_naming_the_debian_package(tmp_path, monkeypatch):
    from deployer.lab import light

    monkeypatch.setattr(light, "missing_libraries", lambda binary: ["libwrap.so.0"])
    with pytest.raises(LightError, match=r"lacks libwrap\.so\.0 \(Debian package\(s\): libwrap0"):
        light.check_libraries(tmp_path / "sshd")


def test_missing_libraries_reads_ldd_not_found_lines(tmp_path, monkeypatch):
    import subprocess

    from deployer.lab import light

    out = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibwrap.so.0 => not found\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n"
    )
    monkeypatch.setattr(
        light.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, "")
    )
    assert light.missing_libraries(tmp_path / "sshd") == ["libwrap.so.0"]


def test_scale_verdicts_judge_the_200_host_ratios_to_mitogen_and_pyinfra():
    from bench.scale import verdicts

    result = {
        "summaries": [
            _summary("gpumon", "noop@200", 6.0, 69.0),
            _summary("mitogen", "noop@200", 90.0, 80.0),
            _summary("gpumon", "cold@200", 16.0, 69.0),
            _summary("mitogen", "cold@200", 32.0, 80.0),
            _summary("pyinfra", "cold@200", 40.0, 83.0),
        ]
    }
    assert verdicts(result)[1:4] == [
        "200 hosts noop: 15.0x faster than mitogen (target >= 12x: met)",
        "200 hosts cold: 2.0x faster than mitogen (target >= 2.5x: MISSED)",
        "200 hosts cold: 2.5x faster than pyinfra (target >= 2x: met)",
    ]


def test_mitogen_runs_ansibles_configuration_with_the_mitogen_linear_strategy(
    tmp_path, monkeypatch
):
    from bench import tools

    strategy = tmp_path / "ansible_mitogen/plugins/strategy"
    strategy.mkdir(parents=True)
    monkeypatch.setattr(tools, "mitogen_strategy_dir", lambda: strategy)
    fleet = tools.Fleet((tools.Target("h1", "10.0.0.1"),), tmp_path / "key", tmp_path / "kh")
    cfg = tools.write_mitogen_cfg(fleet, tmp_path).read_text()
    plain = tools.write_ansible_cfg(fleet, tmp_path).read_text()
    assert f"strategy_plugins = {strategy}\nstrategy = mitogen_linear\n" in cfg
    assert cfg.replace(f"strategy_plugins = {strategy}\nstrategy = mitogen_linear\n", "") == plain


def test_converge_judges_cold_runs_against_mitogen_and_pyinfra():
    from bench.converge import render

    summaries = [
        {"tool": t, "scenario": sc, "median_wall_s": w, "median_cpu_s": 0.1,
         "median_peak_rss_mib": 50.0, "runs": 1}
        for t, sc, w in (("gpumon", "cold", 3.0), ("mitogen", "cold", 6.0),
                         ("pyinfra", "cold", 6.3))
    ]  # fmt: skip
    result = {
        "summaries": summaries,
        "ratios": {"noop": {}, "cold": {"mitogen": 2.0, "pyinfra": 2.1}},
        "suspect_runs": [],
    }
    text = render(result)
    assert "cold: gpumon-deploy is 2.0x faster than mitogen (target >= 2.5x: MISSED)" in text
    assert "cold: gpumon-deploy is 2.1x faster than pyinfra (target >= 2x: met)" in text


def test_ansible_and_mitogen_get_a_connection_timeout_long_enough_for_mitogens_bootstrap(tmp_path):
    # Ansible's default of 10 s is Mitogen's deadline for starting the remote interpreter: at 10
    # and 50 light hosts on the loaded 2-core machine every host failed "Connection timed out."
    import configparser

    from bench import tools

    fleet = tools.Fleet((tools.Target("h1", "10.0.0.1"),), tmp_path / "key", tmp_path / "kh")
    cfg = configparser.ConfigParser()
    cfg.read(tools.write_ansible_cfg(fleet, tmp_path))
    assert int(cfg["defaults"]["timeout"]) >= 60


def test_the_files_workload_resets_light_hosts_here_as_its_ssh_reset_would(tmp_path):
    from bench import tools

    root = tmp_path / "h1"
    (root / "etc/bench/textfile").mkdir(parents=True)
    (root / "etc/keep").mkdir()
    t = tools.Target("h1", "10.0.0.1", vars={"bench_root": str(root)})
    assert tools.files_reset(t) == f"rm -rf {root}/etc/bench"
    tools.files_workload().reset_here(t)
    assert not (root / "etc/bench").exists() and (root / "etc/keep").is_dir()


def test_a_continued_scale_run_merges_the_sizes_it_did_not_measure():
    from bench.scale import merge

    def sample(tool, scenario, wall):
        return {"tool": tool, "scenario": scenario, "wall_s": wall, "cpu_s": 0.1,
                "peak_rss_mib": 50.0, "rc": 0, "changed": 0, "note": ""}  # fmt: skip

    earlier = {"date": "d1", "command": "c1", "sizes": [1, 10], "suspect_runs": [],
               "samples": [sample("gpumon", "noop@1", 9.0), sample("gpumon", "noop@10", 1.0)]}  # fmt: skip
    later = {"sizes": [1, 1000], "suspect_runs": [],
             "samples": [sample("gpumon", "noop@1", 0.5), sample("gpumon", "noop@1000", 30.0)]}  # fmt: skip
    got = merge(later, earlier)
    walls = {s["scenario"]: s["median_wall_s"] for s in got["summaries"]}
    assert walls == {"noop@1": 0.5, "noop@1000": 30.0, "noop@10": 1.0}
    assert got["sizes"] == [1, 10, 1000] and got["merged_from"]["date"] == "d1"
