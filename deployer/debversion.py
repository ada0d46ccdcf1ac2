"""Debian version ordering, as ``dpkg --compare-versions`` orders (dpkg's ``lib/dpkg/version.c``:
``dpkg_version_compare`` and ``verrevcmp``; deb-version(7)).

A version is ``[epoch:]upstream[-revision]``; the epoch compares as a number, then the upstream
part, then the revision, each by ``verrevcmp``: alternately a run of non-digits, compared
character by character with ``~`` before everything (even the end), the end before letters and
letters before the other characters, then a run of digits, compared as a number. The controller
has no dpkg to ask (it may run anywhere), and what needs the order is small: which installed
kernel Debian's dkms builds a module for (``deployer/facts.py``). ``tests/unit/test_debversion.py``
holds it to this machine's ``dpkg --compare-versions``.
"""

from __future__ import annotations


def _digit(c: str) -> bool:
    return "0" <= c <= "9"


def _order(c: str) -> int:
    if _digit(c):
        return 0
    if "a" <= c <= "z" or "A" <= c <= "Z":
        return ord(c)
    if c == "~":
        return -1
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not _digit(a[i])) or (j < len(b) and not _digit(b[j])):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and _digit(a[i]) and j < len(b) and _digit(b[j]):
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and _digit(a[i]):
            return 1
        if j < len(b) and _digit(b[j]):
            return -1
        if first_diff:
            return first_diff
    return 0


def _parts(version: str) -> tuple[int, str, str]:
    epoch, colon, rest = version.partition(":")
    if not colon:
        epoch, rest = "0", version
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch or 0), upstream, revision


def compare(a: str, b: str) -> int:
    """Negative, zero or positive as ``a`` sorts before, with or after ``b``."""
    ea, ua, ra = _parts(a)
    eb, ub, rb = _parts(b)
    if ea != eb:
        return ea - eb
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)
