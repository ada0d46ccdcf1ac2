"""alertmanager.yml as data: the document the alertmanager role writes, computed from its variables.

Owns the assembly of the configuration from ``alertmanager_global``, ``alertmanager_route``,
``alertmanager_receivers``, ``alertmanager_inhibit_rules`` and ``alertmanager_templates`` (empty
optional sections left out, as Alertmanager's own defaults apply). The role's template renders
``alertmanager_config_document() | to_yaml``; secrets in the receivers are masked by the engine's
diff and report, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Sections after route and receivers, written only when set.
OPTIONAL = (
    ("inhibit_rules", "alertmanager_inhibit_rules"),
    ("templates", "alertmanager_templates"),
)


def document(variables: Mapping[str, Any]) -> dict[str, Any]:
    """The alertmanager.yml mapping for one Alertmanager host's variables."""
    config: dict[str, Any] = {}
    if variables.get("alertmanager_global"):
        config["global"] = variables["alertmanager_global"]
    config["route"] = variables["alertmanager_route"]
    config["receivers"] = variables["alertmanager_receivers"]
    for section, name in OPTIONAL:
        if variables.get(name):
            config[section] = variables[name]
    return config
