"""``status`` checks of the long-term store, the remote writes and the global view, on canned
HTTP answers (the same checks run for real in tests/integration/test_global_view.py)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

import pytest

from deployer.monitoring import store as ss
from deployer.monitoring.http import Response

STORE = ss.Store("mon01", "http://10.0.0.5:8428", "15s", "1y")
WRITE_URL = "http://10.0.0.5:8428/api/v1/write"
AUTH = {"Authorization": "Basic d3JpdGVyOnNlY3JldA=="}


def expectation(**over: Any) -> ss.StoreExpectation:
    exp = ss.StoreExpectation(
        stores=[STORE],
        writers=[
            ss.Writer("prom01", "http://10.0.0.1:9090", {WRITE_URL: "mon01"}, 120.0),
            ss.Writer("prom02", "http://10.0.0.2:9090", {WRITE_URL: "mon01"}, 120.0),
        ],
        view="victoriametrics",
        view_url="http://10.0.0.5:8428",
        gpus={"gpu01": 2, "gpu02": 1},
        cluster_nodes={"lab": {"gpu01", "gpu02"}},
        headers=dict(AUTH),
        scrape_interval="15s",
    )
    for k, v in over.items():
        setattr(exp, k, v)
    return exp


def replica_metrics(newest: float, sent: float, started: float = 1_000.0) -> str:
    labels = f'remote_name="store-mon01",url="{WRITE_URL}"'
    return "\n".join(
        [
            "# HELP prometheus_remote_storage_highest_timestamp_in_seconds x",
            f"prometheus_remote_storage_highest_timestamp_in_seconds {newest}",
            f"prometheus_remote_storage_queue_highest_sent_timestamp_seconds{{{labels}}} {sent}",
            f"prometheus_remote_storage_samples_pending{{{labels}}} 12",
            f"prometheus_remote_storage_shards{{{labels}}} 1",
            f"process_start_time_seconds {started}",
        ]
    )


def vector(*rows: tuple[dict[str, str], str]) -> str:
    return json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": m, "value": [0, v]} for m, v in rows],
            },
        }
    )


def loaded_config(interval: str) -> str:
    text = f"global:\n  scrape_interval: {interval}\n  external_labels: {{cluster: lab}}\n"
    return json.dumps({"status": "success", "data": {"yaml": text}})


GOOD_GPUS = vector(
    ({"node": "gpu01", "UUID": "GPU-a"}, "1"),
    ({"node": "gpu01", "UUID": "GPU-b"}, "1"),
    ({"node": "gpu02", "UUID": "GPU-c"}, "1"),
)


class Canned:
    """A fetch answering by path (and query), recording the headers of every request."""

    def __init__(self, answers: Mapping[str, Response]) -> None:
        self.answers = dict(answers)
        self.seen: list[tuple[str, dict[str, str]]] = []

    def __call__(self, url: str, headers: Mapping[str, str]) -> Response:
        self.seen.append((url, dict(headers)))
        parts = urllib.parse.urlsplit(url)
        key = parts.netloc + parts.path
        q = urllib.parse.parse_qs(parts.query).get("query")
        if q and f"{key}?{q[0]}" in self.answers:
            return self.answers[f"{key}?{q[0]}"]
        return self.answers.get(key, Response(0, error=f"no answer from {url}"))


def healthy_stack(**over: Response) -> Canned:
    answers = {
        "10.0.0.5:8428/health": Response(200, "OK"),
        "10.0.0.5:8428/flags": Response(
            200,
            '-dedup.minScrapeInterval="15s"\n-retentionPeriod="1y"\n-httpAuth.password="secret"\n',
        ),
        "10.0.0.1:9090/api/v1/status/config": Response(200, loaded_config("15s")),
        "10.0.0.2:9090/api/v1/status/config": Response(200, loaded_config("15s")),
        "10.0.0.1:9090/metrics": Response(200, replica_metrics(2_000.0, 1_995.0)),
        "10.0.0.2:9090/metrics": Response(200, replica_metrics(2_000.0, 1_990.0)),
        "10.0.0.5:8428/api/v1/query?vector(1)": Response(200, vector(({}, "1"))),
        f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}": Response(200, GOOD_GPUS),
        f"10.0.0.5:8428/api/v1/query?count by (cluster) ({ss.GPU_METRIC})": Response(
            200, vector(({"cluster": "lab"}, "3"))
        ),
    }
    answers.update(over)
    return Canned(answers)


def by_check(checks: list[Any]) -> dict[tuple[str, str, str], Any]:
    return {(c.component, c.host, c.check): c for c in checks}


def test_a_healthy_store_pair_and_view_are_all_green():
    checks = ss.collect(expectation(), healthy_stack())
    assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    got = by_check(checks)
    assert got[("remote write", "prom01", "to mon01")].detail == "lag 5s (shards 1, pending 12)"
    assert got[("global view", "victoriametrics", "every GPU once")].detail.startswith("3 GPUs")


def test_remote_write_lag_beyond_the_limit_fails_naming_the_replica():
    fetch = healthy_stack(**{"10.0.0.2:9090/metrics": Response(200, replica_metrics(2_000, 1_700))})
    got = by_check(ss.collect(expectation(), fetch))
    bad = got[("remote write", "prom02", "to mon01")]
    assert not bad.ok and bad.detail.startswith("lag 300s, more than 120s")
    assert got[("remote write", "prom01", "to mon01")].ok


def test_a_replica_without_a_queue_to_the_store_fails():
    fetch = healthy_stack(
        **{
            "10.0.0.1:9090/metrics": Response(
                200, "prometheus_remote_storage_highest_timestamp_in_seconds 5"
            )
        }
    )
    bad = by_check(ss.collect(expectation(), fetch))[("remote write", "prom01", "to mon01")]
    assert not bad.ok and WRITE_URL in bad.detail


def test_a_just_started_replica_that_sent_nothing_yet_is_pending_not_failed():
    young = replica_metrics(2_000.0, 0.0, started=1_950.0)
    old = replica_metrics(2_000.0, 0.0, started=100.0)
    writer = expectation().writers[0]
    fetch = healthy_stack(**{"10.0.0.1:9090/metrics": Response(200, young)})
    row = ss.check_writer(expectation(), writer, fetch, now=2_000.0)[0]
    assert row.state == "pending" and "replica just started" in row.detail
    fetch = healthy_stack(**{"10.0.0.1:9090/metrics": Response(200, old)})
    assert not ss.check_writer(expectation(), writer, fetch, now=2_000.0)[0].ok


def test_a_gpu_seen_twice_means_the_pair_was_not_deduplicated():
    twice = vector(
        ({"node": "gpu01", "UUID": "GPU-a"}, "2"),
        ({"node": "gpu01", "UUID": "GPU-b"}, "1"),
        ({"node": "gpu02", "UUID": "GPU-c"}, "1"),
    )
    fetch = healthy_stack(
        **{f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}": Response(200, twice)}
    )
    bad = by_check(ss.collect(expectation(), fetch))[
        ("global view", "victoriametrics", "every GPU once")
    ]
    assert not bad.ok and "gpu01 GPU-a x2" in bad.detail


def test_a_mig_gpu_is_one_gpu_with_one_series_per_gpu_instance():
    # the exporter's MIG shape (real 8xA800 scrape): one series per GPU instance, one UUID
    mig = vector(
        ({"node": "gpu01", "UUID": "GPU-a", "GPU_I_ID": "1"}, "1"),
        ({"node": "gpu01", "UUID": "GPU-a", "GPU_I_ID": "2"}, "1"),
        ({"node": "gpu01", "UUID": "GPU-b"}, "1"),
        ({"node": "gpu02", "UUID": "GPU-c"}, "1"),
    )
    url = f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}"
    got = by_check(ss.collect(expectation(), healthy_stack(**{url: Response(200, mig)})))
    assert got[("global view", "victoriametrics", "every GPU once")].ok


ROLLOUT = "out of service in upgrade-driver run 20261205T200000Z-ab12 (rebooting)"


@pytest.mark.parametrize(
    ("away", "state", "said"),
    [
        ({"gpu01": ROLLOUT}, "pending", f"gpu01 0/2 ({ROLLOUT})"),
        # another host short too: that one is no rollout's doing
        ({"gpu02": ROLLOUT}, "failed", "gpu01 0/2"),
        ({}, "failed", "gpu01 0/2"),
    ],
    ids=["only-the-host-out-of-service", "another-host-short", "no-rollout"],
)
def test_gpus_missing_only_of_hosts_a_rollout_has_out_of_service_are_pending(away, state, said):
    only_gpu02 = vector(({"node": "gpu02", "UUID": "GPU-c"}, "1"))
    fetch = healthy_stack(
        **{f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}": Response(200, only_gpu02)}
    )
    row = by_check(ss.collect(expectation(out_of_service=away), fetch))[
        ("global view", "victoriametrics", "every GPU once")
    ]
    assert (row.state, row.detail) == (state, said)


def test_a_gpu_counted_twice_fails_whatever_a_rollout_has_out_of_service():
    twice = vector(
        ({"node": "gpu01", "UUID": "GPU-a"}, "2"), ({"node": "gpu02", "UUID": "GPU-c"}, "1")
    )
    fetch = healthy_stack(
        **{f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}": Response(200, twice)}
    )
    exp = expectation(out_of_service={"gpu01": ROLLOUT})
    row = by_check(ss.collect(exp, fetch))[("global view", "victoriametrics", "every GPU once")]
    assert row.state == "failed" and "more than one series for gpu01 GPU-a x2" in row.detail


def test_a_missing_gpu_and_a_missing_cluster_fail():
    one_less = vector(
        ({"node": "gpu01", "UUID": "GPU-a"}, "1"), ({"node": "gpu02", "UUID": "GPU-c"}, "1")
    )
    fetch = healthy_stack(
        **{
            f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}": Response(200, one_less),
        }
    )
    got = by_check(
        ss.collect(expectation(cluster_nodes={"lab": {"gpu01", "gpu02"}, "dc2": {"gpu03"}}), fetch)
    )
    assert got[("global view", "victoriametrics", "every GPU once")].detail == "gpu01 1/2"
    assert got[("global view", "victoriametrics", "every cluster")].detail == "missing: dc2"


@pytest.mark.parametrize(
    ("away", "state", "said"),
    [
        ({"gpu03": ROLLOUT}, "pending", f"missing: dc2 (gpu03 {ROLLOUT})"),
        # dc2 has another node the rollout does not have: that one should report
        ({"gpu03": ROLLOUT, "gpu01": ROLLOUT}, "failed", "missing: dc2"),
        ({}, "failed", "missing: dc2"),
    ],
    ids=["every-node-of-it-out-of-service", "a-node-of-it-not", "no-rollout"],
)
def test_a_cluster_missing_only_because_a_rollout_has_all_its_nodes_away_is_pending(
    away, state, said
):
    """A rollout of a cluster of one GPU host (or of a whole small cluster, --batch-size) takes
    the cluster's every series away while its hosts reboot."""
    both = vector(
        ({"node": "gpu01", "UUID": "GPU-a"}, "1"),
        ({"node": "gpu01", "UUID": "GPU-b"}, "1"),
        ({"node": "gpu02", "UUID": "GPU-c"}, "1"),
    )
    fetch = healthy_stack(
        **{f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}": Response(200, both)}
    )
    nodes = {"lab": {"gpu01"}, "dc2": {"gpu02", "gpu03"} if "gpu01" in away else {"gpu03"}}
    exp = expectation(cluster_nodes=nodes, out_of_service=away)
    row = by_check(ss.collect(exp, fetch))[("global view", "victoriametrics", "every cluster")]
    assert (row.state, row.detail) == (state, said)


def test_store_requests_carry_its_credentials_and_no_detail_shows_them():
    fetch = healthy_stack(**{"10.0.0.5:8428/health": Response(0, error="no answer from x")})
    checks = ss.collect(expectation(), fetch)
    queries = [h for url, h in fetch.seen if "/api/v1/query" in url]
    assert queries and all(h == AUTH for h in queries)
    assert all(h == {} for url, h in fetch.seen if url.endswith(("/metrics", "/health", "/flags")))
    text = json.dumps([c.__dict__ for c in checks])
    assert "d3JpdGVyOnNlY3JldA" not in text and "secret" not in text


def test_a_store_running_another_dedup_interval_fails():
    fetch = healthy_stack(
        **{"10.0.0.5:8428/flags": Response(200, '-dedup.minScrapeInterval="1m"\n')}
    )
    bad = by_check(ss.collect(expectation(), fetch))[
        ("metrics store", "mon01", "deduplicates the pair")
    ]
    assert not bad.ok and "the inventory says 15s" in bad.detail


def test_thanos_view_is_queried_without_the_store_credentials():
    exp = expectation(view="thanos", view_url="http://10.0.0.9:19192")
    answers = {
        k.replace("10.0.0.5:8428/api", "10.0.0.9:19192/api"): v
        for k, v in healthy_stack().answers.items()
    }
    fetch = Canned({**healthy_stack().answers, **answers})
    assert all(c.ok for c in ss.collect(exp, fetch))
    assert all(h == {} for url, h in fetch.seen if "19192" in url)


def test_nothing_is_checked_without_store_or_view():
    assert ss.collect(ss.StoreExpectation(), healthy_stack()) == []


# ---------------------------------------------------------------- the expectation


def variables_of_for(**prom_over: Any):
    hostvars = {
        "gpu01": {"gpu_count": 2, "cluster": "c1"},
        "gpu02": {"gpu_count": 1},
        "mon01": {"ansible_host": "10.0.0.5"},
    }
    prom = {
        "ansible_host": "10.0.0.1",
        "prometheus_port": 9090,
        "prometheus_scrape_interval": "15s",
        "prometheus_cluster": "pair",
        "prometheus_gpu_group": "gpu",
        "prometheus_remote_write_enabled": True,
        "prometheus_remote_write_max_lag": "2m",
        "metrics_store_group": "metrics_store",
        "metrics_store_port": 8428,
        "metrics_store_scheme": "http",
        "metrics_store_username": "",
        "metrics_store_password": "",
        "gpumon_global_view": "auto",
        "gpumon_global_view_url": "",
        "groups": {"gpu": ["gpu01", "gpu02"], "metrics_store": ["mon01"]},
        "hostvars": hostvars,
        **prom_over,
    }
    store = {
        "ansible_host": "10.0.0.5",
        "metrics_store_scheme": "http",
        "metrics_store_port": 8428,
        "victoriametrics_dedup_min_scrape_interval": "15s",
        "victoriametrics_retention_period": "1y",
        "victoriametrics_backup_enabled": "True",
        "victoriametrics_backup_interval": "1h 30min",
    }
    query = {"ansible_host": "10.0.0.9", "thanos_active": False, "thanos_query_http_port": 19192}

    def variables_of(role: str) -> dict[str, Any]:
        return {
            "prometheus": {"prom01": prom},
            "victoriametrics": {"mon01": store},
            "thanos_query": {"mon02": query},
        }.get(role, {})

    return variables_of, query


def test_expectation_from_the_roles_variables():
    variables_of, _ = variables_of_for()
    exp = ss.expect(variables_of)
    assert exp.stores == [STORE]
    assert exp.writers[0].queues == {WRITE_URL: "mon01"}
    assert exp.writers[0].max_lag_s == 120
    assert exp.gpus == {"gpu01": 2, "gpu02": 1}
    # gpu02 has no cluster host var: its series carry the replicas' external label
    assert exp.clusters == {"c1", "pair"}
    assert exp.cluster_nodes == {"c1": {"gpu01"}, "pair": {"gpu02"}}
    assert (exp.view, exp.view_url) == ("victoriametrics", "http://10.0.0.5:8428")
    assert exp.headers == {}
    assert exp.backups == {"mon01": 5400}


def test_auto_prefers_thanos_query_where_thanos_runs():
    variables_of, query = variables_of_for()
    query["thanos_active"] = True
    assert ss.expect(variables_of).view_url == "http://10.0.0.9:19192"


def test_the_global_view_url_can_be_given():
    variables_of, _ = variables_of_for(gpumon_global_view_url="https://metrics.example/")
    assert ss.expect(variables_of).view_url == "https://metrics.example"


def test_an_unknown_global_view_is_an_input_error():
    from deployer.errors import InputError

    variables_of, _ = variables_of_for(gpumon_global_view="grafana")
    with pytest.raises(InputError, match="gpumon_global_view"):
        ss.expect(variables_of)


def test_credentials_become_a_basic_auth_header():
    variables_of, _ = variables_of_for(
        metrics_store_username="writer", metrics_store_password="secret"
    )
    assert ss.expect(variables_of).headers == AUTH


def test_metrics_text_is_parsed_with_labels():
    text = 'a_total{url="http://x/y",remote_name="s"} 3\nb 1.5e+09\n# c 2\nc{q="a\\"b"} NaN'
    got = ss.parse_metrics(text, {"a_total", "b", "c"})
    assert got[0] == ("a_total", {"url": "http://x/y", "remote_name": "s"}, 3.0)
    assert got[1] == ("b", {}, 1.5e9)
    assert got[2][0] == "c"


def test_a_store_deduplicating_at_an_interval_the_replicas_do_not_run_fails():
    # the inventory says 5s and the store runs it, but a replica refused that config
    exp = expectation(stores=[ss.Store("mon01", "http://10.0.0.5:8428", "5s", "1y")])
    fetch = healthy_stack(
        **{
            "10.0.0.5:8428/flags": Response(200, '-dedup.minScrapeInterval="5s"\n'),
            "10.0.0.2:9090/api/v1/status/config": Response(200, loaded_config("5s")),
        }
    )
    bad = by_check(ss.collect(exp, fetch))[("metrics store", "mon01", "deduplicates the pair")]
    assert not bad.ok and bad.detail.endswith("the replicas scrape every: prom01 15s")


# ---------------------------------------------------------------- backups


def backup_answers(last: float | None, started: float = 0.0) -> Canned:
    q_last = f'10.0.0.1:9090/api/v1/query?{ss.BACKUP_METRIC}{{node="mon01"}}'
    q_start = (
        '10.0.0.1:9090/api/v1/query?process_start_time_seconds{job="victoriametrics",node="mon01"}'
    )
    return Canned(
        {
            q_last: Response(200, vector(*([({}, str(last))] if last is not None else []))),
            q_start: Response(200, vector(({}, str(started)))),
        }
    )


def test_a_recent_backup_is_green():
    got = ss.check_backup(expectation(), "mon01", 3600, backup_answers(10_000), now=10_600)
    assert got[0].ok and got[0].detail == "last backup 10m ago (every 60m)"


def test_a_backup_older_than_two_intervals_fails():
    got = ss.check_backup(expectation(), "mon01", 3600, backup_answers(0), now=9 * 3600)
    assert not got[0].ok and "more than twice the interval" in got[0].detail


def test_no_backup_yet_is_green_only_during_the_first_interval():
    young = ss.check_backup(expectation(), "mon01", 3600, backup_answers(None, 0), now=1_800)
    assert young[0].ok and young[0].detail.startswith("no backup yet")
    old = ss.check_backup(expectation(), "mon01", 3600, backup_answers(None, 0), now=5 * 3600)
    assert not old[0].ok and old[0].detail.startswith("no successful backup in the 5h00m")


@pytest.mark.parametrize(
    ("span", "want"), [("1h", 3600), ("30min", 1800), ("1h 30min", 5400), ("90", 90)]
)
def test_backup_interval_is_read_as_systemd_reads_it(span, want):
    assert ss.timespan_seconds(span) == want


def test_a_gpu_under_two_shard_labels_is_a_host_that_moved_shards_pending_not_failed():
    # after a re-shard the view still returns the old shard's series for its lookback
    moved = vector(
        ({"node": "gpu01", "UUID": "GPU-a", "shard": "a"}, "1"),
        ({"node": "gpu01", "UUID": "GPU-a", "shard": "b"}, "1"),
        ({"node": "gpu01", "UUID": "GPU-b", "shard": "b"}, "1"),
        ({"node": "gpu02", "UUID": "GPU-c"}, "1"),
        ({"node": "gpu02", "UUID": "GPU-c", "shard": "a"}, "1"),  # one pair became shards
    )
    url = f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}"
    got = by_check(ss.collect(expectation(), healthy_stack(**{url: Response(200, moved)})))
    row = got[("global view", "victoriametrics", "every GPU once")]
    assert row.state == "pending"
    assert "gpu01 GPU-a ('a', 'b')" in row.detail and "gpu02 GPU-c ('', 'a')" in row.detail
    assert f"up to {ss.VIEW_LOOKBACK_S} s" in row.detail


def test_a_gpu_twice_under_one_shard_label_fails_even_while_another_moved():
    both = vector(
        ({"node": "gpu01", "UUID": "GPU-a", "shard": "a"}, "2"),
        ({"node": "gpu01", "UUID": "GPU-b", "shard": "a"}, "1"),
        ({"node": "gpu01", "UUID": "GPU-b", "shard": "b"}, "1"),
        ({"node": "gpu02", "UUID": "GPU-c", "shard": "b"}, "1"),
    )
    url = f"10.0.0.5:8428/api/v1/query?{ss.per_gpu_query('shard')}"
    got = by_check(ss.collect(expectation(), healthy_stack(**{url: Response(200, both)})))
    row = got[("global view", "victoriametrics", "every GPU once")]
    assert row.state == "failed" and "gpu01 GPU-a x2" in row.detail
