"""The mirror's tables, and the SQL that applies one batch to them.

Tables (in the configured schema, ``k8s`` by default):

- ``mirror_meta``: one row saying the mirror made this schema, and which layout.
- ``positions``: per source (bus + topic/stream) and partition, the next
  position to read. Written in the same transaction as the rows it covers.
- ``objects``: the current objects, one row per (cluster, uid).
- ``deleted_objects``: objects gone (deleted, filtered out of the view, or
  replaced by a newer object of the same name), with the time. Kept for ever
  with ``keepDeleted``; otherwise for ``tombstoneRetention``, long enough that
  a late copy of an old state cannot bring a deleted object back.
- ``changes`` (with ``history``): every change, keyed by its event id.

Newer wins: resourceVersions compare as integers per uid (they are etcd
revisions); a stored state is replaced only by a strictly newer one.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
CREATED_BY = "k8s-bridge mirror"

# The staging table (temporary, per connection): one COPY per batch lands here.
STAGED = "mirror_staged"
STAGED_COLUMNS = (
    "cluster", "uid", "api_version", "kind", "namespace", "name", "resource_version",
    "change", "labels", "object", "event_id", "observed_at", "source", "part", "position",
    "winner",
)  # fmt: skip

# What a current and a deleted object's row both hold, in this order.
_OBJECT: dict[str, str] = {
    "cluster": "text",
    "uid": "text",
    "api_version": "text",
    "kind": "text",
    "namespace": "text",
    "name": "text",
    "resource_version": "bigint",
    "labels": "jsonb",
    "object": "jsonb",
    "first_seen": "timestamp with time zone",
}

# Every table the mirror owns, with the columns and types it expects
# (information_schema spelling): anything else in their place is refused.
COLUMNS: dict[str, dict[str, str]] = {
    "mirror_meta": {
        "singleton": "boolean",
        "schema_version": "integer",
        "created_by": "text",
        "created_at": "timestamp with time zone",
    },
    "positions": {
        "source": "text",
        "part": "integer",
        "next_position": "bigint",
        "updated_at": "timestamp with time zone",
    },
    "objects": {
        **_OBJECT,
        "last_changed": "timestamp with time zone",
        "event_id": "text",
    },
    "deleted_objects": {
        **_OBJECT,
        "deleted_at": "timestamp with time zone",
        "reason": "text",
        "event_id": "text",
    },
    "changes": {
        "cluster": "text",
        "event_id": "text",
        "uid": "text",
        "change": "text",
        "api_version": "text",
        "kind": "text",
        "namespace": "text",
        "name": "text",
        "resource_version": "bigint",
        "labels": "jsonb",
        "object": "jsonb",
        "observed_at": "timestamp with time zone",
        "source": "text",
        "part": "integer",
        "position": "bigint",
    },
}

HISTORY_TABLE = "changes"


def create_statements(s: str) -> list[str]:
    """DDL for a new schema ``s`` (all but the history table)."""
    return [
        f'CREATE SCHEMA IF NOT EXISTS "{s}"',
        f"""CREATE TABLE "{s}".mirror_meta (
            singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
            schema_version integer NOT NULL,
            created_by text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now())""",
        f"""CREATE TABLE "{s}".positions (
            source text NOT NULL,
            part integer NOT NULL,
            next_position bigint NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (source, part))""",
        f"""CREATE TABLE "{s}".objects (
            cluster text NOT NULL,
            uid text NOT NULL,
            api_version text NOT NULL,
            kind text NOT NULL,
            namespace text NOT NULL,
            name text NOT NULL,
            resource_version bigint NOT NULL,
            labels jsonb NOT NULL,
            object jsonb NOT NULL,
            first_seen timestamptz NOT NULL,
            last_changed timestamptz NOT NULL,
            event_id text NOT NULL,
            PRIMARY KEY (cluster, uid))""",
        # One live object per name: a name freed by a delete is taken by a new uid.
        f'CREATE UNIQUE INDEX objects_by_name ON "{s}".objects'
        " (cluster, api_version, kind, namespace, name)",
        f'CREATE INDEX objects_by_namespace ON "{s}".objects (namespace, kind)',
        f"""CREATE TABLE "{s}".deleted_objects (
            cluster text NOT NULL,
            uid text NOT NULL,
            api_version text NOT NULL,
            kind text NOT NULL,
            namespace text NOT NULL,
            name text NOT NULL,
            resource_version bigint NOT NULL,
            labels jsonb NOT NULL,
            object jsonb NOT NULL,
            first_seen timestamptz NOT NULL,
            deleted_at timestamptz NOT NULL,
            reason text NOT NULL,
            event_id text NOT NULL,
            PRIMARY KEY (cluster, uid))""",
        f'CREATE INDEX deleted_objects_by_time ON "{s}".deleted_objects (deleted_at)',
        f'CREATE INDEX deleted_objects_by_namespace ON "{s}".deleted_objects (namespace, deleted_at)',
        f"INSERT INTO \"{s}\".mirror_meta (schema_version, created_by) VALUES ({SCHEMA_VERSION}, '{CREATED_BY}')",
    ]


def history_statements(s: str) -> list[str]:
    return [
        f"""CREATE TABLE "{s}".changes (
            cluster text NOT NULL,
            event_id text NOT NULL,
            uid text NOT NULL,
            change text NOT NULL,
            api_version text NOT NULL,
            kind text NOT NULL,
            namespace text NOT NULL,
            name text NOT NULL,
            resource_version bigint NOT NULL,
            labels jsonb NOT NULL,
            object jsonb NOT NULL,
            observed_at timestamptz NOT NULL,
            source text NOT NULL,
            part integer NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (cluster, event_id))""",
        f'CREATE INDEX changes_by_object ON "{s}".changes (cluster, uid, resource_version)',
        f'CREATE INDEX changes_by_time ON "{s}".changes (observed_at)',
    ]


# ON COMMIT DELETE ROWS: the staging rows live exactly as long as their transaction.
CREATE_STAGED = f"""CREATE TEMP TABLE IF NOT EXISTS {STAGED} (
    cluster text, uid text, api_version text, kind text, namespace text, name text,
    resource_version bigint, change text, labels jsonb, object jsonb, event_id text,
    observed_at timestamptz, source text, part integer, position bigint, winner boolean
) ON COMMIT DELETE ROWS"""

_REMOVAL = "t.change IN ('deleted', 'filtered')"
_UPSERT = "t.change NOT IN ('deleted', 'filtered')"
_SAME_NAME = (
    "o.cluster = t.cluster AND o.api_version = t.api_version AND o.kind = t.kind"
    " AND o.namespace = t.namespace AND o.name = t.name"
)


def position_statement(s: str) -> str:
    """Moves one partition's position, only from where this batch started: no row
    back means another mirror (or a commit this one could not see acknowledged)
    moved it first, and the batch is abandoned and read again from there."""
    return f"""INSERT INTO "{s}".positions AS p (source, part, next_position, updated_at)
        VALUES ($1, $2, $3, now())
        ON CONFLICT (source, part) DO UPDATE
            SET next_position = excluded.next_position, updated_at = now()
            WHERE p.next_position IS NOT DISTINCT FROM $4::bigint
        RETURNING 1"""


def apply_statements(s: str, history: bool) -> list[str]:
    """The statements that apply the staged batch, in order (one transaction)."""
    statements = [
        # 1. Removals: the live row goes (a delete always: a uid never comes back;
        # a filter exit only if not older than what is stored), and a tombstone
        # records it, also for an object the mirror never held (so that a late
        # copy of one of its states cannot create it).
        f"""WITH gone AS (
                DELETE FROM "{s}".objects o USING {STAGED} t
                WHERE t.winner AND {_REMOVAL} AND o.cluster = t.cluster AND o.uid = t.uid
                  AND (t.change = 'deleted' OR o.resource_version <= t.resource_version)
                RETURNING o.cluster, o.uid, o.first_seen)
            INSERT INTO "{s}".deleted_objects AS d (cluster, uid, api_version, kind, namespace,
                name, resource_version, labels, object, first_seen, deleted_at, reason, event_id)
            SELECT t.cluster, t.uid, t.api_version, t.kind, t.namespace, t.name,
                   t.resource_version, t.labels, t.object, coalesce(g.first_seen, t.observed_at),
                   t.observed_at, t.change, t.event_id
            FROM {STAGED} t LEFT JOIN gone g ON g.cluster = t.cluster AND g.uid = t.uid
            WHERE t.winner AND {_REMOVAL}
              AND (g.uid IS NOT NULL OR NOT EXISTS (
                    SELECT 1 FROM "{s}".objects o WHERE o.cluster = t.cluster AND o.uid = t.uid))
            ON CONFLICT (cluster, uid) DO UPDATE SET
                api_version = excluded.api_version, kind = excluded.kind,
                namespace = excluded.namespace, name = excluded.name,
                resource_version = excluded.resource_version, labels = excluded.labels,
                object = excluded.object, deleted_at = excluded.deleted_at,
                reason = excluded.reason, event_id = excluded.event_id
            WHERE d.reason <> 'deleted'
              AND (excluded.reason = 'deleted' OR d.resource_version < excluded.resource_version)""",
        # 2. A newer object under a name proves an older live one of another uid gone
        # (its delete never reached the mirror): it is moved to the tombstones.
        f"""WITH gone AS (
                DELETE FROM "{s}".objects o USING {STAGED} t
                WHERE t.winner AND {_UPSERT} AND {_SAME_NAME}
                  AND o.uid <> t.uid AND o.resource_version < t.resource_version
                RETURNING o.*, t.observed_at AS replaced_at, t.event_id AS replaced_by)
            INSERT INTO "{s}".deleted_objects (cluster, uid, api_version, kind, namespace,
                name, resource_version, labels, object, first_seen, deleted_at, reason, event_id)
            SELECT cluster, uid, api_version, kind, namespace, name, resource_version, labels,
                   object, first_seen, replaced_at, 'replaced', replaced_by FROM gone
            ON CONFLICT (cluster, uid) DO NOTHING""",
        # 3. An object back in the view with a newer state is no longer filtered out.
        f"""DELETE FROM "{s}".deleted_objects d USING {STAGED} t
            WHERE t.winner AND {_UPSERT} AND d.cluster = t.cluster AND d.uid = t.uid
              AND d.reason <> 'deleted' AND d.resource_version < t.resource_version""",
        # 4. Upserts, newer wins: never over a newer stored state, never for a uid
        # deleted, never under a name a newer object holds.
        f"""INSERT INTO "{s}".objects AS o (cluster, uid, api_version, kind, namespace, name,
                resource_version, labels, object, first_seen, last_changed, event_id)
            SELECT t.cluster, t.uid, t.api_version, t.kind, t.namespace, t.name,
                   t.resource_version, t.labels, t.object, t.observed_at, t.observed_at,
                   t.event_id
            FROM {STAGED} t
            WHERE t.winner AND {_UPSERT}
              AND NOT EXISTS (SELECT 1 FROM "{s}".deleted_objects d
                    WHERE d.cluster = t.cluster AND d.uid = t.uid
                      AND (d.reason = 'deleted' OR d.resource_version >= t.resource_version))
              AND NOT EXISTS (SELECT 1 FROM "{s}".objects o WHERE {_SAME_NAME}
                    AND o.uid <> t.uid AND o.resource_version > t.resource_version)
            ON CONFLICT (cluster, uid) DO UPDATE SET
                api_version = excluded.api_version, kind = excluded.kind,
                namespace = excluded.namespace, name = excluded.name,
                resource_version = excluded.resource_version, labels = excluded.labels,
                object = excluded.object, last_changed = excluded.last_changed,
                event_id = excluded.event_id
            WHERE o.resource_version < excluded.resource_version""",
    ]
    if history:
        # Every change of the batch, winners or not; a copy of an event already
        # recorded (the bridge may publish an id twice) adds nothing.
        statements.append(
            f"""INSERT INTO "{s}".changes (cluster, event_id, uid, change, api_version, kind,
                    namespace, name, resource_version, labels, object, observed_at, source,
                    part, position)
                SELECT cluster, event_id, uid, change, api_version, kind, namespace, name,
                       resource_version, labels, object, observed_at, source, part, position
                FROM {STAGED}
                ON CONFLICT (cluster, event_id) DO NOTHING"""
        )
    return statements


def prune_statement(s: str) -> str:
    return f"""DELETE FROM "{s}".deleted_objects
        WHERE deleted_at < now() - make_interval(secs => $1::double precision)"""
