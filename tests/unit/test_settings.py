"""Settings: YAML + BRIDGE_* env + CLI overrides; every error is one line naming the key."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.errors import ConfigError
from bridge.service.settings import (
    Settings,
    load_settings,
    resources_for_shard,
    settings_json_schema,
    shard_of,
)

DESIGN_EXAMPLE = """
cluster:
  kubeconfig: ./kubeconfig
  context: null
  name: dev
resources:
  - apiVersion: v1
    kind: Pod
    namespaces: []
    labelSelector: ""
    fieldSelector: ""
    ignoreFields: ["status.conditions"]
  - apiVersion: example.com/v1
    kind: Widget
sink:
  kind: nats
  nats:
    servers: ["nats://127.0.0.1:4222"]
    stream: K8S
  kafka:
    bootstrapServers: ["127.0.0.1:9092"]
    topic: k8s-events
checkpoint:
  kind: sqlite
  path: ./k8s-bridge-state.db
"""

MINIMAL: dict[str, Any] = {
    "resources": [{"apiVersion": "v1", "kind": "Pod"}],
    "sink": {"kind": "stdout"},
}


def write(tmp_path: Path, data: dict[str, Any] | str) -> str:
    path = tmp_path / "bridge.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def error_of(path: str | None, overrides: dict[str, Any] | None = None, **env: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(path, overrides, env=env)
    message = str(info.value)
    assert "\n" not in message, "config errors are one line"
    assert message.startswith("config error: ")
    return message


# --- the documented example and defaults ---------------------------------------


def test_design_example_loads_with_documented_values(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, DESIGN_EXAMPLE), env={})
    assert settings.cluster.name == "dev" and settings.cluster.kubeconfig == "./kubeconfig"
    assert [r.kind for r in settings.resources] == ["Pod", "Widget"]
    assert settings.resources[0].ignore_fields == ["status.conditions"]
    assert settings.resources[1].group == "example.com" and settings.resources[1].version == "v1"
    assert settings.resources[0].group == "" and settings.resources[0].redact_secrets is True
    assert settings.sink.kind == "nats" and settings.sink.nats.stream == "K8S"
    assert settings.sink.nats.subjects == ["k8s.>"] and settings.sink.nats.create_stream
    assert settings.sink.kafka.topic == "k8s-events" and settings.sink.kafka.acks == "all"
    assert settings.checkpoint.kind == "sqlite" and settings.sink.max_batch == 500


def test_defaults_of_every_section(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, MINIMAL), env={})
    assert settings.cluster.name == "default" and settings.cluster.kubeconfig is None
    assert settings.informer.page_size == 500 and settings.informer.watch_list == "auto"
    assert settings.informer.resync_period is None and settings.informer.max_queued == 100
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8080)
    assert (settings.logging.format, settings.logging.level) == ("auto", "info")
    le = settings.leader_election
    assert not le.enabled and le.lease_name == "k8s-bridge" and le.namespace == "default"
    assert (le.lease_duration, le.renew_deadline, le.retry_period) == (15, 10, 2)
    assert (settings.sharding.shards, settings.sharding.shard_index) == (1, 0)
    assert settings.sink.kafka.linger_ms == 0 and settings.sink.kafka.enable_idempotence


def test_snake_case_keys_are_accepted_too(tmp_path: Path) -> None:
    data = {**MINIMAL, "informer": {"page_size": 50}, "leader_election": {"enabled": True}}
    settings = load_settings(write(tmp_path, data), env={})
    assert settings.informer.page_size == 50 and settings.leader_election.enabled


def test_kafka_acks_accepts_yaml_int_and_env_string(tmp_path: Path) -> None:
    kafka = {"acks": 1, "enableIdempotence": False}
    path = write(tmp_path, {**MINIMAL, "sink": {"kind": "kafka", "kafka": kafka}})
    assert load_settings(path, env={}).sink.kafka.acks == 1
    assert load_settings(path, env={"BRIDGE_SINK__KAFKA__ACKS": "0"}).sink.kafka.acks == 0
    assert load_settings(path, env={"BRIDGE_SINK__KAFKA__ACKS": "-1"}).sink.kafka.acks == "all"


def test_acks_other_than_all_with_the_idempotent_producer_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, {**MINIMAL, "sink": {"kind": "kafka", "kafka": {"acks": 1}}})
    assert error_of(path) == (
        "config error: sink.kafka.acks: 1 needs sink.kafka.enableIdempotence false"
        " (the idempotent producer, the default, requires acks all)"
    )


def test_secrets_are_not_shown_in_repr(tmp_path: Path) -> None:
    data = {**MINIMAL, "sink": {"kind": "kafka", "kafka": {"saslPassword": "hunter2"}}}
    settings = load_settings(write(tmp_path, data), env={})
    assert "hunter2" not in repr(settings)
    assert settings.sink.kafka.sasl_password is not None
    assert settings.sink.kafka.sasl_password.get_secret_value() == "hunter2"


# --- errors name the key ----------------------------------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, {**MINIMAL, "sinks": {}}))
    assert message == "config error: sinks: unknown key (did you mean sink?)"


def test_unknown_nested_key_in_resource(tmp_path: Path) -> None:
    data = {**MINIMAL, "resources": [{"apiVersion": "v1", "kind": "Pod", "kindd": "x"}]}
    message = error_of(write(tmp_path, data))
    assert message.startswith("config error: resources[0].kindd: unknown key")


def test_unknown_key_deep_in_sink(tmp_path: Path) -> None:
    data = {**MINIMAL, "sink": {"kind": "kafka", "kafka": {"lingerMS": 3}}}
    assert "sink.kafka.lingerMS: unknown key" in error_of(write(tmp_path, data))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            {"sink": {"kind": "stdout", "linger": 0.1}},
            "sink.linger: 0.1 is invalid: input should be less than or equal to 0.05",
        ),
        (
            {"sink": {"kind": "stdout", "steadyLinger": 2}},
            "sink.steadyLinger: 2 is invalid: input should be less than or equal to 1",
        ),
        (
            {"cluster": {"name": ""}},
            "cluster.name: '' is invalid: string should have at least 1 character",
        ),
    ],
)
def test_a_value_out_of_bounds_names_its_key_and_the_bound(
    tmp_path: Path, override: dict[str, Any], expected: str
) -> None:
    assert error_of(write(tmp_path, {**MINIMAL, **override})) == f"config error: {expected}"


def test_bad_enum_lists_the_choices(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, {**MINIMAL, "sink": {"kind": "rabbit"}}))
    assert message == "config error: sink.kind: 'rabbit' is not one of nats, kafka, stdout"


def test_wrong_type_names_key_and_value(tmp_path: Path) -> None:
    data = {**MINIMAL, "sink": {"kind": "kafka", "kafka": {"lingerMs": "soon"}}}
    message = error_of(write(tmp_path, data))
    assert message.startswith("config error: sink.kafka.lingerMs: 'soon' is invalid")
    assert "integer" in message


def test_shard_index_must_be_below_shards(tmp_path: Path) -> None:
    data = {**MINIMAL, "sharding": {"shards": 2, "shardIndex": 2}}
    message = error_of(write(tmp_path, data))
    assert message == "config error: sharding.shardIndex: 2 must be less than shards (2)"


def test_renew_deadline_must_be_below_lease_duration(tmp_path: Path) -> None:
    data = {**MINIMAL, "leaderElection": {"leaseDuration": 5, "renewDeadline": 5}}
    assert "leaderElection.renewDeadline: 5 must be less than leaseDuration" in error_of(
        write(tmp_path, data)
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "labelSelector",
            "app in (a,",
            "config error: resources[0].labelSelector: 'app in (a,' is not a valid label "
            "selector: the 'in' list is not closed with ')'",
        ),
        (
            "fieldSelector",
            "status.phase",
            "config error: resources[0].fieldSelector: 'status.phase' is not a valid field "
            "selector: 'status.phase' has no '=', '==' or '!='",
        ),
    ],
)
def test_bad_selector_syntax_is_one_line_naming_the_key(
    tmp_path: Path, key: str, value: str, expected: str
) -> None:
    data = {**MINIMAL, "resources": [{"apiVersion": "v1", "kind": "Pod", key: value}]}
    assert error_of(write(tmp_path, data)) == expected


def test_selectors_the_server_may_reject_for_the_kind_still_load(tmp_path: Path) -> None:
    """Which fields a kind can be selected by is the API server's to say, at run time."""
    data = {
        **MINIMAL,
        "resources": [{"apiVersion": "v1", "kind": "Pod", "fieldSelector": "spec.bogus=1"}],
    }
    assert load_settings(write(tmp_path, data)).resources[0].field_selector == "spec.bogus=1"


@pytest.mark.parametrize(
    ("first", "second", "where"),
    [
        ({}, {}, "in all namespaces"),
        ({"namespaces": ["a", "b"]}, {"namespaces": ["c", "b"]}, "in namespace b"),
        ({}, {"namespaces": ["x"]}, "in namespace x"),
        ({"labelSelector": "a=1,b"}, {"labelSelector": "b, a==1"}, "in all namespaces"),
    ],
)
def test_the_same_resource_twice_is_one_line_naming_both_indexes(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any], where: str
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod"}
    resources = [{**pod, **first}, {"apiVersion": "v1", "kind": "Secret"}, {**pod, **second}]
    message = error_of(write(tmp_path, {**MINIMAL, "resources": resources}))
    assert message == (
        f"config error: resources[0] and resources[2] both watch v1/Pod with the same "
        f"selectors {where}: each change would be published twice; merge them or make their "
        "namespaces disjoint"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"namespaces": ["a"]}, {"namespaces": ["b"]}),
        ({"labelSelector": "tier=web"}, {"labelSelector": "tier=db"}),
        ({"fieldSelector": "status.phase=Running"}, {}),
    ],
)
def test_the_same_kind_with_disjoint_scope_or_other_selectors_is_fine(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any]
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod"}
    data = {**MINIMAL, "resources": [{**pod, **first}, {**pod, **second}]}
    assert len(load_settings(write(tmp_path, data)).resources) == 2


def test_missing_resources(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, {"sink": {"kind": "stdout"}}))
    assert message.startswith("config error: resources: required key is missing")


def test_empty_resources(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, {**MINIMAL, "resources": []}))
    assert message == "config error: resources: at least one resource is required"


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    message = error_of(str(tmp_path / "absent.yaml"))
    assert "absent.yaml" in message and "No such file" in message


def test_bad_yaml_names_line(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "sink: [1,\n  kind: 2\n"))
    assert "invalid YAML at line" in message


def test_top_level_list_is_rejected(tmp_path: Path) -> None:
    assert "must be a mapping" in error_of(write(tmp_path, "- a\n- b\n"))


# --- environment and CLI overrides -------------------------------------------------


def test_env_wins_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, {**MINIMAL, "sink": {"kind": "nats"}})
    settings = load_settings(path, env={"BRIDGE_SINK__KIND": "kafka", "HOME": "/x"})
    assert settings.sink.kind == "kafka"


def test_nested_env_in_any_spelling(tmp_path: Path) -> None:
    env = {
        "BRIDGE_SINK__KAFKA__LINGERMS": "9",
        "BRIDGE_SINK__KAFKA__MAX_BATCH_SIZE": "100",
        "BRIDGE_LEADERELECTION__ENABLED": "true",
        "BRIDGE_CLUSTER__NAME": "prod",
    }
    settings = load_settings(write(tmp_path, MINIMAL), env=env)
    assert settings.sink.kafka.linger_ms == 9 and settings.sink.kafka.max_batch_size == 100
    assert settings.leader_election.enabled and settings.cluster.name == "prod"


def test_env_lists_as_json_or_commas(tmp_path: Path) -> None:
    env = {
        "BRIDGE_SINK__NATS__SERVERS": '["nats://a:4222", "nats://b:4222"]',
        "BRIDGE_SINK__KAFKA__BOOTSTRAPSERVERS": "k1:9092, k2:9092",
    }
    settings = load_settings(write(tmp_path, MINIMAL), env=env)
    assert settings.sink.nats.servers == ["nats://a:4222", "nats://b:4222"]
    assert settings.sink.kafka.bootstrap_servers == ["k1:9092", "k2:9092"]


def test_env_resources_whole_list_or_by_index(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    whole = load_settings(
        path, env={"BRIDGE_RESOURCES": '[{"apiVersion": "apps/v1", "kind": "Deployment"}]'}
    )
    assert [r.kind for r in whole.resources] == ["Deployment"]
    indexed = load_settings(
        path,
        env={
            "BRIDGE_RESOURCES__0__NAMESPACES": "a,b",
            "BRIDGE_RESOURCES__1__APIVERSION": "v1",
            "BRIDGE_RESOURCES__1__KIND": "Node",
        },
    )
    assert [r.kind for r in indexed.resources] == ["Pod", "Node"]
    assert indexed.resources[0].namespaces == ["a", "b"]


def test_env_alone_without_file() -> None:
    settings = load_settings(
        None,
        env={
            "BRIDGE_RESOURCES": '[{"apiVersion": "v1", "kind": "Pod"}]',
            "BRIDGE_SINK__KIND": "stdout",
        },
    )
    assert settings.sink.kind == "stdout"


def test_bad_env_value_names_the_variable(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, MINIMAL), BRIDGE_SINK__KAFKA__LINGERMS="abc")
    assert message.startswith(
        "config error: sink.kafka.lingerMs (from BRIDGE_SINK__KAFKA__LINGERMS): 'abc' is invalid"
    )


def test_bad_env_enum_names_the_variable(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, MINIMAL), BRIDGE_SINK__KIND="rabbit")
    assert message == (
        "config error: sink.kind (from BRIDGE_SINK__KIND): 'rabbit' is not one of nats, kafka, stdout"
    )


def test_unknown_env_key_is_an_error(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, MINIMAL), BRIDGE_SINK__KAFKA__LINGER="5")
    assert "sink.kafka.linger (from BRIDGE_SINK__KAFKA__LINGER): unknown key" in message


def test_bad_json_in_env(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, MINIMAL), BRIDGE_RESOURCES="[{oops")
    assert message.startswith("config error: BRIDGE_RESOURCES: '[{oops' is not valid JSON")


def test_cli_overrides_win_over_env(tmp_path: Path) -> None:
    settings = load_settings(
        write(tmp_path, MINIMAL),
        {"sink.kind": "nats", "server": {"port": 9999}},
        env={"BRIDGE_SINK__KIND": "kafka"},
    )
    assert settings.sink.kind == "nats" and settings.server.port == 9999


def test_env_mapping_defaults_to_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRIDGE_CLUSTER__NAME", "from-env")
    assert load_settings(write(tmp_path, MINIMAL)).cluster.name == "from-env"


def test_settings_constructor_reads_only_prefixed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK", "nonsense")  # must not be read: only BRIDGE_* counts
    monkeypatch.setenv("BRIDGE_SINK__KIND", "kafka")
    settings = Settings(resources=[{"apiVersion": "v1", "kind": "Pod"}])  # type: ignore[list-item]
    assert settings.sink.kind == "kafka"


# --- schema and sharding ------------------------------------------------------------


def test_json_schema_uses_yaml_spelling_and_validates_example() -> None:
    schema = settings_json_schema()
    text = json.dumps(schema)
    assert '"leaderElection"' in text and '"lingerMs"' in text and '"apiVersion"' in text
    assert "linger_ms" not in text
    assert set(schema["required"]) == {"resources", "sink"}
    assert schema["additionalProperties"] is False


def test_shards_split_resources_stably_and_completely(tmp_path: Path) -> None:
    kinds = [f"Kind{i}" for i in range(40)]
    resources = [{"apiVersion": "example.com/v1", "kind": k} for k in kinds]
    seen: Counter[str] = Counter()
    for index in range(3):
        data = {**MINIMAL, "resources": resources, "sharding": {"shards": 3, "shardIndex": index}}
        mine = resources_for_shard(load_settings(write(tmp_path, data), env={}))
        assert all(shard_of(r.gvk, 3) == index for r in mine)
        seen.update(r.kind for r in mine)
    assert seen == Counter(kinds), "every resource lands on exactly one shard"
    # Stable across processes: a fixed identity maps to a fixed shard.
    assert shard_of("v1/Pod", 3) == shard_of("v1/Pod", 3)
    assert shard_of("v1/Pod", 1) == 0


def test_single_shard_keeps_everything(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, DESIGN_EXAMPLE), env={})
    assert resources_for_shard(settings) == settings.resources


def test_sharding_by_uid_or_namespace_serves_every_resource_its_slice(tmp_path: Path) -> None:
    from bridge.kube.sharding import shard_range

    for by in ("uid", "namespace"):
        data = {**MINIMAL, "sharding": {"by": by, "shards": 3, "shardIndex": 2}}
        settings = load_settings(write(tmp_path, data), env={})
        assert resources_for_shard(settings) == settings.resources
        assert settings.sharding.range() == shard_range(3, 2, by)
    # by resource (the default) or one shard: no slice, today's behaviour.
    assert load_settings(write(tmp_path, MINIMAL), env={}).sharding.range() is None
    one = {**MINIMAL, "sharding": {"by": "uid", "shards": 1}}
    assert load_settings(write(tmp_path, one), env={}).sharding.range() is None


def test_each_shard_of_one_kind_elects_on_a_lease_of_its_own(tmp_path: Path) -> None:
    from bridge.service.settings import lease_name

    le = {"enabled": True, "leaseName": "bridge"}
    data = {
        **MINIMAL,
        "leaderElection": le,
        "sharding": {"by": "uid", "shards": 3, "shardIndex": 2},
    }
    assert lease_name(load_settings(write(tmp_path, data), env={})) == "bridge-shard-2"
    # Resource sharding keeps the configured name (one deployment per shard names its own).
    data["sharding"] = {"shards": 3, "shardIndex": 2}
    assert lease_name(load_settings(write(tmp_path, data), env={})) == "bridge"


def test_sharding_by_an_unknown_field_names_the_choices(tmp_path: Path) -> None:
    data = {**MINIMAL, "sharding": {"by": "name", "shards": 2}}
    assert error_of(write(tmp_path, data)) == (
        "config error: sharding.by: 'name' is not one of resource, uid, namespace"
    )


@pytest.mark.parametrize("key", ["ignoreFields", "maskPaths", "triggerPaths", "fields"])
def test_a_bad_path_is_a_config_error_at_load_naming_the_key(tmp_path: Path, key: str) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(
        "sink: {kind: stdout}\n"
        f"resources:\n  - {{apiVersion: v1, kind: Pod, {key}: ['status..x']}}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(str(path))
    assert str(info.value) == (
        f"config error: resources[0].{key}: ['status..x'] has a bad path 'status..x': empty segment"
    )


# --- dead letters and tracing --------------------------------------------------------


@pytest.mark.parametrize(
    ("sink", "resource_policy", "message"),
    [
        (
            {"kind": "kafka", "poisonPolicy": "deadLetter"},
            None,
            "sink.poisonPolicy: deadLetter needs sink.kafka.deadLetterTopic",
        ),
        (
            {"kind": "nats"},
            "deadLetter",
            "resources[0].poisonPolicy: deadLetter needs sink.nats.deadLetterSubject",
        ),
        (
            {"kind": "stdout", "poisonPolicy": "deadLetter"},
            None,
            "sink.poisonPolicy: deadLetter needs a kafka or nats sink (sink.kind is stdout)",
        ),
        (
            {"kind": "nats", "nats": {"deadLetterSubject": "dead.>"}},
            None,
            "sink.nats.deadLetterSubject: 'dead.>' is not a plain NATS subject (no spaces,"
            " wildcards or empty tokens)",
        ),
    ],
)
def test_dead_letters_without_a_destination_are_one_line_naming_the_key(
    tmp_path: Path, sink: dict[str, Any], resource_policy: str | None, message: str
) -> None:
    resource: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"}
    if resource_policy:
        resource["poisonPolicy"] = resource_policy
    path = write(tmp_path, {"resources": [resource], "sink": sink})
    assert error_of(path) == f"config error: {message}"


def test_dead_letters_with_their_destination_load(tmp_path: Path) -> None:
    sink = {"kind": "kafka", "poisonPolicy": "deadLetter", "kafka": {"deadLetterTopic": "dl"}}
    settings = load_settings(write(tmp_path, {**MINIMAL, "sink": sink}), env={})
    assert (settings.sink.poison_policy, settings.sink.kafka.dead_letter_topic) == (
        "deadLetter",
        "dl",
    )


def test_tracing_is_off_by_default_and_wants_an_http_endpoint(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, MINIMAL), env={}).tracing.otlp_endpoint is None
    path = write(tmp_path, {**MINIMAL, "tracing": {"otlpEndpoint": "collector:4317"}})
    assert error_of(path) == (
        "config error: tracing.otlpEndpoint: 'collector:4317' is not an http(s) URL (OTLP over"
        " HTTP, e.g. http://collector:4318/v1/traces)"
    )


# --- built in code ------------------------------------------------------------------


def test_sections_built_in_code_are_validated_like_a_file() -> None:
    from bridge.ground.sections import SectionError
    from bridge.service.settings import KafkaSettings, ResourceSettings, SinkSettings

    with pytest.raises(SectionError, match="lingerMs: Input should be greater than or equal"):
        KafkaSettings(linger_ms=-1)
    with pytest.raises(ValueError, match="kind: required key is missing"):
        ResourceSettings(api_version="v1")
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        ResourceSettings(api_version="v1", kind="Pod", bogus=1)  # type: ignore[call-arg]
    # Nested sections from mappings in either spelling, loose scalars converted.
    sink = SinkSettings(kind="kafka", kafka={"lingerMs": "5", "enable_idempotence": "no"})  # type: ignore[arg-type]
    assert sink.kafka.linger_ms == 5 and sink.kafka.enable_idempotence is False
    assert ResourceSettings(api_version="v1", kind="Pod", group=None).api_group is None  # type: ignore[call-arg]


def test_sections_compare_by_value_and_are_not_hashable() -> None:
    from bridge.service.settings import ResourceSettings

    a = ResourceSettings(api_version="v1", kind="Pod")
    assert a == ResourceSettings(api_version="v1", kind="Pod")
    assert a != ResourceSettings(api_version="v1", kind="Node")
    with pytest.raises(TypeError):
        hash(a)


def test_replace_copies_a_section_with_changes() -> None:
    from bridge.ground.sections import fields_set, replace
    from bridge.service.settings import ResourceSettings

    entry = ResourceSettings(api_group="apps", kinds=["*"], namespaces=["a"])
    one = replace(entry, api_version="apps/v1", kind="Deployment", api_group=None, kinds=[])
    assert (one.gvk, one.namespaces, one.selects_kinds) == ("apps/v1/Deployment", ["a"], False)
    assert entry.kinds == ["*"] and "kind" in fields_set(one)
    with pytest.raises(TypeError):
        replace(entry, nonsense=1)
