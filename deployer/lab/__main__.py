"""``python -m deployer.lab ...``: the lab commands without the main CLI."""

from deployer.lab.cli import lab

lab()
