"""Settings of k8s-bridge: one YAML file, ``BRIDGE_*`` environment overrides, CLI overrides.

The YAML spelling is camelCase (``sink.kafka.lingerMs``); snake_case field names
are accepted too. Every section forbids unknown keys, so a typo is an error
that names the key instead of a setting that silently does nothing.

Precedence, lowest to highest: the YAML file, ``BRIDGE_*`` variables (nested
with ``__``: ``BRIDGE_SINK__KAFKA__LINGERMS=10``, ``BRIDGE_RESOURCES__0__KIND=Pod``;
lists and mappings as JSON, a list of strings also as ``a,b,c``), then the
overrides the CLI passes in (nested dicts or dotted keys).

Every failure becomes one ``ConfigError`` line naming the dotted key in YAML
spelling, the bad value and why, e.g.
``config error: sink.kind: 'rabbit' is not one of nats, kafka, stdout``.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

import yaml

from bridge.delivery.filters import compile_filter
from bridge.delivery.views import check_paths
from bridge.errors import ConfigError
from bridge.ground.kafka import connection_options
from bridge.ground.natsconfig import subject_matches, tls_context
from bridge.ground.sections import (
    EntryError,
    KeyedError,
    SecretStr,
    Section,
    SectionError,
    check,
    did_you_mean,
    dotted,
    field,
    fields_set,
    find_field,
    is_list,
    json_schema,
    normalize,
    section_in,
    to_camel,
    validate,
    validates,
)
from bridge.kube.selectors import (
    SelectorError,
    normalize_field_selector,
    normalize_label_selector,
)
from bridge.kube.sharding import ShardRange, shard_range

ENV_PREFIX = "BRIDGE_"
ENV_DELIMITER = "__"
# Read by the CLI as the config file path, so it is not a settings key.
_ENV_NOT_KEYS = frozenset({"BRIDGE_CONFIG"})

# --- cluster -----------------------------------------------------------------


class ClusterSettings(Section):
    kubeconfig: str | None = field(
        default=None,
        description="Path to a kubeconfig; omitted: in-cluster config, else ~/.kube/config",
    )
    context: str | None = field(
        default=None, description="kubeconfig context; omitted: current-context"
    )
    name: str = field(
        default="default", min_length=1, description="Names the cluster in event sources"
    )
    compression: bool = field(
        default=False,
        description="Ask the API server to gzip its answers (LISTs and watch streams): fewer"
        " bytes on a slow link, more CPU on both ends; off: answers come uncompressed",
    )


# --- resources ---------------------------------------------------------------


class ResourceSettings(Section):
    api_version: str = field(
        default="",
        description="e.g. v1, apps/v1, example.com/v1; with kinds: pins the version of the group",
    )
    kind: str = field(
        default="", description="e.g. Pod, Deployment, Widget; or kinds/group/allKinds instead"
    )
    api_group: str | None = field(
        default=None,
        key="group",
        description="Select kinds of one API group ('' = core) at the server's preferred version"
        " (apiVersion pins one); kinds: which (default ['*']); each becomes its own resource"
        " (docs/configuration-kinds.md)",
    )
    kinds: list[str] = field(
        default_factory=list,
        description="With group or apiVersion: kind names or patterns ('*', 'Cron*')",
    )
    all_kinds: bool = field(
        default=False,
        description="Every kind the API server serves with list and watch (Events, Leases and"
        " EndpointSlices left out unless an entry names them)",
    )
    exclude: list[str] = field(
        default_factory=list,
        description="With kinds/group/allKinds: kinds left out, 'Kind' or 'Kind.group'",
    )
    metadata_only: bool = field(
        default=False,
        description="List and watch only metadata (PartialObjectMetadata): events carry"
        " apiVersion, kind and metadata; changes outside metadata publish nothing",
    )
    plural: str | None = field(
        default=None,
        description="Resource (plural) name; optional, discovery decides at run time. "
        "The Helm chart uses it to derive RBAC when lowercase+s is wrong.",
    )
    namespaces: list[str] = field(default_factory=list, description="[] = all namespaces")
    label_selector: str = field(default="", description="e.g. app=web,tier in (a,b)")
    field_selector: str = field(default="", description="e.g. status.phase=Running")
    ignore_fields: list[str] = field(
        default_factory=list, description="Dotted paths whose changes alone publish nothing"
    )
    trigger_paths: list[str] = field(
        default_factory=list,
        description="Dotted paths: a modification is published only when a value at one of "
        "them changed (adds and deletes always are); [] = any change",
    )
    generation_only: bool = field(
        default=False,
        description="Shorthand for triggerPaths: [metadata.generation] (spec changes); objects "
        "without metadata.generation (ConfigMap, Secret, ...) are compared whole",
    )
    fields: list[str] = field(
        default_factory=list,
        description="Dotted paths: events carry only these of the object, always with "
        "apiVersion, kind and metadata name, namespace, uid, resourceVersion; changes "
        "elsewhere publish nothing unless triggerPaths say otherwise; [] = the whole object",
    )
    redact_secrets: bool = field(
        default=True,
        description="Redact Secret data/stringData values, also in the last-applied-configuration "
        "annotation",
    )
    mask_paths: list[str] = field(
        default_factory=list, description="Dotted paths replaced by a mask in published objects"
    )
    include_old: bool = field(default=False, description="Include the previous object in events")
    patch: bool = field(
        default=False, description="Include an RFC 6902 patch from the previous object"
    )
    poison_policy: Literal["truncate", "skip", "fail", "deadLetter"] | None = field(
        default=None,
        description="What to do with an event the bus refuses for good (too large, not "
        "permitted); omitted: sink.poisonPolicy",
    )
    filter: str | None = field(
        default=None,
        description="CEL expression over object, oldObject and type; only objects it holds "
        "for are published (one leaving it: a filtered event), e.g. "
        "object.status.phase == 'Failed'",
    )
    routes: list[str] | None = field(
        default=None,
        description="Names of the sink.routes this resource's events are routed by, in "
        "sink.routes' order; omitted: all of them; []: none (every event to the default)",
    )
    heartbeat_interval: float | None = field(
        default=None,
        gt=0,
        description="Seconds between io.k8s.bridge.heartbeat events of this resource (committed "
        "watermark, object count, seconds since the last change, synced/watch up); omitted: none",
    )

    @check
    def _one_way_to_name_kinds(self) -> ResourceSettings:
        # An entry names one kind (apiVersion + kind) or selects many (group/kinds/allKinds).
        problem = None
        if self.all_kinds:
            if self.api_group is not None or self.kind or self.kinds or self.api_version:
                problem = "allKinds: cannot be combined with apiVersion, kind, group or kinds"
        elif self.api_group is not None or self.kinds:
            if self.kind:
                problem = "kind: names one kind; with group or kinds use kinds: [...]"
            elif self.api_group is not None and self.api_version:
                if self.api_version.rpartition("/")[0] != self.api_group:
                    problem = f"apiVersion: {self.api_version!r} is not of group {self.api_group!r}"
            elif self.api_group is None and not self.api_version:
                problem = "kinds: needs group (or apiVersion) to say which API group"
            if self.plural:
                problem = "plural: only for an entry naming one kind"
        else:
            if not self.api_version or not self.kind:
                missing = "apiVersion" if not self.api_version else "kind"
                problem = (
                    f"{missing}: required key is missing (or select kinds with group, kinds"
                    " or allKinds)"
                )
            elif self.exclude:
                problem = "exclude: only with group, kinds or allKinds"
        if problem is not None:
            raise EntryError(problem)
        return self

    @property
    def selects_kinds(self) -> bool:
        """A group/kinds/allKinds entry: its kinds are known only once discovery is read."""
        return not self.kind

    @validates("filter")
    @classmethod
    def _filter(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_filter(value)
            except ConfigError as e:
                raise ValueError(str(e)) from None
        return value

    @validates("trigger_paths", "fields", "ignore_fields", "mask_paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        # Parsed here so a bad path is a config error at start, naming the key.
        return check_paths(value)

    @validates("generation_only")
    @classmethod
    def _generation_only(cls, value: bool, data: Mapping[str, Any]) -> bool:
        if value and data.get("trigger_paths"):
            raise ValueError(
                "cannot be combined with triggerPaths (it means triggerPaths: "
                "[metadata.generation]); set one of them"
            )
        return value

    @validates("label_selector")
    @classmethod
    def _label_selector(cls, value: str) -> str:
        try:
            normalize_label_selector(value)
        except SelectorError as e:
            raise ValueError(f"is not a valid label selector: {e}") from None
        return value

    @validates("field_selector")
    @classmethod
    def _field_selector(cls, value: str) -> str:
        try:
            normalize_field_selector(value)
        except SelectorError as e:
            raise ValueError(f"is not a valid field selector: {e}") from None
        return value

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def gvk(self) -> str:
        """``apiVersion/kind``: the identity used for sharding and logging."""
        return f"{self.api_version}/{self.kind}"

    def selects(self) -> tuple[str, str, str]:
        """What the entry selects besides namespaces; equal for equal selections."""
        return (
            self.gvk,
            normalize_label_selector(self.label_selector),
            normalize_field_selector(self.field_selector),
        )


# --- sink --------------------------------------------------------------------


class NatsTlsSettings(Section):
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


class NatsSettings(Section):
    servers: list[str] = field(default_factory=lambda: ["nats://127.0.0.1:4222"], min_length=1)
    stream: str = "K8S"
    subjects: list[str] = field(default_factory=lambda: ["k8s.>"], min_length=1)
    create_stream: bool = True
    max_in_flight: int = field(default=2048, gt=0)
    credentials: str | None = field(default=None, description="Path to a .creds file")
    nkey_seed: str | None = field(default=None, description="Path to an NKey seed file")
    tls: NatsTlsSettings | None = None
    dead_letter_subject: str | None = field(
        default=None,
        min_length=1,
        description="Subject of dead letters (poisonPolicy deadLetter): events the stream "
        "refused, whole or cut to the server's max_payload; outside subjects, the bridge "
        "creates stream '{stream}_DEAD_LETTERS' for it when createStream is on",
    )

    @validates("dead_letter_subject")
    @classmethod
    def _dead_letter_subject(cls, value: str | None) -> str | None:
        if value is not None and (any(c in value for c in " \t*>") or ".." in value):
            raise KeyedError(
                f"sink.nats.deadLetterSubject: {value!r} is not a plain NATS subject"
                " (no spaces, wildcards or empty tokens)",
            )
        return value

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of ``tls`` (bridge/ground/nats.py): the checkpoint bucket,
        ``check``, ``replay``, ``tail`` and the consumer connect as the sink does."""
        return tls_context(self.tls.ca, self.tls.cert, self.tls.key) if self.tls else None


class KafkaSslSettings(Section):
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None


class KafkaSettings(Section):
    bootstrap_servers: list[str] = field(default_factory=lambda: ["127.0.0.1:9092"], min_length=1)
    topic: str = field(default="k8s-events", min_length=1)
    acks: Literal["all", 0, 1] = "all"
    enable_idempotence: bool = True
    compression: Literal["gzip", "snappy", "lz4", "zstd"] | None = None
    linger_ms: int = field(
        default=0,
        ge=0,
        description="The producer's own linger; the pipeline already batches what was decided "
        "meanwhile, so more only delays every batch",
    )
    max_batch_size: int = field(
        default=65_536,
        gt=0,
        description="Bytes of records per partition batch, one produce request each (one "
        "request in flight per broker). The pipeline hands over hundreds of events at once: "
        "at 16 KiB a batch held five ~3 KB events. Keep it below the broker's message.max.bytes",
    )
    max_request_size: int = field(
        default=1_048_576,
        gt=0,
        description="Largest request (record) the producer sends; larger events meet the "
        "poison policy. Keep it at or below the broker's message.max.bytes",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl: KafkaSslSettings | None = None
    state_table: bool = field(
        default=False, description="Also publish the latest object per key to a compacted topic"
    )
    heartbeat_topic: str | None = field(
        default=None,
        min_length=1,
        description="Topic of heartbeat events (same placeholders as topic); omitted: "
        "'{topic}.heartbeats'",
    )
    dead_letter_topic: str | None = field(
        default=None,
        min_length=1,
        description="Topic of dead letters (poisonPolicy deadLetter): events Kafka refused, "
        "whole or cut to maxRequestSize, keyed like the event, with headers saying why; "
        "with exactlyOnce in the same transaction as the truncated event",
    )
    exactly_once: bool = field(
        default=False,
        description="Publish each batch in a Kafka transaction together with the checkpoint"
        " records that cover it (needs checkpoint.kind kafka); consumers reading with"
        " isolation.level=read_committed then see every change once, across crashes and"
        " failovers",
    )
    transactional_id_prefix: str | None = field(
        default=None,
        min_length=1,
        description="Prefix of the transactional.id of each resource's producer (the same in"
        " every replica, so a new leader fences the old one); omitted: 'k8s-bridge.' + the"
        " cluster name",
    )
    transaction_timeout_ms: int = field(
        default=60_000,
        gt=0,
        description="How long the broker lets a transaction stay open before aborting it: a"
        " bridge killed inside one holds read_committed consumers back until then, or until"
        " it (or its standby) starts again",
    )

    @check
    def _idempotence_needs_acks_all(self) -> KafkaSettings:
        # aiokafka refuses the combination with a ValueError at the first producer.
        if self.enable_idempotence and self.acks != "all":
            raise KeyedError(
                f"sink.kafka.acks: {self.acks} needs sink.kafka.enableIdempotence false"
                " (the idempotent producer, the default, requires acks all)",
            )
        return self

    @validates("acks", mode="before")
    @classmethod
    def _acks(cls, value: Any) -> Any:
        # YAML gives 1, env gives "1"; both mean the same and "-1" is "all".
        text = str(value).strip().lower()
        if text in ("all", "-1"):
            return "all"
        if text in ("0", "1"):
            return int(text)
        return value

    def connection_options(self, client_id: str) -> dict[str, Any]:
        """aiokafka's connection options for this cluster (bridge/ground/kafka.py): the
        checkpoint store, ``check``, ``tail`` and the consumer reach the sink's
        cluster the way the sink does."""
        return connection_options(
            self.bootstrap_servers,
            client_id,
            security_protocol=self.security_protocol,
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            sasl_password=self.sasl_password.get_secret_value() if self.sasl_password else None,
            ssl_cafile=self.ssl.cafile if self.ssl else None,
            ssl_certfile=self.ssl.certfile if self.ssl else None,
            ssl_keyfile=self.ssl.keyfile if self.ssl else None,
        )


class RouteSettings(Section):
    name: str = field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Names the route in logs and in the NATS message id of its copies "
        "({id}@{name}); letters, digits, - and _",
    )
    when: str = field(
        min_length=1,
        description="CEL expression over object, oldObject and type (as a filter): the "
        "event goes to this route when it holds, e.g. "
        "object.metadata.namespace.startsWith('team-a')",
    )
    topic: str | None = field(
        default=None,
        min_length=1,
        description="Kafka sink: the route's topic (placeholders as sink.kafka.topic)",
    )
    subject_prefix: str | None = field(
        default=None,
        min_length=1,
        description="NATS sink: what replaces the leading 'k8s' token of the event's "
        "subject on this route ({prefix}.{cluster}.{group}.{version}.{plural}.{namespace}"
        ".{name}); sink.nats.subjects must hold it",
    )

    @validates("subject_prefix")
    @classmethod
    def _subject_prefix(cls, value: str | None) -> str | None:
        if value is not None and (
            any(c in value for c in " \t*>") or ".." in value or value.strip(".") != value
        ):
            raise ValueError(
                "is not a plain NATS subject prefix (no spaces, wildcards or empty tokens)"
            )
        return value


class SinkSettings(Section):
    kind: Literal["nats", "kafka", "stdout"]
    max_batch: int = field(default=500, gt=0, description="At most this many events per publish")
    linger: float = field(
        default=0.001,
        ge=0,
        le=0.05,
        description="Seconds to wait for more events before publishing a batch",
    )
    steady_linger: float = field(
        default=0.01,
        ge=0,
        le=1.0,
        description="While changes come steadily, at least one per this many seconds on"
        " average, the wait for more before publishing a batch: batches of several"
        " changes share one write-ahead commit and one publish (less CPU per change), for"
        " up to this much more latency; not above linger: the steady wait is off",
    )
    poison_policy: Literal["truncate", "skip", "fail", "deadLetter"] = field(
        default="truncate",
        description="An event the bus refuses for good: truncate (publish it cut to its "
        "metadata, same id), skip, fail (stop that resource, not-ready), or deadLetter "
        "(truncate, and the whole event to sink.kafka.deadLetterTopic or "
        "sink.nats.deadLetterSubject with headers saying why)",
    )
    nats: NatsSettings = field(default_factory=NatsSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    routes: list[RouteSettings] = field(
        default_factory=list,
        description="Routes by content: each event goes to the route(s) whose 'when' holds "
        "(see routing), and to the default destination (sink.kafka.topic, or the k8s. "
        "subjects) when none does; [] = every event to the default",
    )
    routing: Literal["first", "all"] = field(
        default="first",
        description="first: the event goes to the first route whose 'when' holds; all: to "
        "every route whose 'when' holds",
    )

    @check
    def _routes_compile(self) -> SinkSettings:
        seen: set[str] = set()
        for i, route in enumerate(self.routes):
            if route.name in seen:
                raise KeyedError(f"sink.routes[{i}].name: {route.name!r} names two routes")
            seen.add(route.name)
            try:
                compile_filter(route.when)
            except ConfigError as e:
                raise KeyedError(f"sink.routes[{i}].when (route {route.name!r}): {e}") from None
        return self


# --- checkpoint, informer, server, logging ----------------------------------------


class CheckpointKafkaSettings(Section):
    topic: str = field(
        default="k8s-bridge-checkpoints",
        min_length=1,
        description="Compacted topic of the checkpoint, in the sink's Kafka cluster; created "
        "with one partition and cleanup.policy=compact if missing",
    )
    replication_factor: int | None = field(
        default=None,
        gt=0,
        description="Replicas of the topic when the bridge creates it; omitted: 3, or the "
        "number of brokers if fewer",
    )
    timeout: float = field(
        default=30.0,
        gt=0,
        description="Seconds a checkpoint write (acks=all) or the read at start may take "
        "before Kafka counts as unreachable",
    )


class CheckpointSettings(Section):
    kind: Literal["sqlite", "memory", "nats-kv", "kafka"] = "sqlite"
    path: str = "./k8s-bridge-state.db"
    bucket: str = "k8s-bridge"
    kafka: CheckpointKafkaSettings = field(default_factory=CheckpointKafkaSettings)
    sync_write_ahead: bool = field(
        default=True,
        description="sqlite: fsync each write-ahead batch (synchronous=FULL for it), so the "
        "rows of events on their way survive an OS crash or power loss; off, a power loss "
        "may drop them and the deletes of those objects made while down go unpublished",
    )
    commit_interval: float = field(
        default=1.0, gt=0, description="Seconds between checkpoint commits (watermark + digests)"
    )
    flush_interval: float | None = field(
        default=None,
        gt=0,
        description="Deprecated: the old name of commitInterval, still honoured",
        deprecated=True,
    )
    flush_events: int | None = field(
        default=None,
        gt=0,
        description="Deprecated and ignored: events publish at once; see sink.maxBatch",
        deprecated=True,
    )

    @check
    def _old_names(self) -> CheckpointSettings:
        # The old key keeps working (a config written for an older release still
        # runs), unless the new one is given too: then the new one wins.
        if self.flush_interval is not None and "commit_interval" not in fields_set(self):
            self.commit_interval = self.flush_interval
        return self

    def deprecations(self) -> list[str]:
        """One line per deprecated key this section was given (logged at start)."""
        lines = []
        if self.flush_interval is not None:
            lines.append(
                "checkpoint.flushInterval is deprecated: it is the seconds between"
                " checkpoint commits, now named checkpoint.commitInterval"
                + (
                    " (both are set: commitInterval wins)"
                    if "commit_interval" in fields_set(self)
                    else ""
                )
            )
        if self.flush_events is not None:
            lines.append(
                "checkpoint.flushEvents is deprecated and ignored: events are published as"
                " they are decided, in batches of at most sink.maxBatch"
            )
        return lines


class InformerSettings(Section):
    slim: bool = field(
        default=True,
        description="Keep only uid/resourceVersion/fingerprint per object (off: whole objects)",
    )
    page_size: int = field(default=500, gt=0)
    watch_list: Literal["auto", "on", "off"] = "auto"
    resync_period: float | None = field(default=None, gt=0)
    max_queued: int = field(default=100, gt=0)
    list_pace_seconds: float | None = field(
        default=30.0,
        ge=0,
        description="A LIST body is read only as fast as the FIFO has room, for this many"
        " seconds after the request (memory stays flat); then the rest is read at once and"
        " held as bytes, within the API server's request timeout (60 s by default)."
        " null: never pace",
    )
    unhealthy_after: float = field(
        default=60.0,
        gt=0,
        description="Seconds without a working list/watch of a resource before /readyz says 503",
    )
    gc_freeze: bool = field(
        default=True,
        description="Once every resource has synced, hand the C heap's free pages back to the"
        " OS (glibc's malloc_trim, after one full collection); `k8s-bridge run` only",
    )
    # What it earns: BENCHMARKS.md, "Process tuning".
    gc_threshold: int | None = field(
        default=50_000,
        gt=0,
        description="The cyclic GC's young-generation threshold (gc.set_threshold), set by"
        " `k8s-bridge run`; null: the interpreter's default (700)",
    )


class ServerSettings(Section):
    host: str = "0.0.0.0"
    port: int = field(default=8080, ge=0, le=65535)
    control_auth: Literal["kubernetes", "token", "none"] | None = field(
        default=None,
        description="Who may call POST /snapshot: kubernetes (the caller's bearer token,"
        " checked with a TokenReview and a SubjectAccessReview for 'post' on the"
        " non-resource URL /snapshot), token (server.controlToken), none (anyone who"
        " reaches the port). Omitted: token when controlToken is set, else kubernetes",
    )
    control_token: SecretStr | None = field(
        default=None,
        description="The bearer token POST /snapshot wants with controlAuth token"
        " (k8s-bridge snapshot sends it from the same config)",
    )

    @check
    def _token_fits_auth(self) -> ServerSettings:
        # Whole-section check, so the error names the key without echoing the secret.
        auth, token = self.control_auth, self.control_token
        problem = None
        if token is None:
            if auth == "token":
                problem = "server.controlToken: required when server.controlAuth is token"
        elif not token.get_secret_value().strip():
            # An empty variable (a Secret without the key) must not open the endpoint.
            problem = "server.controlToken: must not be empty"
        elif auth in ("kubernetes", "none"):
            problem = (
                f"server.controlToken: set, but server.controlAuth is {auth}, so it would"
                " not be checked; remove one of them"
            )
        if problem is not None:
            raise KeyedError(problem)
        return self

    @property
    def control_mode(self) -> str:
        """``control_auth`` resolved: token when a token is set, else kubernetes."""
        if self.control_auth is not None:
            return self.control_auth
        return "token" if self.control_token is not None else "kubernetes"


class HealthSettings(Section):
    stall_seconds: float = field(
        default=60.0,
        ge=0,
        description="Seconds an event may wait for the bus's ack (the oldest one, as"
        " k8s_bridge_oldest_unacked_age_seconds shows) before /readyz says 503 for its"
        " resource; 0: never",
    )


_LEVELS = ("debug", "info", "warning", "error", "critical")


class TracingSettings(Section):
    otlp_endpoint: str | None = field(
        default=None,
        min_length=1,
        description="OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces): one span"
        " per published batch, exported there, and its traceparent on every event; omitted:"
        " tracing off (nothing of OpenTelemetry is imported)",
    )
    service_name: str = field(default="k8s-bridge", min_length=1)
    headers: dict[str, str] = field(
        default_factory=dict, description="HTTP headers of each export (e.g. authorization)"
    )

    @validates("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise KeyedError(
                f"tracing.otlpEndpoint: {value!r} is not an http(s) URL (OTLP over HTTP, e.g."
                " http://collector:4318/v1/traces)",
            )
        return value


class LoggingSettings(Section):
    format: Literal["auto", "json", "console"] = "auto"
    level: str = "info"

    @validates("level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.strip().lower()
        if level == "warn":
            level = "warning"
        if level not in _LEVELS:
            raise ValueError(f"is not one of {', '.join(_LEVELS)}")
        return level


class LeaderElectionSettings(Section):
    enabled: bool = False
    lease_name: str = field(default="k8s-bridge", min_length=1)
    namespace: str = field(default="default", min_length=1)
    identity: str | None = field(default=None, description="omitted: hostname + random suffix")
    lease_duration: float = field(default=15, gt=0)
    renew_deadline: float = field(default=10, gt=0)
    retry_period: float = field(default=2, gt=0)

    @validates("renew_deadline")
    @classmethod
    def _renew_below_lease(cls, value: float, data: Mapping[str, Any]) -> float:
        # Same rule as client-go: a leader must give up before a rival may take over.
        lease = data.get("lease_duration")
        if lease is not None and value >= lease:
            raise ValueError(f"must be less than leaseDuration ({lease:g})")
        return value

    @validates("retry_period")
    @classmethod
    def _retry_below_renew(cls, value: float, data: Mapping[str, Any]) -> float:
        renew = data.get("renew_deadline")
        if renew is not None and value >= renew:
            raise ValueError(f"must be less than renewDeadline ({renew:g})")
        return value


class ShardingSettings(Section):
    by: Literal["resource", "uid", "namespace"] = field(
        default="resource",
        description="How replicas split the work: resource (each replica watches whole"
        " resources, sha256(apiVersion/kind) mod shards), uid or namespace (every replica"
        " watches every resource, only the objects whose 64-bit FNV-1a hash of"
        " metadata.uid / metadata.namespace falls in its slice; server-side when the API"
        " server honours shardSelector, else filtered here)",
    )
    shards: int = field(default=1, ge=1)
    shard_index: int = field(
        default=0,
        ge=0,
        description="This replica's shard, 0 to shards-1 (the chart's sharding.replicas"
        " mode sets it from the StatefulSet pod index)",
    )

    @validates("shard_index")
    @classmethod
    def _index_below_shards(cls, value: int, data: Mapping[str, Any]) -> int:
        shards = data.get("shards")
        if shards is not None and value >= shards:
            raise ValueError(f"must be less than shards ({shards})")
        return value

    def range(self) -> ShardRange | None:
        """This replica's slice of every resource; None unless ``by`` is uid or namespace
        with more than one shard."""
        if self.by == "resource" or self.shards <= 1:
            return None
        return shard_range(self.shards, self.shard_index, self.by)


# --- the whole ---------------------------------------------------------------


class Settings(Section):
    """The whole configuration. Build it with ``load_settings``.

    ``load_settings`` reads the ``BRIDGE_*`` environment itself, the same way for
    every key, with the variable named in errors."""

    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    resources: list[ResourceSettings] = field(min_length=1)
    sink: SinkSettings
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    informer: InformerSettings = field(default_factory=InformerSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)
    sharding: ShardingSettings = field(default_factory=ShardingSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)

    @check
    def _exactly_once_fits(self) -> Settings:
        k = self.sink.kafka
        if self.sink.kind != "kafka" or not k.exactly_once:
            return self
        problem = None
        if self.checkpoint.kind != "kafka":
            problem = (
                f"sink.kafka.exactlyOnce: needs checkpoint.kind kafka (it is"
                f" {self.checkpoint.kind}): the checkpoint must be written in the same"
                " transactions as the events"
            )
        elif not k.enable_idempotence:
            problem = "sink.kafka.exactlyOnce: needs sink.kafka.enableIdempotence true"
        elif k.acks != "all":
            problem = f"sink.kafka.exactlyOnce: needs sink.kafka.acks all (it is {k.acks})"
        if problem is not None:
            raise KeyedError(problem)
        return self

    @check
    def _dead_letters_have_a_destination(self) -> Settings:
        policies = [("sink.poisonPolicy", self.sink.poison_policy)] + [
            (f"resources[{i}].poisonPolicy", r.poison_policy) for i, r in enumerate(self.resources)
        ]
        key = next((k for k, p in policies if p == "deadLetter"), None)
        if key is None:
            return self
        kind = self.sink.kind
        problem = None
        if kind == "stdout":
            problem = f"{key}: deadLetter needs a kafka or nats sink (sink.kind is stdout)"
        elif kind == "kafka" and self.sink.kafka.dead_letter_topic is None:
            problem = f"{key}: deadLetter needs sink.kafka.deadLetterTopic"
        elif kind == "nats" and self.sink.nats.dead_letter_subject is None:
            problem = f"{key}: deadLetter needs sink.nats.deadLetterSubject"
        if problem is not None:
            raise KeyedError(problem)
        return self

    @check
    def _resource_routes_exist(self) -> Settings:
        names = {r.name for r in self.sink.routes}
        for i, res in enumerate(self.resources):
            unknown = [n for n in res.routes or () if n not in names]
            if unknown:
                raise KeyedError(
                    f"resources[{i}].routes: {unknown[0]!r} is not the name of one of"
                    f" sink.routes ({', '.join(sorted(names)) or 'none configured'})",
                )
        return self

    @check
    def _routes_fit_the_sink(self) -> Settings:
        kind = self.sink.kind
        for i, route in enumerate(self.sink.routes):
            key = f"sink.routes[{i}]"
            problem = None
            if kind == "stdout":
                problem = f"{key}: routes need a kafka or nats sink (sink.kind is stdout)"
            elif kind == "kafka" and route.topic is None:
                problem = f"{key} (route {route.name!r}): a kafka sink needs the route's topic"
            elif kind == "nats" and route.subject_prefix is None:
                problem = (
                    f"{key} (route {route.name!r}): a nats sink needs the route's subjectPrefix"
                )
            elif kind == "nats" and route.subject_prefix is not None:
                # What the route's subjects look like: the prefix and six tokens.
                sample = route.subject_prefix + ".c.g.v.p.n.n"
                subjects = self.sink.nats.subjects
                if not any(subject_matches(p, sample) for p in subjects):
                    problem = (
                        f"{key}.subjectPrefix: {route.subject_prefix!r} is outside"
                        f" sink.nats.subjects {subjects}: the stream would not store the"
                        f" route's events; add '{route.subject_prefix}.>' to them"
                    )
            if problem is not None:
                raise KeyedError(problem)
        return self

    @property
    def transactional_id_prefix(self) -> str:
        return self.sink.kafka.transactional_id_prefix or f"k8s-bridge.{self.cluster.name}"

    @validates("resources")
    @classmethod
    def _no_resource_twice(cls, resources: list[ResourceSettings]) -> list[ResourceSettings]:
        # Two entries watching the same objects would publish each change twice.
        seen: dict[tuple[str, str, str], list[int]] = {}
        for index, res in enumerate(resources):
            if (
                res.selects_kinds
            ):  # checked once discovery says which kinds (bridge/service/kinds.py)
                continue
            for earlier in seen.setdefault(res.selects(), []):
                overlap = _namespace_overlap(resources[earlier].namespaces, res.namespaces)
                if overlap is not None:
                    raise KeyedError(
                        f"resources[{earlier}] and resources[{index}] both watch {res.gvk} "
                        f"with the same selectors {overlap}: each change would be published "
                        "twice; merge them or make their namespaces disjoint",
                    )
            seen[res.selects()].append(index)
        return resources

    def __init__(self, **data: Any) -> None:
        # Built in code (tests, tools), the settings still take BRIDGE_* from the
        # environment, under what is passed; load_settings validates past __init__,
        # having read the environment already.
        super().__init__(**_merge(normalize(Settings, _env_tree(os.environ)[0]), data))


def _namespace_overlap(a: list[str], b: list[str]) -> str | None:
    """Where two namespace lists (``[]`` = all) overlap, in words; None if they do not."""
    if not a or not b:
        shared = sorted(set(a or b))
        return "in all namespaces" if not shared else f"in namespace {', '.join(shared)}"
    common = sorted(set(a) & set(b))
    return f"in namespace {', '.join(common)}" if common else None


# --- loading -----------------------------------------------------------------

_Path = tuple[str | int, ...]


def load_settings(
    path: str | None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Read ``path`` (YAML), apply ``BRIDGE_*`` from ``env`` (default: the process
    environment), then ``overrides``; validate. Raises ``ConfigError`` (one line)."""
    data: dict[str, Any] = normalize(Settings, _read_yaml(path)) if path is not None else {}
    env_tree, env_origins = _env_tree(os.environ if env is None else env)
    data = _merge(data, env_tree)
    if overrides:
        data = _merge(data, normalize(Settings, _expand_dotted(overrides)))
    try:
        return validate(Settings, data)
    except SectionError as exc:
        raise ConfigError(_format_errors(exc, env_origins)) from None


def settings_json_schema() -> dict[str, Any]:
    """JSON Schema of the config file (YAML spelling), for ``k8s-bridge config schema``."""
    return json_schema(Settings)


def resources_for_shard(settings: Settings) -> list[ResourceSettings]:
    """The resources this replica watches when ``sharding.shards`` > 1 (``by: resource``).

    A resource belongs to shard ``sha256("apiVersion/kind") mod shards``: the
    assignment depends on nothing but the resource's identity, so every replica
    computes the same split without talking to the others, and entries for the
    same kind (e.g. different namespaces) always land together.
    """
    shards = settings.sharding.shards
    if shards <= 1 or settings.sharding.by != "resource":
        # With uid/namespace every replica serves every resource, only its slice.
        return list(settings.resources)
    # An entry selecting kinds is split kind by kind once they are known (in_shard).
    return [r for r in settings.resources if r.selects_kinds or in_shard(settings, r.gvk)]


def in_shard(settings: Settings, gvk: str) -> bool:
    """Whether this replica watches the resource ``apiVersion/kind`` (``by: resource``)."""
    shards = settings.sharding.shards
    if shards <= 1 or settings.sharding.by != "resource":
        return True
    return shard_of(gvk, shards) == settings.sharding.shard_index


def lease_name(settings: Settings) -> str:
    """The Lease this replica elects on. Shards of one kind (``sharding.by`` uid or
    namespace) each need a leader of their own: ``<leaseName>-shard-<shardIndex>``,
    so a standby takes over its own shard and never holds another's slice back."""
    name = settings.leader_election.lease_name
    if settings.sharding.range() is None:
        return name
    return f"{name}-shard-{settings.sharding.shard_index}"


def shard_of(identity: str, shards: int) -> int:
    digest = hashlib.sha256(identity.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"config error: cannot read {path}: {exc.strerror or exc}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config error: {path}: invalid YAML{where}: {problem}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"config error: {path}: the top level must be a mapping, not {type(loaded).__name__}"
        )
    return loaded


# --- keys in any spelling → YAML spelling ------------------------------------------


def _expand_dotted(overrides: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _merge(node.get(parts[-1]), value)
    return tree


def _merge(base: Any, over: Any) -> Any:
    if isinstance(over, dict) and over and all(isinstance(k, int) for k in over):
        # An indexed list from env (BRIDGE_RESOURCES__0__KIND): patch items in place.
        items = list(base) if isinstance(base, list) else []
        for index in sorted(over):
            if index < len(items):
                items[index] = _merge(items[index], over[index])
            else:
                items.append(over[index])
        return items
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _merge(base.get(key), value)
        return merged
    return over


def _env_tree(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[_Path, str]]:
    """BRIDGE_* variables as a nested dict in YAML spelling, and which variable set each path."""
    tree: dict[str, Any] = {}
    origins: dict[_Path, str] = {}
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in _ENV_NOT_KEYS:
            continue
        raw = env[name]
        parts = [p for p in name[len(ENV_PREFIX) :].split(ENV_DELIMITER)]
        if not all(parts):
            raise ConfigError(f"config error: {name}: malformed variable name")
        path: list[str | int] = []
        model: type[Section] | None = Settings
        annotation: Any = None
        in_list = False
        for part in parts:
            if in_list and part.isdigit():
                path.append(int(part))
                in_list = False
                continue
            found = find_field(model, part, loose=True) if model is not None else None
            if found is None:
                path.append(to_camel(part.lower()))
                model, annotation, in_list = None, None, False
                continue
            path.append(found.alias)
            annotation = found.annotation
            model, in_list = section_in(annotation)
        value = _env_value(name, raw, annotation)
        node: dict[Any, Any] = tree
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[path[-1]] = value
        origins[tuple(path)] = name
    return tree, origins


def _env_value(name: str, raw: str, annotation: Any) -> Any:
    text = raw.strip()
    if text[:1] in ("[", "{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"config error: {name}: {raw!r} is not valid JSON ({exc.msg})"
            ) from None
    if annotation is not None and is_list(annotation):
        return [item.strip() for item in text.split(",") if item.strip()]
    return raw


# --- error messages ------------------------------------------------------------


def _literal_choices(loc: tuple[Any, ...]) -> list[str] | None:
    """Allowed values of the Literal field at ``loc``, walking the sections."""
    model: type[Section] | None = Settings
    annotation: Any = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        found = find_field(model, str(part))
        if found is None:
            return None
        annotation = found.annotation
        model = section_in(annotation)[0]
    choices: list[str] = []

    def collect(ann: Any) -> None:
        origin = typing.get_origin(ann)
        if origin is Literal:
            choices.extend(str(a) for a in typing.get_args(ann))
        elif origin in (Union, types.UnionType):
            for arg in typing.get_args(ann):
                collect(arg)

    collect(annotation)
    return choices or None


def _describe(err: Any) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input")
    key = dotted(loc)
    if kind == "extra_forbidden":
        return f"{key}: unknown key{did_you_mean(Settings, loc)}"
    if kind == "missing":
        if loc == ("resources",):
            return "resources: required key is missing (at least one resource is required)"
        return f"{key}: required key is missing"
    if kind == "literal_error":
        choices = _literal_choices(loc)
        allowed = (
            ", ".join(choices) if choices else str(err["msg"]).removeprefix("Input should be ")
        )
        return f"{key}: {value!r} is not one of {allowed}"
    if kind == "too_short" and loc == ("resources",):
        return "resources: at least one resource is required"
    if kind in ("duplicate_resource", "keyed_error"):  # the message names its key
        return str(err["msg"])
    if kind == "resource_error":  # the message starts with the key inside the entry
        return f"{key}.{err['msg']}"
    message = str(err["msg"])
    if kind == "value_error":
        return f"{key}: {value!r} {message}"
    return f"{key}: {value!r} is invalid: {message[:1].lower()}{message[1:]}"


def _format_errors(exc: SectionError, env_origins: Mapping[_Path, str]) -> str:
    parts = []
    for err in exc.errors():
        text = _describe(err)
        loc = tuple(err["loc"])
        # Name the variable when the bad value came from the environment.
        for length in range(len(loc), 0, -1):
            origin = env_origins.get(loc[:length])
            if origin is not None:
                key, _, rest = text.partition(": ")
                text = f"{key} (from {origin}): {rest}"
                break
        parts.append(text)
    return "config error: " + "; ".join(parts)
