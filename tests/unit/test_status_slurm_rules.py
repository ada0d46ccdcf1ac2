"""The queries Slurm-aware ``status`` asks the replicas, evaluated by promtool on the rendered rule
pack over series shaped as a real scrape: the 8x A800 capture whose GPU 0 is in MIG mode with
three GPU instances (``a800_mig_535.129.03_excerpt.metrics``). A MIG GPU is one GPU to status,
with its instances' memory added up and their activity weighted by their compute slices."""

from __future__ import annotations

import pytest

from deployer.monitoring.slurm import FB_RECORD, UTIL_RECORD, usage_queries
from tests.unit.test_rule_pack_reality import (
    A800,
    GPU_HOST,
    gpu0_instances,
    gpu1,
    promtool,
    run,
    series,
    stored,
    target_labels,
)

__all__ = ["promtool"]  # the fixture


def gpu_labels(labels: dict[str, str], node: str = "gpu01") -> str:
    keep = {"node": node, "gpu": labels["gpu"], "UUID": labels["UUID"]}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(keep.items())) + "}"


@pytest.mark.parametrize("agg", ["min", "max"])
def test_a_mig_gpu_is_one_gpu_with_its_instances_memory_added_up(promtool, tmp_path, agg):
    target = target_labels("gpu01", **GPU_HOST)
    # captured: 10 MiB used on each of GPU 0's three 2g.20gb instances, 2 MiB on GPU 1
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": stored(A800, target, only={"DCGM_FI_DEV_FB_USED"}),
                "promql_expr_test": [
                    {
                        "expr": usage_queries("5m")[(FB_RECORD, agg)],
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": gpu_labels(gpu0_instances("Hostname")[0]), "value": 30},
                            {"labels": gpu_labels(gpu1("Hostname")), "value": 2},
                        ],
                    }
                ],
            }
        ],
    )


def test_a_mig_gpu_s_utilization_is_its_instances_activity_by_slices_lowest_over_the_window(
    promtool, tmp_path
):
    target = target_labels("gpu01", **GPU_HOST)
    # GPU 0's instances (2 of 7 slices each) busy at 87.5 %, 50 % and 37.5 % for ten minutes,
    # then idle for the last two: 2 x (0.875 + 0.5 + 0.375) / 7 = 50 % of the GPU, then 0
    activity = [
        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**target, **lb}, f"{v}x10 0x2")
        for lb, v in zip(gpu0_instances("Hostname"), ("0.875", "0.5", "0.375"), strict=True)
    ]
    util = stored(A800, target, only={"DCGM_FI_DEV_GPU_UTIL"}, samples=12)  # GPU 1 at 0 %
    queries = usage_queries("5m")
    gpu0 = gpu_labels(gpu0_instances("Hostname")[0])
    gpu1_ = gpu_labels(gpu1("Hostname"))
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": activity + util,
                "promql_expr_test": [
                    {  # busy for the whole window
                        "expr": queries[(UTIL_RECORD, "min")],
                        "eval_time": "9m",
                        "exp_samples": [
                            {"labels": gpu0, "value": 50},
                            {"labels": gpu1_, "value": 0},
                        ],
                    },
                    {  # idle at the end: no longer busy for the whole window ...
                        "expr": queries[(UTIL_RECORD, "min")],
                        "eval_time": "12m",
                        "exp_samples": [
                            {"labels": gpu0, "value": 0},
                            {"labels": gpu1_, "value": 0},
                        ],
                    },
                    {  # ... nor idle for the whole window
                        "expr": queries[(UTIL_RECORD, "max")],
                        "eval_time": "12m",
                        "exp_samples": [
                            {"labels": gpu0, "value": 50},
                            {"labels": gpu1_, "value": 0},
                        ],
                    },
                ],
            }
        ],
    )
