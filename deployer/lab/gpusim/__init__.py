"""SIMULATED GPU layer of the gpumon-deploy lab (lab only, never a product default).

Owns the stand-in NVIDIA packages (real names and Debian 12 CUDA-repository versions, Python
contents), the per-host GPU description, and GPU fault injection. The lab calls:

- :func:`build_packages` -- every simulated .deb into a directory (for the lab's apt mirror);
- :func:`hardware_for` -- a deterministic GPU description of one host;
- :func:`prepare_root` / :func:`nspawn_args` -- set a host up before it boots;
- :data:`FAULT_KINDS`, :func:`apply_fault`, :func:`heal` -- GPU faults, from outside the host.
"""

from deployer.lab.gpusim.debs import build_packages
from deployer.lab.gpusim.faults import FAULT_KINDS, apply_fault, heal
from deployer.lab.gpusim.host import nspawn_args, prepare_root
from deployer.lab.gpusim.models import MODELS, hardware_for

__all__ = [
    "FAULT_KINDS",
    "MODELS",
    "apply_fault",
    "build_packages",
    "hardware_for",
    "heal",
    "nspawn_args",
    "prepare_root",
]
