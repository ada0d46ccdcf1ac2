"""deployer/gpu/matrix.py and deployer/data/compat.yml on every GPU name the real captures print.

One row per (capture, where in it the name is) -> (the exact name, the model
``compat.model_from_gpu_name`` must give). Beside the name, each capture says something of the
board that compat.yml claims as data, and the test holds the data to it: the compute capability
(nvidia-smi compute_cap), MIG capability (a MIG mode of Enabled/Disabled, MIG devices, or
per-instance exporter series; N/A when the board has none), and whether the board has a memory
temperature sensor (a value, or N/A; a real non-zero DCGM_FI_DEV_MEMORY_TEMP).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from deployer.gpu.matrix import matrix, model_from_gpu_name
from tests.contract.captures import query, section
from tests.reality import capture_text


@dataclass(frozen=True)
class Row:
    capture: str
    where: str  # query-gpu | -L | -q | xml | csv | dcgmi | metrics
    name: str
    model: str | None  # None: a board of no model of the matrix (GeForce)


EXP = "nvidia_gpu_exporter/linux-x86_64__nvidia-{}.txt"
# fmt: off
ROWS = [
    Row(EXP.format("h100-80gb-hbm3__590.48.01"), "query-gpu", "NVIDIA H100 80GB HBM3", "H100"),
    Row(EXP.format("h100-80gb-hbm3__590.48.01"), "-L", "NVIDIA H100 80GB HBM3", "H100"),
    Row(EXP.format("h100-80gb-hbm3__590.48.01"), "-q", "NVIDIA H100 80GB HBM3", "H100"),
    Row(EXP.format("h100-mig__590.48.01"), "query-gpu", "NVIDIA H100 80GB HBM3", "H100"),
    Row(EXP.format("h100-mig__590.48.01"), "-L", "NVIDIA H100 80GB HBM3", "H100"),
    Row(EXP.format("h200__590.48.01"), "query-gpu", "NVIDIA H200", "H200"),
    Row(EXP.format("h200-mig__590.48.01"), "query-gpu", "NVIDIA H200", "H200"),
    Row(EXP.format("h200-mig__590.48.01"), "-L", "NVIDIA H200", "H200"),
    Row(EXP.format("h200-mig__580.173.02"), "query-gpu", "NVIDIA H200", "H200"),  # proposed
    Row(EXP.format("h200-mig__580.173.02"), "-L", "NVIDIA H200", "H200"),  # proposed
    Row(EXP.format("l40s__595.80"), "query-gpu", "NVIDIA L40S", "L40S"),
    Row(EXP.format("l40s__595.80"), "-q", "NVIDIA L40S", "L40S"),
    # proposed: GeForce boards are no model of the matrix (no word of their names is one)
    Row(EXP.format("geforce-rtx-2080-super__595.71.05"), "-L", "NVIDIA GeForce RTX 2080 SUPER", None),
    Row(EXP.format("geforce-rtx-2080-super__610.57.04"), "-q", "NVIDIA GeForce RTX 2080 SUPER", None),
    Row(EXP.format("geforce-rtx-4080-super__595.71.05"), "query-gpu", "NVIDIA GeForce RTX 4080 SUPER", None),
    Row("telegraf/a100-sxm4-v12.xml", "xml", "NVIDIA A100-SXM4-80GB", "A100"),
    Row("telegraf/a10g.xml", "xml", "NVIDIA A10G", "A10"),
    Row("telegraf/tesla-t4.xml", "xml", "Tesla T4", "T4"),
    Row("netdata_go.d.plugin/tesla-p100.xml", "xml", "Tesla P100-PCIE-16GB", "P100"),
    Row("netdata_go.d.plugin/tesla-p100.csv", "csv", "Tesla P100-PCIE-16GB", "P100"),
    Row("dcgmi/discovery-l__dcgm-4.x-active__a10g.txt", "dcgmi", "NVIDIA A10G", "A10"),
    Row("dcgmi/discovery-l__dcgm-3.x__h200.txt", "dcgmi", "NVIDIA H200", "H200"),
    Row("dcgmi/discovery-l__dcgm-2.x__a100-sxm4-40gb.txt", "dcgmi", "A100-SXM4-40GB", "A100"),
    Row("dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics", "metrics", "NVIDIA A800-SXM4-80GB", "A800"),
    Row("dcgm-exporter-metrics/h100x8_580.105.08_excerpt.metrics", "metrics", "NVIDIA H100 80GB HBM3", "H100"),
    Row("dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics", "metrics", "NVIDIA L40S", "L40S"),
]
# fmt: on


def names_in(row: Row) -> set[str]:
    """Every GPU name the capture prints in the place the row names."""
    text = capture_text(row.capture)
    if row.where == "query-gpu":
        return {
            ln
            for ln in query(
                text, "idle :: query-gpu", ["name"], header=False, units=True
            ).splitlines()
        }
    if row.where == "-L":
        return set(
            re.findall(
                r"^GPU \d+: (.+?) \(UUID: ", section(text, "capabilities :: list (-L)"), re.M
            )
        )
    if row.where == "-q":
        return set(
            re.findall(r"^\s+Product Name\s+: (.+?)\s*$", section(text, "idle :: query (-q)"), re.M)
        )
    if row.where == "xml":
        return set(re.findall(r"<product_name>(.+?)</product_name>", text))
    if row.where == "csv":
        return {ln.split(", ")[0] for ln in text.splitlines()[1:] if ln.strip()}
    if row.where == "dcgmi":
        return set(re.findall(r"\| Name: (.+?)\s+\|", text))
    return set(re.findall(r'modelName="([^"]+)"', text))


@pytest.mark.parametrize(
    "row", ROWS, ids=[f"{r.model}-{r.where}-{r.capture.split('/')[-1][:28]}" for r in ROWS]
)
def test_the_name_a_real_capture_prints_is_its_model(row: Row):
    assert names_in(row) == {row.name}
    assert model_from_gpu_name(row.name) == row.model


# --- what the captures say of the board ---------------------------------------------------

SMI = [EXP.format(c) for c in ("h100-80gb-hbm3__590.48.01", "h100-mig__590.48.01", "h200__590.48.01",
                               "h200-mig__590.48.01", "l40s__595.80")]  # fmt: skip
XML = ["telegraf/a100-sxm4-v12.xml", "telegraf/a10g.xml", "telegraf/tesla-t4.xml",
       "netdata_go.d.plugin/tesla-p100.xml"]  # fmt: skip


@pytest.mark.parametrize("path", SMI, ids=[p.split("__")[1] for p in SMI])
def test_compat_data_agrees_with_what_nvidia_smi_prints_of_the_board(path: str):
    fields = ["name", "compute_cap", "mig.mode.current", "temperature.memory", "pci.device_id"]
    line = query(capture_text(path), "idle :: query-gpu", fields, header=False, units=True)
    name, cc, mig, mem_temp, device = line.strip().split(", ")
    model = matrix().models[model_from_gpu_name(name)]
    assert model.compute_capability == cc
    assert model.mig is (mig in ("Enabled", "Disabled"))  # [N/A]: the board has no MIG
    assert model.memory_temp_sensor is (mem_temp not in ("N/A", "[N/A]"))
    assert device[2:6].lower() in model.pci_ids  # 0x233010DE: device 2330, vendor 10DE


@pytest.mark.parametrize("path", XML, ids=[p.split("/")[-1] for p in XML])
def test_compat_data_agrees_with_what_nvidia_smi_xml_prints_of_the_board(path: str):
    text = capture_text(path)
    (name,) = set(re.findall(r"<product_name>(.+?)</product_name>", text))
    model = matrix().models[model_from_gpu_name(name)]
    (mig,) = set(re.findall(r"<current_mig>(.+?)</current_mig>", text))
    (mem_temp,) = set(re.findall(r"<memory_temp>(.+?)</memory_temp>", text))
    assert model.mig is (mig in ("Enabled", "Disabled"))
    assert model.memory_temp_sensor is (mem_temp != "N/A")


def test_compat_data_agrees_with_the_real_a800_mig_scrape():
    text = capture_text("dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics")
    model = matrix().models["A800"]
    assert model.mig and "GPU_I_PROFILE=" in text  # a GPU with MIG instances
    temps = [float(v) for v in re.findall(r"^DCGM_FI_DEV_MEMORY_TEMP\{.*\} (\S+)$", text, re.M)]
    assert model.memory_temp_sensor and min(temps) > 0
