"""SIMULATED ``nvidia-smi``: what its outputs share -- the N/A forms, the date and timestamp
formats, the driver branch, and the facts of a GPU more than one output prints (Hopper-class,
the remap banks).

The layouts are the ones real nvidia-smi prints: see ``nvidia_smi.py``.
"""

import time

NA = "[N/A]"  # --query-gpu: the value is not supported on this GPU
NO_SENSOR = "N/A"  # --query-gpu temperature.memory on a board without a memory sensor (L40S)
DEPRECATED = "[Requested functionality has been deprecated]"
KEY_WIDTH = 55  # -q: "    Product Name" padded to 55 columns, then ": value"


def branch(driver: str) -> int:
    try:
        return int(driver.split(".")[0])
    except ValueError:
        return 0


def ctime(t: float | None = None) -> str:
    """``Tue Jul 14 09:00:27 2026`` / ``Fri Jul  3 08:33:38 2026`` (day padded with a space)."""
    lt = time.localtime(t)
    return f"{time.strftime('%a %b', lt)} {lt.tm_mday:>2} {time.strftime('%H:%M:%S %Y', lt)}"


def csv_timestamp(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def hopper(g: dict) -> bool:
    return g["architecture"] in ("Hopper", "Blackwell")


def remap_banks(g: dict) -> int:
    """-q "Bank Remap Availability Histogram / Max": 2560 (H100), 3072 (H200), 192 (L40S)."""
    if g["architecture"] == "Ada Lovelace":
        return 192
    if hopper(g):
        return 3072 if g["memory_total_mib"] > 100000 else 2560
    return 640  # docs/unverified.md#gpusim-models
