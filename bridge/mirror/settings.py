"""Settings of ``k8s-bridge mirror``: one YAML file of its own (``mirror.yaml``).

The mirror reads the bus the bridge writes, so ``source.kafka`` and
``source.nats`` take the same keys as the bridge's ``sink.kafka`` and
``sink.nats`` (copy the section over); the producer-only keys are accepted
and ignored. Unknown keys are errors, each one line naming the dotted key.
The PostgreSQL password, like every libpq connection parameter left out of
``postgres.dsn``, may come from the standard ``PG*`` variables
(``PGPASSWORD``, ``PGHOST``, ...), so it need not be in the file.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import yaml

from bridge.errors import ConfigError
from bridge.ground.sections import (
    SecretStr,
    Section,
    SectionError,
    did_you_mean,
    dotted,
    field,
    json_schema,
    validate,
    validates,
)
from bridge.service.settings import KafkaSettings, LoggingSettings, NatsSettings

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class MirrorSourceSettings(Section):
    kind: Literal["kafka", "nats"]
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    nats: NatsSettings = field(default_factory=NatsSettings)
    id: str | None = field(
        default=None,
        min_length=1,
        description="The name the position of this source is stored under; omitted:"
        " 'kafka:<topic>' or 'nats:<stream>'. Set it when two buses into one database"
        " have a topic or stream of the same name",
    )

    @validates("kafka")
    @classmethod
    def _one_topic(cls, value: KafkaSettings) -> KafkaSettings:
        if "{" in value.topic:
            raise ValueError(
                "is a templated topic: run one mirror per topic (source.kafka.topic names one)"
            )
        return value

    @property
    def identity(self) -> str:
        if self.id:
            return self.id
        if self.kind == "kafka":
            return f"kafka:{self.kafka.topic}"
        return f"nats:{self.nats.stream}"


class PostgresSettings(Section):
    dsn: SecretStr | None = field(
        default=None,
        description="libpq connection URI (postgresql://user@host:5432/db); what it leaves"
        " out comes from PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE",
    )
    db_schema: str = field(
        default="k8s",
        key="schema",
        description="The schema the mirror's tables live in; created when missing. A schema"
        " that holds tables the mirror did not create is refused",
    )
    connect_timeout: float = field(default=10.0, gt=0)

    @validates("db_schema")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("is not a lower-case SQL identifier ([a-z_][a-z0-9_]*)")
        return value


class MirrorBatchSettings(Section):
    max_events: int = field(
        default=5000, gt=0, description="At most this many events per transaction"
    )
    max_wait: float = field(
        default=0.05,
        ge=0,
        le=10,
        description="Seconds to wait for more events before writing a smaller batch",
    )


class MirrorServerSettings(Section):
    host: str = "127.0.0.1"
    port: int | None = field(
        default=None,
        ge=0,
        le=65535,
        description="Serve /healthz, /readyz and /metrics on this port; omitted: no server",
    )


class MirrorSettings(Section):
    """The whole mirror configuration. Build it with ``load_mirror_settings``."""

    source: MirrorSourceSettings
    postgres: PostgresSettings = field(default_factory=PostgresSettings)
    history: bool = field(
        default=False, description="Keep every change in the table changes (event id first)"
    )
    keep_deleted: bool = field(
        default=False,
        description="Keep deleted objects in deleted_objects for ever; otherwise for"
        " tombstoneRetention only",
    )
    tombstone_retention: float = field(
        default=3600.0,
        gt=0,
        description="Seconds a deleted object stays in deleted_objects without keepDeleted:"
        " long enough that a late redelivery of one of its states cannot bring it back",
    )
    batch: MirrorBatchSettings = field(default_factory=MirrorBatchSettings)
    server: MirrorServerSettings = field(default_factory=MirrorServerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)


def mirror_json_schema() -> dict[str, Any]:
    """JSON Schema of mirror.yaml (YAML spelling), for the chart's values schema."""
    return json_schema(MirrorSettings)


def load_mirror_settings(path: str, overrides: dict[str, Any] | None = None) -> MirrorSettings:
    """Read and validate ``path``; every problem is one ``ConfigError`` line."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"config error: cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config error: {path}: invalid YAML: {exc}".splitlines()[0]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {path}: the top level must be a mapping")
    for key, value in (overrides or {}).items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    try:
        return validate(MirrorSettings, data)
    except SectionError as exc:
        raise ConfigError("config error: " + "; ".join(_describe(exc))) from None


def _describe(exc: SectionError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = err["loc"]
        key = dotted(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            out.append(f"{key}: unknown key{did_you_mean(MirrorSettings, loc)}")
        elif kind == "missing":
            out.append(f"{key}: required key is missing")
        elif kind == "literal_error":
            expected = str(err["msg"]).removeprefix("Input should be ")
            out.append(f"{key}: {err.get('input')!r} is not one of {expected}")
        else:
            out.append(f"{key}: {err.get('input')!r} {err['msg']}")
    return out
