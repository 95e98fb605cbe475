"""The checkpoint row: what the bridge remembers of an object (``Digest``) and
the states of its write-ahead, shared by the pipeline and every checkpoint store."""

from __future__ import annotations

from dataclasses import dataclass

# Digest states, as stored in checkpoints (write-ahead, see bridge/delivery/outbox.py).
CERTAIN = ""  # the event for this state was acknowledged by the bus
UNCERTAIN = "u"  # an event for this state may have reached the bus; not acknowledged
DELETING = "d"  # a delete of this uid may have reached the bus; not acknowledged
# The delete of this uid reached the bus, in the transaction that wrote this row
# (sink.kafka.exactlyOnce), at this resourceVersion; the watermark may still be
# before it. A row of its own, not a tombstone: a watch resumed from an older
# watermark would replay the object and publish it again.
GONE = "g"


# Digest and Change are made for every event: not frozen (a frozen dataclass's
# __init__ sets each field through object.__setattr__, several times slower);
# nothing mutates or hashes them.
@dataclass(slots=True)
class Digest:
    """What the bridge remembers of an object: its identity, version and fingerprint.

    ``state`` says whether the bus acknowledged the event for it (``CERTAIN``)
    or the event was only written ahead (``UNCERTAIN``, ``DELETING``).
    ``prior`` lists uids (comma-separated) of earlier incarnations of the same
    key whose delete events were written ahead but not acknowledged.
    """

    key: str
    uid: str
    resource_version: str
    fingerprint: str
    state: str = CERTAIN
    prior: str = ""
