"""dpkg's instances per architecture, read the way apt names packages.

With a foreign architecture enabled (``dpkg --add-architecture i386``, common where 32-bit NVIDIA
libraries are wanted) dpkg lists a package once per architecture it knows, sorted by
architecture, so a foreign instance (``libnvidia-compute-595:i386``, perhaps removed and left as
configuration files) can come after the native one. Every reader of dpkg's output (the
``package`` and ``nvidia_driver_switch`` modules, the host facts) keys what it read by
``package:arch`` and picks an instance here, so none of them takes dpkg's last line for the
package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V")

# dpkg's native architecture: a read script's line ``dpkg_arch=<arch>`` (NATIVE_ARCH_KEY).
NATIVE_ARCH_KEY = "dpkg_arch"
NATIVE_ARCH_SCRIPT = f'echo "{NATIVE_ARCH_KEY}=$(dpkg --print-architecture 2>/dev/null)"'


def dpkg_instance(instances: Mapping[str, V], name: str, native: str) -> V | None:
    """The instance of ``name`` that apt means, from dpkg's instances keyed ``package:arch``.

    apt reads a name without an architecture as the native architecture's package
    (``pkgCache::FindPkg`` looks the name up as ``"native"``; Debian/apt ``apt-pkg/pkgcache.cc``,
    commit 01380ef62a45), an ``Architecture: all`` package answering for it: so does this.
    ``name:arch`` is that instance. Where dpkg did not say its native architecture, the one
    instance there is, if one."""
    base, sep, arch = name.partition(":")
    if sep:
        return instances.get(f"{base}:{arch}")
    for candidate in (native, "all"):
        if candidate and f"{base}:{candidate}" in instances:
            return instances[f"{base}:{candidate}"]
    if not native:
        mine = [v for k, v in instances.items() if k.partition(":")[0] == base]
        if len(mine) == 1:
            return mine[0]
    return None
