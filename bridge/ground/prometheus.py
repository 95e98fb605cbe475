"""Prometheus metrics: counters, gauges and histograms on a registry of their own,
written in the text exposition format 0.0.4.

Why not prometheus_client: the bridge uses four of its types and one output
format, and importing it brought 29 modules (an HTTP server, wsgiref, urllib's
request machinery) and over a MiB into every idle process (docs/sizing.md).
Its parser stays the tests' oracle: they read what this writes with it.

Each registry belongs to one instance (no module-wide default), so two bridges
in one process never share a series. An update is an attribute add on a child
resolved once with ``.labels(...)``; the text is built only at a scrape. No
locks: every update and every scrape runs on the event loop's thread.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INF = math.inf


def format_value(value: float) -> str:
    """A sample value (or an ``le`` bound) as Prometheus writes it: Go's float format
    for the special values and for large numbers, Python's repr for the rest."""
    d = float(value)
    if d == _INF:
        return "+Inf"
    if d == -_INF:
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    # Go switches to exponents sooner than Python does (as prometheus_client writes it).
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_pairs(pairs: Iterable[tuple[str, str]]) -> str:
    """``name="value",...`` in the order given, no braces."""
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)


def _braced(inner: str) -> str:
    return "{" + inner + "}" if inner else ""


class Family:
    """One metric family as exposed: its full name (a counter's with ``_total``), type,
    help, and samples as (name suffix, rendered labels with braces, value)."""

    __slots__ = ("help", "name", "samples", "type")

    def __init__(self, name: str, type: str, help: str) -> None:
        self.name = name
        self.type = type
        self.help = help
        self.samples: list[tuple[str, str, float]] = []

    def add(self, value: float, labels: Iterable[tuple[str, str]] = ()) -> Family:
        self.samples.append(("", _braced(label_pairs(sorted(labels))), value))
        return self


def counter_family(name: str, help: str) -> Family:
    """A counter named as Prometheus exposes it: with ``_total`` (added when missing)."""
    return Family(name if name.endswith("_total") else name + "_total", "counter", help)


def gauge_family(name: str, help: str) -> Family:
    return Family(name, "gauge", help)


class Collector(Protocol):
    def collect(self) -> Iterable[Family]: ...


def render(families: Iterable[Family]) -> bytes:
    out: list[str] = []
    append = out.append
    for f in families:
        name = f.name
        append(f"# HELP {name} {escape_help(f.help)}\n# TYPE {name} {f.type}\n")
        for suffix, labels, value in f.samples:
            append(f"{name}{suffix}{labels} {format_value(value)}\n")
    return "".join(out).encode()


class Registry:
    """The collectors of one instance, in the order they were registered."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._names: set[str] = set()

    def register(self, collector: Collector, name: str | None = None) -> None:
        if name is not None:
            # Two families of one name would make a scrape Prometheus rejects whole.
            if name in self._names:
                raise ValueError(f"a metric named {name} is already registered")
            self._names.add(name)
        self._collectors.append(collector)

    def collect(self) -> Iterator[Family]:
        for c in self._collectors:
            yield from c.collect()

    def exposition(self) -> bytes:
        return render(self.collect())


class _Child:
    __slots__ = ("labels",)

    def __init__(self, labels: str) -> None:
        # The label pairs as written, without braces ("" for none).
        self.labels = labels


class CounterChild(_Child):
    __slots__ = ("value",)

    def __init__(self, labels: str) -> None:
        super().__init__(labels)
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class GaugeChild(_Child):
    __slots__ = ("value",)

    def __init__(self, labels: str) -> None:
        super().__init__(labels)
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class HistogramChild(_Child):
    __slots__ = ("after", "before", "bounds", "counts", "sum")

    def __init__(self, labels: str, bounds: tuple[float, ...], before: str, after: str) -> None:
        super().__init__(labels)
        # A bucket's labels: before + 'le="..."' + after.
        self.before, self.after = before, after
        self.bounds = bounds  # ends with +Inf
        # Per bucket, not cumulative: one add per observation; summed at a scrape.
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # The first bound >= value: the bucket "le" that bound.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


C = TypeVar("C", bound=_Child)


class _Metric(Generic[C]):
    type = ""

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        namespace: str = "",
        registry: Registry,
    ) -> None:
        self.name = f"{namespace}_{name}" if namespace else name
        self.help = help
        self.labelnames = tuple(labelnames)
        if "le" in self.labelnames:
            raise ValueError("le is the bucket label")
        self._children: dict[tuple[str, ...], C] = {}
        # A metric without labels has its one series from the start (at 0).
        self._only: C | None = None if self.labelnames else self._child(())
        registry.register(self, self.name)

    def _new(self, pairs: list[tuple[str, str]]) -> C:
        """A child of the label pairs ``pairs``, sorted by name (the order
        prometheus_client wrote, so a diff of two scrapes stays quiet)."""
        raise NotImplementedError

    def _child(self, values: tuple[str, ...]) -> C:
        child = self._new(sorted(zip(self.labelnames, values, strict=True)))
        self._children[values] = child
        return child

    def labels(self, *values: str, **named: str) -> C:
        """The series of these label values (by position or by name), made on first use."""
        if named:
            try:
                if values or len(named) != len(self.labelnames):
                    raise KeyError
                values = tuple([named[n] for n in self.labelnames])
            except KeyError:
                raise ValueError(f"{self.name} takes the labels {self.labelnames}") from None
        child = self._children.get(values)
        if child is not None:
            return child
        if not self.labelnames or len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes the labels {self.labelnames}")
        return self._child(tuple(str(v) for v in values))

    def _unlabelled(self) -> C:
        if self._only is None:
            raise ValueError(f"{self.name} has labels: update it through .labels(...)")
        return self._only

    def collect(self) -> Iterable[Family]:
        raise NotImplementedError


def _one_value_each(family: Family, children: Iterable[CounterChild | GaugeChild]) -> Family:
    """``family`` with one sample per series, a counter's or a gauge's."""
    family.samples = [("", _braced(c.labels), c.value) for c in children]
    return family


class Counter(_Metric[CounterChild]):
    def _new(self, pairs: list[tuple[str, str]]) -> CounterChild:
        return CounterChild(label_pairs(pairs))

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def collect(self) -> Iterable[Family]:
        return (_one_value_each(counter_family(self.name, self.help), self._children.values()),)


class Gauge(_Metric[GaugeChild]):
    def _new(self, pairs: list[tuple[str, str]]) -> GaugeChild:
        return GaugeChild(label_pairs(pairs))

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._unlabelled().dec(amount)

    def collect(self) -> Iterable[Family]:
        return (_one_value_each(gauge_family(self.name, self.help), self._children.values()),)


class Histogram(_Metric[HistogramChild]):
    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        namespace: str = "",
        registry: Registry,
        buckets: Sequence[float],
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != _INF:
            bounds.append(_INF)
        self.bounds = tuple(bounds)
        self._le = [f'le="{format_value(b)}"' for b in self.bounds]
        super().__init__(name, help, labelnames, namespace=namespace, registry=registry)

    def _new(self, pairs: list[tuple[str, str]]) -> HistogramChild:
        # A bucket's labels are the child's with le put in its sorted place (the
        # order prometheus_client wrote): what goes before and after it, kept.
        at = sum(1 for name, _ in pairs if name < "le")
        before, after = label_pairs(pairs[:at]), label_pairs(pairs[at:])
        return HistogramChild(
            label_pairs(pairs),
            self.bounds,
            "{" + (before + "," if before else ""),
            ("," + after if after else "") + "}",
        )

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)

    def collect(self) -> Iterable[Family]:
        family = Family(self.name, "histogram", self.help)
        samples = family.samples
        for c in self._children.values():
            before, after = c.before, c.after
            cumulative = 0
            for le, n in zip(self._le, c.counts, strict=True):
                cumulative += n
                samples.append(("_bucket", before + le + after, cumulative))
            braced = _braced(c.labels)
            samples.append(("_count", braced, cumulative))
            samples.append(("_sum", braced, c.sum))
        return (family,)


class ProcessCollector:
    """The ``process_*`` families, read from /proc at each scrape, as prometheus_client's
    collector of that name wrote them (Linux only: elsewhere it has no samples)."""

    def __init__(self, proc: str = "/proc", pid: str = "self") -> None:
        self._dir = os.path.join(proc, pid)
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._pagesize = os.sysconf("SC_PAGE_SIZE")
        self._btime = 0.0
        try:
            with open(os.path.join(proc, "stat"), "rb") as stat:
                for line in stat:
                    if line.startswith(b"btime "):
                        self._btime = float(line.split()[1])
                        break
        except OSError:
            pass

    def collect(self) -> Iterable[Family]:
        if not self._btime:
            return []
        result: list[Family] = []
        try:
            with open(os.path.join(self._dir, "stat"), "rb") as f:
                # After the command name (which may hold spaces and parentheses).
                parts = f.read().rsplit(b")", 1)[-1].split()
            result += [
                gauge_family("process_virtual_memory_bytes", "Virtual memory size in bytes.").add(
                    float(parts[20])
                ),
                gauge_family("process_resident_memory_bytes", "Resident memory size in bytes.").add(
                    float(parts[21]) * self._pagesize
                ),
                gauge_family(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                ).add(float(parts[19]) / self._ticks + self._btime),
                counter_family(
                    "process_cpu_seconds_total", "Total user and system CPU time spent in seconds."
                ).add((float(parts[11]) + float(parts[12])) / self._ticks),
            ]
        except (OSError, IndexError, ValueError):
            pass
        try:
            max_fds = None
            with open(os.path.join(self._dir, "limits"), "rb") as f:
                for line in f:
                    if line.startswith(b"Max open file"):
                        max_fds = float(line.split()[3])
                        break
            open_fds = len(os.listdir(os.path.join(self._dir, "fd")))
            result.append(
                gauge_family("process_open_fds", "Number of open file descriptors.").add(open_fds)
            )
            if max_fds is not None:
                result.append(
                    gauge_family("process_max_fds", "Maximum number of open file descriptors.").add(
                        max_fds
                    )
                )
        except (OSError, IndexError, ValueError):
            pass
        return result
