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

import difflib
import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from bridge.errors import ConfigError
from bridge.service.settings import KafkaSettings, LoggingSettings, NatsSettings

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class _Section(BaseModel):
    # As the bridge's sections: camelCase in YAML (snake_case accepted), unknown keys refused.
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, validate_default=True
    )


class MirrorSourceSettings(_Section):
    kind: Literal["kafka", "nats"]
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    nats: NatsSettings = Field(default_factory=NatsSettings)
    id: str | None = Field(
        default=None,
        min_length=1,
        description="The name the position of this source is stored under; omitted:"
        " 'kafka:<topic>' or 'nats:<stream>'. Set it when two buses into one database"
        " have a topic or stream of the same name",
    )

    @field_validator("kafka")
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


class PostgresSettings(_Section):
    dsn: SecretStr | None = Field(
        default=None,
        description="libpq connection URI (postgresql://user@host:5432/db); what it leaves"
        " out comes from PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE",
    )
    db_schema: str = Field(
        default="k8s",
        alias="schema",
        description="The schema the mirror's tables live in; created when missing. A schema"
        " that holds tables the mirror did not create is refused",
    )
    connect_timeout: float = Field(default=10.0, gt=0)

    @field_validator("db_schema")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("is not a lower-case SQL identifier ([a-z_][a-z0-9_]*)")
        return value


class MirrorBatchSettings(_Section):
    max_events: int = Field(
        default=5000, gt=0, description="At most this many events per transaction"
    )
    max_wait: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="Seconds to wait for more events before writing a smaller batch",
    )


class MirrorServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve /healthz, /readyz and /metrics on this port; omitted: no server",
    )


class MirrorSettings(BaseModel):
    """The whole mirror configuration. Build it with ``load_mirror_settings``."""

    model_config = _Section.model_config

    source: MirrorSourceSettings
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    history: bool = Field(
        default=False, description="Keep every change in the table changes (event id first)"
    )
    keep_deleted: bool = Field(
        default=False,
        description="Keep deleted objects in deleted_objects for ever; otherwise for"
        " tombstoneRetention only",
    )
    tombstone_retention: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds a deleted object stays in deleted_objects without keepDeleted:"
        " long enough that a late redelivery of one of its states cannot bring it back",
    )
    batch: MirrorBatchSettings = Field(default_factory=MirrorBatchSettings)
    server: MirrorServerSettings = Field(default_factory=MirrorServerSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)


def mirror_json_schema() -> dict[str, Any]:
    """JSON Schema of mirror.yaml (YAML spelling), for the chart's values schema."""
    schema = MirrorSettings.model_json_schema(by_alias=True)
    schema.setdefault("title", "k8s-bridge mirror configuration")
    return schema


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
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    try:
        return MirrorSettings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("config error: " + "; ".join(_describe(exc))) from None


def _describe(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        kind = err["type"]
        if kind == "extra_forbidden":
            out.append(f"{key}: unknown key{_hint(loc)}")
        elif kind == "missing":
            out.append(f"{key}: required key is missing")
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            out.append(f"{key}: {err.get('input')!r} is not one of {expected}")
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            out.append(f"{key}: {err.get('input')!r} {message}")
    return out


def _hint(loc: list[Any]) -> str:
    model: Any = MirrorSettings
    for part in loc[:-1]:
        found = _field(model, str(part)) if isinstance(model, type) else None
        annotation = found.annotation if found is not None else None
        model = annotation if isinstance(annotation, type) else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    names = [info.alias or name for name, info in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _field(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info
    return None
