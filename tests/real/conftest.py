"""The real-server tier: every test here runs against kube-apiserver + etcd,
Apache Kafka, kubectl or helm as built by `tools/realdeps/build` (`make realdeps`).

`make test-real` runs this tier alone; `make test` runs it with the rest.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)
