"""Every module the engine knows; importing this package registers them in MODULES."""

from deployer.modules import (  # noqa: F401
    accounts,
    archive,
    assertion,
    boot_loader,
    command,
    disk_space,
    driver_module,
    driver_switch,
    files,
    mig_copy,
    module_signing,
    package,
    reboot,
    repositories,
    systemd,
    wait_for,
)
from deployer.modules.base import MODULES

__all__ = ["MODULES"]
