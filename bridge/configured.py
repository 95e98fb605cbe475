"""What the configuration serves: the resource and namespace a command names.

``replay`` takes ``--resource`` from a person; a resource the configuration
does not cover is refused at once, naming the value and what is configured.
"""

from __future__ import annotations

from bridge.errors import ConfigError
from bridge.settings import ResourceSettings, Settings


def configured_resources(settings: Settings) -> str:
    return ", ".join(f"{r.api_version}/{r.kind}" for r in settings.resources) or "none"


def find_resource(settings: Settings, wanted: str) -> ResourceSettings:
    """The configured resource named by ``Kind`` or ``apiVersion/Kind`` (case-insensitive kind)."""
    api_version, _, kind = wanted.rpartition("/")
    for res in settings.resources:
        if res.kind.lower() == kind.lower() and (not api_version or res.api_version == api_version):
            return res
    raise ConfigError(
        f"config error: --resource {wanted!r} is not configured "
        f"(configured: {configured_resources(settings)})"
    )
