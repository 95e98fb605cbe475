"""Dead letters: events the bus refused for good, kept for a person (``poisonPolicy: deadLetter``).

Under ``deadLetter`` the main stream gets the truncated event, as under
``truncate`` (same id, ``data.object`` cut to its metadata), so consumers still
see the change; the event itself goes to the dead-letter destination
(``sink.kafka.deadLetterTopic``, ``sink.nats.deadLetterSubject``) with headers
saying why. Its value is the event's structured JSON, whole, or, when that
does not fit the destination's own limit either (the producer's
``maxRequestSize``, the NATS server's ``max_payload``), its first bytes up to
that limit, which ``deadletter_cut`` says: then it is not valid JSON.

Headers (Kafka record headers, NATS message headers):

- ``ce_id``, ``ce_type``, ``ce_source``, ``ce_subject``: the refused event's;
- ``deadletter_reason``: the bus's refusal, as the warning logged with it;
- ``deadletter_size``: bytes of the refused event's JSON;
- ``deadletter_cut``: present only when the value was cut: the bytes it kept.

A dead letter is keyed like its event (Kafka key = subject). On NATS its
``Nats-Msg-Id`` is ``{id}:deadletter``, so a stream that stores the main
subjects and the dead-letter subject together does not drop it as a duplicate
of the truncated event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bridge.ground.envelope import Event

REASON = "deadletter_reason"
SIZE = "deadletter_size"
CUT = "deadletter_cut"
MSG_ID_SUFFIX = ":deadletter"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused event and why the bus refused it."""

    event: Event
    reason: str


def headers(letter: DeadLetter, size: int, kept: int | None = None) -> list[tuple[str, str]]:
    """The dead letter's headers (see the module docstring); ``kept``: the bytes left
    after a cut, None when the value is whole."""
    e = letter.event
    out = [
        ("ce_id", e.id),
        ("ce_type", e.type),
        ("ce_source", e.source),
        ("ce_subject", e.subject),
        # One line: NATS header values end at a line break.
        (REASON, " ".join(letter.reason.split())),
        (SIZE, str(size)),
    ]
    if kept is not None:
        out.append((CUT, str(kept)))
    return out


def fitted(
    letter: DeadLetter, limit: int, overhead: Callable[[list[tuple[str, str]]], int]
) -> tuple[bytes, list[tuple[str, str]]]:
    """(value, headers) of the dead letter within ``limit`` bytes, ``overhead(headers)``
    being what the destination counts besides the value: whole if it fits, else cut."""
    payload = letter.event.to_json()
    size = len(payload)
    whole = headers(letter, size)
    if size + overhead(whole) <= limit:
        return payload, whole
    # The widest count the cut header can hold (the room is below the size).
    room = max(0, limit - overhead(headers(letter, size, kept=size)))
    return payload[:room], headers(letter, size, kept=room)


@runtime_checkable
class DeadLetterSink(Protocol):
    """A sink that takes dead letters (Kafka, NATS); each is sent whole or cut to fit.

    Returns the dead letters the dead-letter destination refused in turn (index →
    reason); raises ``SinkUnavailableError`` when the bus cannot be reached, as
    ``Sink.publish`` does.
    """

    async def publish_dead_letters(self, letters: Sequence[DeadLetter]) -> Mapping[int, str]: ...
