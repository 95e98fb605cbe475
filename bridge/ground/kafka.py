"""How every Kafka client of the bridge reaches the cluster: aiokafka's connection
options (servers, security protocol, SASL, TLS) from plain values, so the sink,
the checkpoint store, ``check``, ``tail`` and the consumer connect the same way."""

from __future__ import annotations

import ssl
from typing import Any


def connection_options(
    bootstrap_servers: list[str],
    client_id: str,
    *,
    security_protocol: str = "PLAINTEXT",
    sasl_mechanism: str | None = None,
    sasl_username: str | None = None,
    sasl_password: str | None = None,
    ssl_cafile: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments aiokafka's producers, consumers and admin clients take."""
    options: dict[str, Any] = {
        "bootstrap_servers": list(bootstrap_servers),
        "security_protocol": security_protocol,
        "client_id": client_id,
    }
    if sasl_mechanism:
        options.update(
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_username,
            sasl_plain_password=sasl_password,
        )
    if ssl_cafile or ssl_certfile or security_protocol in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(cafile=ssl_cafile)
        if ssl_certfile:
            ctx.load_cert_chain(ssl_certfile, ssl_keyfile)
        options["ssl_context"] = ctx
    return options
