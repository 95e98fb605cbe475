"""What the configuration serves: the resource and namespace a command names.

``replay`` and ``tail`` take ``--resource`` (and ``replay`` ``--namespace``)
from a person. A value the configuration does not cover cannot be served
truthfully: replay would publish changes the bridge never published (or
diff against a checkpoint that does not exist and call everything added),
and tail would wait forever for events that never come. Both refuse it at
once, naming the value and what is configured.
"""

from __future__ import annotations

from bridge.errors import ConfigError
from bridge.service.settings import ResourceSettings, Settings


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


def pick_namespace(res: ResourceSettings, namespace: str | None) -> str | None:
    """The namespace to serve for ``res``: the one asked for, if the configuration covers it.

    A resource configured for all namespaces (``namespaces: []``) covers every
    namespace; one configured with a list covers exactly those, and with a
    single entry that one is the default.
    """
    if not res.namespaces:
        return namespace
    listed = ", ".join(res.namespaces)
    if namespace is None:
        if len(res.namespaces) > 1:
            raise ConfigError(
                f"config error: --namespace is required: {res.api_version}/{res.kind} is "
                f"configured for namespaces {listed}"
            )
        return res.namespaces[0]
    if namespace not in res.namespaces:
        raise ConfigError(
            f"config error: --namespace {namespace!r} is not configured for "
            f"{res.api_version}/{res.kind} (configured namespaces: {listed})"
        )
    return namespace
