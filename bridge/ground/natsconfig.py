"""What NATS settings need checked and built without a connection: subject wildcards
and the TLS context. Kept apart from ``bridge.ground.nats`` so that validating a
configuration does not import the NATS client (a Kafka-only bridge never loads it)."""

from __future__ import annotations

import ssl


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a final ``>`` one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not (ca or cert):
        return None
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx
