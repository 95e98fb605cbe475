"""The kinds the emulator serves, and the discovery documents that describe them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource: what discovery lists and what the store keys on."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = tuple(ALL_VERBS)
    # Fields a fieldSelector may name besides metadata.name/metadata.namespace.
    selectable_fields: tuple[str, ...] = ()
    singular: str = field(default="")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def resource_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular_name,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        return entry


def builtin_resources() -> list[ResourceType]:
    """The built-in kinds of a small cluster (those the bridge, kubectl and the demo use)."""
    return [
        ResourceType(
            "",
            "v1",
            "Pod",
            "pods",
            short_names=("po",),
            selectable_fields=(
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.podIPs",
                "status.nominatedNodeName",
            ),
        ),
        ResourceType(
            "",
            "v1",
            "Service",
            "services",
            short_names=("svc",),
            selectable_fields=("spec.clusterIP", "spec.type"),
        ),
        ResourceType("", "v1", "ConfigMap", "configmaps", short_names=("cm",)),
        ResourceType("", "v1", "Secret", "secrets", selectable_fields=("type",)),
        ResourceType(
            "",
            "v1",
            "Namespace",
            "namespaces",
            namespaced=False,
            short_names=("ns",),
            verbs=tuple(v for v in ALL_VERBS if v != "deletecollection"),
            selectable_fields=("status.phase",),
        ),
        ResourceType(
            "",
            "v1",
            "Node",
            "nodes",
            namespaced=False,
            short_names=("no",),
            selectable_fields=("spec.unschedulable",),
        ),
        ResourceType(
            "",
            "v1",
            "Event",
            "events",
            short_names=("ev",),
            selectable_fields=(
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "type",
            ),
        ),
        ResourceType("apps", "v1", "Deployment", "deployments", short_names=("deploy",)),
        ResourceType("coordination.k8s.io", "v1", "Lease", "leases"),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            namespaced=False,
            verbs=("create",),
        ),
        # What a bridge's control endpoint asks about its callers (bridge/kube/review.py).
        ResourceType(
            "authentication.k8s.io",
            "v1",
            "TokenReview",
            "tokenreviews",
            namespaced=False,
            verbs=("create",),
        ),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            "subjectaccessreviews",
            namespaced=False,
            verbs=("create",),
        ),
    ]


class Registry:
    """Served resources, looked up by (group, version, plural) and by (apiVersion, kind)."""

    def __init__(self) -> None:
        self._by_plural: dict[tuple[str, str, str], ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}

    def add(self, res: ResourceType) -> None:
        self._by_plural[(res.group, res.version, res.plural)] = res
        self._by_kind[(res.api_version, res.kind)] = res

    def by_plural(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_plural.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def all(self) -> list[ResourceType]:
        return list(self._by_plural.values())

    def group_versions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for res in self._by_plural.values():
            versions = out.setdefault(res.group, [])
            if res.version not in versions:
                versions.append(res.version)
        return out

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        items = [
            r.resource_entry()
            for r in self._by_plural.values()
            if r.group == group and r.version == version
        ]
        if not items:
            return None
        doc: dict[str, Any] = {"kind": "APIResourceList"}
        if group:
            # The core group's document carries no apiVersion; the others' do.
            doc["apiVersion"] = "v1"
        doc["groupVersion"] = f"{group}/{version}" if group else version
        doc["resources"] = sorted(items, key=lambda e: e["name"])
        return doc

    def api_versions(self) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = []
        for group, versions in sorted(self.group_versions().items()):
            if not group:
                continue
            gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
            groups.append({"name": group, "versions": gvs, "preferredVersion": gvs[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
