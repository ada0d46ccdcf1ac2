"""The lab's links: waiting for the kernel to tear a stopped host's veth down."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from deployer.lab import network

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating links needs root")


@pytest.fixture
def link() -> Iterator[str]:
    name = f"gmt{os.getpid() % 100000}"
    network.ip("link", "add", "name", name, "type", "bridge")
    yield name
    network.delete_link(name)


def test_a_link_that_goes_while_waited_for_is_not_left(link: str):
    later = threading.Timer(0.3, network.delete_link, [link])
    later.start()
    started = time.monotonic()
    assert network.links_left([link], timeout=5) == []
    assert time.monotonic() - started < 4
    later.join()


def test_a_link_that_stays_is_named_after_the_timeout_and_can_be_deleted(link: str):
    assert network.links_left([link, "gmt-never-was"], timeout=0.3) == [link]
    network.delete_link(link)
    assert not network.link_exists(link)
    network.delete_link(link)  # already gone: nothing
