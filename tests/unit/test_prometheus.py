"""The metrics writer (bridge/ground/prometheus.py), judged by prometheus_client's parser:
what it reads back is what was recorded, names, labels, buckets and all."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.ground.prometheus import (
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    Registry,
    counter_family,
    format_value,
)
from tests.fixtures.metrics import sample_value


def parsed(
    registry: Registry,
) -> dict[str, tuple[str, str, list[tuple[str, dict[str, str], float]]]]:
    """family name → (type, help, samples), as the parser reads them."""
    text = registry.exposition().decode()
    return {
        f.name: (f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_a_counter_is_exposed_with_total() -> None:
    r = Registry()
    c = Counter("sent", "Things sent", ["resource"], namespace="ns", registry=r)
    c.labels("v1/Pod").inc()
    c.labels(resource="v1/Pod").inc(2)
    text = r.exposition().decode()
    assert "# HELP ns_sent_total Things sent\n# TYPE ns_sent_total counter\n" in text
    assert parsed(r)["ns_sent"] == (
        "counter",
        "Things sent",
        [("ns_sent_total", {"resource": "v1/Pod"}, 3.0)],
    )
    with pytest.raises(ValueError):
        c.labels("v1/Pod").inc(-1)


def test_label_values_and_help_are_escaped() -> None:
    r = Registry()
    value = 'a "quoted" \\ back\nslash'
    # A backslash before an n: read back as a newline unless the backslash is escaped.
    text = 'Help with \\n, a real\nnewline and "quotes"'
    g = Gauge("odd", text, ["b", "a"], registry=r)
    g.labels(b=value, a="plain").set(1)
    # The labels sorted by name, as prometheus_client wrote them (diffs stay quiet).
    assert '\nodd{a="plain",b="a \\"quoted\\" \\\\ back\\nslash"} 1.0\n' in r.exposition().decode()
    kind, help, samples = parsed(r)["odd"]
    assert kind == "gauge" and help == text
    assert samples == [("odd", {"a": "plain", "b": value}, 1.0)]


def test_a_histogram_is_cumulative_with_inf_sum_and_count() -> None:
    r = Registry()
    h = Histogram("lat", "Latency", ["sink", "a"], registry=r, buckets=(0.1, 1, 10))
    child = h.labels(sink="k", a='x"y')
    for v in (0.05, 0.1, 0.5, 5, 50):
        child.observe(v)
    kind, _, samples = parsed(r)["lat"]
    labels = {"sink": "k", "a": 'x"y'}
    assert kind == "histogram"
    assert samples == [
        ("lat_bucket", {**labels, "le": "0.1"}, 2.0),
        ("lat_bucket", {**labels, "le": "1.0"}, 3.0),
        ("lat_bucket", {**labels, "le": "10.0"}, 4.0),
        ("lat_bucket", {**labels, "le": "+Inf"}, 5.0),
        ("lat_count", labels, 5.0),
        ("lat_sum", labels, 55.65),
    ]


def test_metrics_without_labels_have_their_series_from_the_start() -> None:
    r = Registry()
    Counter("c", "c", registry=r).inc(0)
    g = Gauge("g", "g", registry=r)
    Histogram("h", "h", registry=r, buckets=(1,)).observe(3)
    g.set(2)
    g.inc(3)
    g.dec()
    assert sample_value(r, "c_total") == 0
    assert sample_value(r, "g") == 4
    assert sample_value(r, "h_bucket", {"le": "1.0"}) == 0
    assert sample_value(r, "h_bucket", {"le": "+Inf"}) == 1
    # A labelled family declares itself without series until one is made.
    Gauge("later", "later", ["x"], registry=r)
    assert parsed(r)["later"] == ("gauge", "later", [])


def test_labels_must_match_the_declared_names() -> None:
    r = Registry()
    c = Counter("c", "c", ["a", "b"], registry=r)
    for bad in (lambda: c.labels("1"), lambda: c.labels(a="1"), lambda: c.labels(a="1", z="2")):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ValueError):
        c.inc()  # labelled: only through .labels(...)
    assert c.labels("1", "2") is c.labels(a="1", b="2")


def test_one_name_twice_in_a_registry_is_refused() -> None:
    r = Registry()
    Gauge("g", "g", registry=r)
    with pytest.raises(ValueError):
        Counter("g", "g", registry=r)
    Gauge("g", "g", registry=Registry())  # another instance's registry is its own


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
        (1, "1.0"),
        (0.25, "0.25"),
        (123456789012, "1.23456789012e+11"),
        (-3.5, "-3.5"),
    ],
)
def test_values_are_written_as_prometheus_reads_them(value: float, text: str) -> None:
    assert format_value(value) == text
    r = Registry()
    Gauge("g", "g", registry=r).set(value)
    assert f"\ng {text}\n" in r.exposition().decode()
    read = sample_value(r, "g")
    assert read is not None and (read == value or (math.isnan(value) and math.isnan(read)))


def test_a_collected_counter_family_keeps_its_total_once() -> None:
    assert counter_family("x", "x").name == "x_total"
    assert counter_family("x_total", "x").name == "x_total"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_process_metrics_are_read_from_proc() -> None:
    r = Registry()
    r.register(ProcessCollector())
    families = parsed(r)
    assert set(families) == {
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_cpu_seconds",
        "process_open_fds",
        "process_max_fds",
    }
    assert families["process_cpu_seconds"][0] == "counter"
    rss = families["process_resident_memory_bytes"][2][0][2]
    status = Path("/proc/self/status").read_text()
    vm_rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
    assert abs(rss - vm_rss * 1024) < 16 * 2**20
    assert families["process_open_fds"][2][0][2] > 0
    assert families["process_max_fds"][2][0][2] > 0
    assert families["process_start_time_seconds"][2][0][2] > 1e9


def test_the_process_metrics_of_a_command_with_parentheses(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    pid = tmp_path / "42"
    (pid / "fd").mkdir(parents=True)
    for fd in ("0", "1", "2"):
        (pid / "fd" / fd).touch()
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12] = "250", "150"  # utime, stime: 4 s at 100 ticks
    fields[19], fields[20], fields[21] = "1000", "8192", "3"
    (pid / "stat").write_text("42 (a (b) c) " + " ".join(fields) + "\n")
    (pid / "limits").write_text(
        "Limit  Soft Limit  Hard Limit  Units\nMax open files  1024  4096  files\n"
    )
    r = Registry()
    r.register(ProcessCollector(proc=str(tmp_path), pid="42"))
    ticks = os.sysconf("SC_CLK_TCK")
    assert sample_value(r, "process_cpu_seconds_total") == 400 / ticks
    assert sample_value(r, "process_virtual_memory_bytes") == 8192
    assert sample_value(r, "process_resident_memory_bytes") == 3 * os.sysconf("SC_PAGE_SIZE")
    assert sample_value(r, "process_start_time_seconds") == 1700000000 + 1000 / ticks
    assert sample_value(r, "process_open_fds") == 3
    assert sample_value(r, "process_max_fds") == 1024
