"""Where a resource starts: the checkpoint read back, the watch's starting point, the uncertain keys.

After a crash the checkpoint knows every key whose event may have reached the
bus. Those keys are *uncertain*: cached as unconfirmed, so the next news of
each (the resumed watch replays it, or a relist settles it) reaches the
handler (bridge/delivery/handler.py), which republishes an unchanged object with
the id it was written ahead with, publishes a change as modified and a vanished
object as deleted. The informer drops replayed states older than its cache
(``drop_stale``), so resuming from a watermark that lags the digests
republishes nothing. An object whose delete is on the bus past the watermark
(a ``GONE`` row) is not cached: the resumed watch replays its earlier states and
its delete, and the handler knows them by the row (``replayed_deletes``) and
publishes nothing for them, so the watch resumes there too instead of a relist
that would collapse every change since the watermark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bridge.checkpoints.base import CheckpointStore, load_bulk
from bridge.delivery.changes import Change, ChangeKind, object_from_digest
from bridge.delivery.events import EventBuilder
from bridge.delivery.outbox import Outbox
from bridge.delivery.reshard import adopt_layout
from bridge.ground.digest import CERTAIN, GONE, Digest
from bridge.ground.envelope import Event
from bridge.ground.records import LooseRecord, PackedColumns, PackedRecord, make_record
from bridge.kube.objects import CachedObject
from bridge.kube.reflector import ReflectorSettings
from bridge.logging import get_logger

log = get_logger(__name__)


@dataclass
class Resumption:
    """What the informer and the outbox start from."""

    reflector: ReflectorSettings
    # The cache as the checkpoint left it, its few records that are not plain packed
    # ones; None: there was no checkpoint.
    records: list[CachedObject] | None = None
    # ... and the many that are, as columns (bridge/ground/records.py).
    packed: PackedColumns | None = None
    # Where the watch resumes; None: a list first.
    start_at: str | None = None
    # The committed watermark the outbox starts from.
    watermark: str = ""
    # Keys written ahead and never acknowledged: their next news settles them.
    uncertain: list[Digest] = field(default_factory=list)
    # Deletes written ahead without an ack: (key, uid, event), to publish again.
    deletes: list[tuple[str, str, Event]] = field(default_factory=list)
    # Keys whose GONE row the first commit removes (the watermark passed their delete).
    gone: list[str] = field(default_factory=list)
    # GONE rows past the watermark: objects whose delete is on the bus though the
    # watch resumes before it, so it replays their earlier states and the delete.
    replayed_deletes: dict[str, Digest] = field(default_factory=dict)

    @property
    def resumed(self) -> bool:
        return self.records is not None

    def outbox(
        self, digest_of: Callable[[str], Digest | None], clock: Callable[[], float] = time.monotonic
    ) -> Outbox:
        """An outbox that starts at the checkpoint: its watermark, its uncertain keys, and
        the deletes to publish again decided first."""
        outbox = Outbox(digest_of, watermark=self.watermark, clock=clock)
        outbox.restore_uncertain(self.uncertain)
        for key, uid, event in self.deletes:
            outbox.decide(key, uid, event, None)
        for key in self.gone:
            outbox.touch(key)
        outbox.restore_gone(self.replayed_deletes.values())
        return outbox


async def resume(
    checkpoints: CheckpointStore,
    resource_id: str,
    builder: EventBuilder,
    reflector: ReflectorSettings,
    *,
    label: str,
) -> Resumption:
    """Read the checkpoint of ``resource_id``: resume where the last run stopped; under a
    new sharding layout, from the digests of the layouts before (bridge/delivery/reshard.py)."""
    await adopt_layout(checkpoints, resource_id, label=label)
    # Nearly every row is certain with no earlier incarnation: already in the cache's
    # packed layout, handed over as it is.
    checkpoint = await load_bulk(checkpoints, resource_id)
    if checkpoint is None:
        return Resumption(reflector)
    start_at = checkpoint.resource_version or None
    records: list[CachedObject] = list(checkpoint.loose)
    uncertain: list[Digest] = []
    deletes: list[tuple[str, str, Event]] = []
    # Deletes on the bus, maybe after the watermark (see GONE).
    gone_after: dict[str, Digest] = {}
    gone_keys: list[str] = []
    for d in checkpoint.others:
        if d.state == GONE:
            if start_at is not None and _after(d.resource_version, start_at):
                gone_after[d.key] = d
            else:
                gone_keys.append(d.key)
            continue
        for gone in filter(None, d.prior.split(",")):
            # An earlier object of this name whose delete was in flight: its
            # own events are older than this key's, so no replay brings it.
            deletes.append((d.key, gone, _delete_again(builder, d, gone)))
        if d.state == CERTAIN:
            records.append(_record_of(d))
            continue
        # Written ahead, never acknowledged: cached as unconfirmed, so the
        # next news of the key (the replayed change itself, a later one, its
        # delete, or its absence from a relist) reaches the handler.
        uncertain.append(d)
        records.append(_record_of(d, unconfirmed=True))
    if start_at is not None and not all(_after(d.resource_version, start_at) for d in uncertain):
        # A watch from the watermark would not bring news of every uncertain
        # key: relist the latest state instead.
        start_at = None
    if start_at is None:
        # A relist does not hold the deleted objects: their rows go at the first commit.
        gone_keys.extend(gone_after)
        gone_after = {}
    if start_at is None:
        # A relist diffed against the digests reads the latest state (a
        # consistent read), never a lagging watch cache, whose missing
        # objects would look like deletes.
        reflector = replace(reflector, consistent_first_list=True)
    log.info(
        "resuming from checkpoint",
        resource=label,
        resource_version=checkpoint.resource_version,
        objects=len(records) + len(checkpoint.packed),
        uncertain=len(uncertain),
        prior_deletes=len(deletes),
        replayed_deletes=len(gone_after),
        relist=start_at is None,
    )
    return Resumption(
        reflector,
        records=records,
        packed=checkpoint.packed,
        start_at=start_at,
        watermark=checkpoint.resource_version,
        uncertain=uncertain,
        deletes=deletes,
        gone=gone_keys,
        replayed_deletes=gone_after,
    )


def _delete_again(builder: EventBuilder, d: Digest, uid: str) -> Event:
    """A delete that was written ahead and may not have reached the bus: again, same id."""
    gone = object_from_digest(
        Digest(d.key, uid, d.resource_version if uid == d.uid else "", ""),
        api_version=builder.api_version,
        kind=builder.kind,
    )
    return builder.build(Change(ChangeKind.DELETED, gone, d.key, tombstone=True))


def _record_of(digest: Digest, *, unconfirmed: bool = False) -> PackedRecord | LooseRecord:
    return make_record(
        digest.key, digest.uid, digest.resource_version, digest.fingerprint, unconfirmed
    )


def _after(resource_version: str, watermark: str) -> bool:
    try:
        return int(resource_version) > int(watermark)
    except ValueError:
        return False
