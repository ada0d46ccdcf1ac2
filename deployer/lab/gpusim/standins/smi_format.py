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


# What a driver branch's nvidia-smi prints differently, as the captures show it
# (../shared/gpu_reality_fixtures/nvidia_gpu_exporter: H100/H200 590.48.01, L40S 595.80; the H200
# 580.173.02 capture proposed for it, tests/reality.py PROPOSED). Each simulated branch takes the
# layout of its captured release; before R580 no text capture exists
# (docs/unverified.md#gpusim-smi-q-before-580).


def tlimit_temps(branch: int) -> bool:
    """-q gives temperature thresholds as margins to the T.Limit (``GPU Shutdown T.Limit
    Temp : -8 C``): 580.173.02, 590.48.01 and 595.80 do."""
    return branch >= 580


def r590_deprecations(branch: int) -> bool:
    """Application clocks and ``power.management`` answer "Requested functionality has been
    deprecated", and -q prints ``EDPp Multiplier`` (``edpp_multiplier`` is a query field): from
    590.48.01 on; 580.173.02 prints the clocks and "Enabled", and has neither."""
    return branch >= 590


def inactive_remaps(branch: int) -> bool:
    """-q's ``Inactive Correctable Error`` / ``Inactive Uncorrectable Error`` rows and the fabric
    health's ``Partition Assigned`` (and their query fields): 580.173.02 and 595.80 print them,
    590.48.01 (an older release) does not, so the release decides, not the branch number."""
    return branch == 580 or branch >= 595


def r610_layout(branch: int) -> bool:
    """What 610.43.02 prints and 595.80 does not (H200 and H200 MIG 610.43.02 captures, proposed:
    tests/reality.py PROPOSED): the table's and ``--version``'s ``KMD Version`` / ``CUDA UMD
    Version`` (``DRIVER version`` and ``CUDA version`` "Deprecated, see ..."), -q's ``Driver
    Version`` / ``CUDA Version`` with "[Deprecated; will be removed in CUDA 14.0. ...]" and its own
    ``KMD Version`` / ``CUDA UMD Version`` lines, ``Inforom Time Data``, the temperatures'
    ``... Specification`` names, ``GPU Ceiling Power Limit`` and ``GPU Base Power`` in the power
    readings, and the query fields ``gpu.base.*``, ``bbx.time_run`` and a score of new
    ``power_smoothing.*`` ones."""
    return branch >= 610


def classic_power_smoothing(branch: int) -> bool:
    """The fourteen ``power_smoothing.*`` query fields of R580/R590 (``delayed_..._supported``,
    ``primary_power_floor``, the profiles' floors and multipliers): listed by 580.173.02,
    590.48.01 and 610.43.02; 595.80's ``--help-query-gpu`` lists no ``power_smoothing`` field."""
    return branch != 595


def shared_mig_memory(branch: int) -> bool:
    """-q names a MIG device's memory ``Shared FB Memory Usage`` / ``Shared BAR1 Memory``: 590.48.01
    and 610.43.02 do; 580.173.02 (a newer release than 590.48.01) prints ``FB Memory Usage`` /
    ``BAR1 Memory`` (the table's ``Shared Memory-Usage`` header is the same on all three)."""
    return branch >= 590


def kmd_version(branch: int) -> bool:
    """``kmd_version`` is a query field, answered as ``driver_version`` (which it deprecates:
    "Deprecated; use \"kmd_version\" instead"): 595.80 (``595.80, 595.80``) and 610.43.02 list
    it, 580.173.02 and 590.48.01 do not."""
    return branch >= 595


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
