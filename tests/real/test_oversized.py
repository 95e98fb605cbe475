"""Oversized objects on the real kube-apiserver and Apache Kafka, through each poison policy.

What the real servers allow (test_what_the_real_api_server_stores): a ConfigMap's
data may hold 1 MiB (validation, 422 beyond); any object up to etcd's request
limit of 1.5 MiB is stored (beyond: 500 "etcdserver: request is too large", and
past 3 MiB the API server's own 413). So an object of about 1 MiB is ordinary,
and its event can be refused twice over: by the bridge before sending, when
the record is over ``sink.kafka.maxRequestSize`` (1 MiB by default), or by
Kafka, when it is over the broker's ``message.max.bytes`` (256 KiB here).

Each refused event meets ``poisonPolicy`` as the README's guarantee table says: ``truncate``
publishes the same id with ``data.object`` cut to its metadata and
``data.truncated: true``; ``skip`` publishes nothing for it; ``fail`` stops that
resource (not-ready, naming the object) while the others go on. With truncate
and skip the events behind the oversized ones still arrive, in order.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.bridge_process import BridgeProcess, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realkafka import KafkaBroker
from tests.fixtures.waiting import until
from tests.real.kafkabus import decoded, pod, read_topic, running, watermark

pytestmark = [pytest.mark.timeout(180)]

Body = dict[str, Any]
MiB = 1024 * 1024
BROKER_LIMIT = 256 * 1024  # the broker's message.max.bytes in these tests


def configmap(name: str, ns: str, size: int) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"size": str(size)}},
        "data": {"blob": "x" * size},
    }


def rv(obj: Body) -> int:
    return int(obj["metadata"]["resourceVersion"])


def poison_counts(metrics: str, resource: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == "k8s_bridge_poison_events_total" and s.labels.get("resource") == resource:
                out[s.labels["outcome"]] = int(s.value)
    return {k: v for k, v in out.items() if v}


def test_what_the_real_api_server_stores(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    ns = kube_namespace
    cm = kube_cluster.path("v1", "ConfigMap", ns, None)
    pods = kube_cluster.path("v1", "Pod", ns, None)
    assert kube_cluster.raw("POST", cm, configmap("at-limit", ns, MiB - 4))[0] == 201
    status, out = kube_cluster.raw("POST", cm, configmap("over-limit", ns, MiB + 64))
    assert status == 422 and "may not be more than 1048576 bytes" in out["message"], out

    def big_pod(name: str, size: int) -> Body:
        env = [{"name": f"E{i}", "value": "x" * 1000} for i in range(size // 1024)]
        body = pod(name, ns)
        body["spec"]["containers"][0]["env"] = env
        return body

    assert kube_cluster.raw("POST", pods, big_pod("p1400k", 1400 * 1024))[0] == 201
    status, out = kube_cluster.raw("POST", pods, big_pod("p1600k", 1600 * 1024))
    assert status == 500 and "etcdserver: request is too large" in out["message"], out
    status, out = kube_cluster.raw("POST", pods, big_pod("p3300k", 3300 * 1024))
    assert status == 413, out


@pytest.mark.kafka_settings(message_max_bytes=BROKER_LIMIT)
@pytest.mark.parametrize("policy", ["truncate", "skip", "fail"])
async def test_oversized_events_meet_the_poison_policy_and_the_rest_arrive(
    policy: str,
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kafka_private: KafkaBroker,
) -> None:
    ns, topic = kube_namespace, "big-" + uuid.uuid4().hex[:8]
    broker = real_kafka_private
    cms = f"v1/configmaps@{ns}"
    db = tmp_path / "state.db"
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kube_cluster.write_kubeconfig(tmp_path / "kubeconfig"),
        sink={"kind": "kafka", "kafka": {"bootstrapServers": [broker.bootstrap], "topic": topic}},
        resources=[
            {"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [ns], "poisonPolicy": policy},
            {"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]},
        ],
        checkpoint={"kind": "sqlite", "path": str(db), "commitInterval": 0.1},
    )
    async with running(BridgeProcess(config)) as bridge:
        await bridge.wait_ready(60)
        a = kube_cluster.create(configmap("a", ns, 10))
        # Over the broker's message.max.bytes, under maxRequestSize: Kafka refuses it.
        mid = kube_cluster.create(configmap("mid", ns, 2 * BROKER_LIMIT))
        # Over maxRequestSize (1 MiB): the bridge refuses it before sending.
        big = kube_cluster.create(configmap("big", ns, MiB - 4))
        b = kube_cluster.create(configmap("b", ns, 10))
        a2 = kube_cluster.patch("v1", "ConfigMap", "a", {"data": {"blob": "y"}}, namespace=ns)
        web = kube_cluster.create(pod("web", ns))
        await until(lambda: watermark(db, f"core/v1/pods@{ns}") >= rv(web), 60, bridge.tail_log)
        if policy == "fail":
            reasons = ""

            async def stopped() -> bool:
                nonlocal reasons
                status, reasons = await bridge.readyz()
                return status == 503 and f"{cms}: stopped:" in reasons

            await until(stopped, 30, lambda: reasons)
            line = next(r for r in reasons.splitlines() if f"{cms}: stopped:" in r)
            assert f"the bus refused {ns}/mid" in line and "poisonPolicy is fail" in line, line
            assert "message.max.bytes" in line, line
            # The checkpoint stays before the refused event: a restart tries it again.
            assert watermark(db, f"core/v1/configmaps@{ns}", settled=False) < rv(mid)
        else:
            await until(
                lambda: watermark(db, f"core/v1/configmaps@{ns}") >= rv(a2), 60, bridge.tail_log
            )
            await bridge.wait_ready(30)
        want_counts = {"truncate": {"truncated": 2}, "skip": {"skipped": 2}, "fail": {"failed": 1}}
        counts: dict[str, int] = {}

        async def counted() -> bool:
            nonlocal counts
            counts = poison_counts(await bridge.metrics(), cms)
            return counts == want_counts[policy]

        # The observer carries the pipelines' counts over to the metrics once a second.
        await until(counted, 10, lambda: f"poison counts {counts}")
    events = decoded(await read_topic(broker.bootstrap, topic))
    got = [(e["subject"].split("/")[1], e["type"].rsplit(".", 1)[-1], e["id"]) for e in events]
    ident = {o["metadata"]["name"]: o["metadata"]["uid"] for o in (a, mid, big, b, web)}

    def event(obj: Body, change: str) -> tuple[str, str, str]:
        md = obj["metadata"]
        return md["name"], change, f"{md['uid']}:{md['resourceVersion']}"

    assert event(web, "added") in got  # the other resource goes on whatever the policy
    # Only per object is there an order: a truncated copy goes out after its batch.
    per_object: dict[str, list[tuple[str, str]]] = {}
    for name, change, id_ in got:
        per_object.setdefault(name, []).append((change, id_))
    log = bridge.log.read_text()
    if policy == "fail":
        # The resource stopped at mid: nothing of mid or big, a's add before it.
        # Events decided in the same batch as mid were sent with it and may be there.
        assert "mid" not in per_object and "big" not in per_object, per_object
        assert per_object["a"][0] == event(a, "added")[1:]
        return
    want = {"a": [event(a, "added")[1:], event(a2, "modified")[1:]], "b": [event(b, "added")[1:]]}
    if policy == "truncate":
        want |= {"mid": [event(mid, "added")[1:]], "big": [event(big, "added")[1:]]}
        for e in events:
            name = e["subject"].split("/")[1]
            if name in ("mid", "big"):
                assert e["data"]["truncated"] is True
                obj = e["data"]["object"]
                assert "data" not in obj, "a truncated event keeps the metadata only"
                assert obj["metadata"]["uid"] == ident[name]
                assert obj["metadata"]["labels"]["size"] in (str(2 * BROKER_LIMIT), str(MiB - 4))
    assert {k: v for k, v in per_object.items() if k != "web"} == want
    refusals = [line for line in log.splitlines() if "the bus refused an event for good" in line]
    assert len(refusals) == 2, refusals
    assert f"{ns}/mid" in refusals[0] and "message.max.bytes" in refusals[0]
    assert f"{ns}/big" in refusals[1] and "maxRequestSize" in refusals[1]
