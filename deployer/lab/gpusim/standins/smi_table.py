"""SIMULATED ``nvidia-smi``'s default table (its MIG devices and processes blocks) and ``-L``,
column for column as real nvidia-smi prints them (see ``nvidia_smi.py``).
"""

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
    from deployer.lab.gpusim.standins.smi_format import ctime, r610_layout
else:  # installed on a simulated host: the package ships gpusim_*.py
    import gpusim_common as c  # type: ignore[no-redef]
    from gpusim_smi_format import ctime, r610_layout  # type: ignore[no-redef]


# --- -L ---------------------------------------------------------------------------------------


def listing(gpus: list) -> str:
    """``GPU 0: NAME (UUID: GPU-...)`` and, on a GPU in MIG mode, one ``  MIG <profile> Device N:``
    line per compute instance (H100/H200 MIG captures: profile padded to 11, index to 2)."""
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        for gi in c.mig_instances(g):
            for ci in gi["compute_instances"]:
                out.append(
                    f"  MIG {ci['profile']:<11} Device {ci['device']:>2}: (UUID: {ci['uuid']})"
                )
    return "".join(line + "\n" for line in out)


# --- the default table ------------------------------------------------------------------------

RULE89 = "+" + "-" * 89 + "+"
GPU_RULE = (
    "+-----------------------------------------+------------------------+----------------------+"
)
MIG_RULE = (
    "+------------------+----------------------------------+-----------+-----------------------+"
)


def _jobs_of(st: dict, gpus: list) -> list:
    indices = {g["index"] for g in gpus}
    return [j for j in st.get("jobs", []) if j.get("gpu") in indices]


def table(gpus: list, st: dict, ctx: dict) -> str:
    d, cuda = ctx["driver"], ctx["cuda"]
    if r610_layout(ctx["branch"]):
        versions = f"| NVIDIA-SMI {d:<23}KMD Version: {d:<14}CUDA UMD Version: {cuda:<9}|"
    else:
        versions = f"| NVIDIA-SMI {d:<23}Driver Version: {d:<15}CUDA Version: {cuda:<9}|"
    out = [f"{ctime(ctx['now'])}       ", RULE89, versions,
           GPU_RULE,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]  # fmt: skip
    mig_rows = []
    for g in gpus:
        s = c.gpu_sample(g, st, ctx["now"])
        pm = "On" if ctx["persistence"] else "Off"
        migged = c.mig_enabled(g)
        ecc = "On" if migged else str(s["ecc_dbe_vol"])
        out.append(
            f"| {g['index']:>3}  {g['name'][:31]:<31}{pm:<4}|   {g['pci_bus_id']} Off |{ecc:>21} |"
        )
        fan = "0%" if g.get("fan") else "N/A"
        pwr = f"{round(s['power_w'])}W / {g['power_limit_w']:>4}W"
        mem = f"{s['fb_used']}MiB / {s['fb_total']:>6}MiB"
        util = "N/A" if s["util"] is None else f"{s['util']}%"
        out.append(f"| {fan:>3}   {s['gpu_temp']:>2}C    {s['pstate']:<3}{pwr:>23} |{mem:>23} |"
                   f"{util:>8}      Default |")  # fmt: skip
        mig = ("Enabled" if migged else "Disabled") if g.get("mig_capable") else "N/A"
        out.append(
            f"|                                         |                        |{mig:>21} |"
        )
        out.append(GPU_RULE)
        for gi in c.mig_instances(g):
            inst = s["instances"].get(gi["gi_id"], {"used": 0})
            for ci in gi["compute_instances"]:
                mig_rows.append(
                    f"|{g['index']:>3}{gi['gi_id']:>5}{ci['ci_id']:>4}{ci['device']:>4}  |"
                    f"{str(inst['used']) + 'MiB':>19} / {str(gi['memory_mib']) + 'MiB':>8}    |"
                    f" {ci['sm']:<3}{0:>6} |{gi['ce']:>3}{gi['enc']:>4}{gi['dec']:>5}{gi['ofa']:>5}"
                    f"{gi['jpg']:>5} |"
                )
                mig_rows.append(
                    f"|                  |{'0MiB':>19} / {str(gi['bar1_mib']) + 'MiB':>8}    |"
                    "           |                       |"
                )
                mig_rows.append(MIG_RULE)
    if mig_rows:
        out += ["", RULE89,
                "| MIG devices:                                                                            |",
                MIG_RULE,
                "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
                "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
                "|                  |                                  |        ECC|                       |",
                "|==================+==================================+===========+=======================|"]  # fmt: skip
        out += mig_rows
    out += ["", RULE89,
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|"]  # fmt: skip
    by_index = {g["index"]: g for g in gpus}
    jobs = _jobs_of(st, gpus)
    if not jobs:
        out.append("|  No running processes found".ljust(90) + "|")
    for j in jobs:
        g = by_index[j["gpu"]]
        if c.mig_enabled(g) and c.mig_instances(g):  # H100/H200 MIG captures
            gi_id = j.get("gpu_instance", c.mig_instances(g)[0]["gi_id"])
            ids = f"  {gi_id:>3}  {0:>3}  {j['pid']:>15}"
        else:
            ids = f"   N/A  N/A  {j['pid']:>14}"
        out.append(f"|  {j['gpu']:>3}{ids}      C   {j.get('process_name', 'python3')[:35]:<35}"
                   f"{str(j.get('used_memory_mib', 0)) + 'MiB':>11} |")  # fmt: skip
    out.append(RULE89)
    out.append("")
    out.append(f"  ({c.SIM_NOTE})")  # after the real layout: see the gpusim README
    return "\n".join(out) + "\n"
