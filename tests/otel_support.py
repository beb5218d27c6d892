"""The OpenTelemetry SDK as an application installs it, for the tests of what the package
records: the global providers can be set once per process, so every test module of a
worker shares these.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

FETCH = "gql_service_auth.fetch_token"

_installed: tuple[InMemoryMetricReader, InMemorySpanExporter] | None = None
BREAKING = {"spans": False}  # the Breaking processor raises while this is set


class Breaking(SpanProcessor):
    """A span processor with a bug: its on_start and on_end raise."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if BREAKING["spans"]:
            raise RuntimeError("span processor bug")

    def on_end(self, span: Any) -> None:
        if BREAKING["spans"]:
            raise RuntimeError("span processor bug")


def install_sdk() -> tuple[InMemoryMetricReader, InMemorySpanExporter]:
    """The global providers can be set once per process: this worker's, for all tests."""
    global _installed
    if _installed is None:
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.add_span_processor(Breaking())
        trace.set_tracer_provider(provider)
        _installed = reader, exporter
    return _installed


class Telemetry:
    """What the SDK received during one test."""

    def __init__(self, reader: InMemoryMetricReader, exporter: InMemorySpanExporter) -> None:
        self._reader = reader
        self._exporter = exporter
        self._before = self._points()
        exporter.clear()

    def _points(self) -> Counter[tuple[str, frozenset[tuple[str, Any]]]]:
        points: Counter[tuple[str, frozenset[tuple[str, Any]]]] = Counter()
        data = self._reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                if scope.scope.name != "gql_service_auth":
                    continue
                for metric in scope.metrics:
                    if isinstance(metric.data, Gauge):
                        continue  # a value now, not a count: see gauge()
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:  # a histogram: how many it recorded
                            value = point.count  # type: ignore[union-attr]
                        key = (metric.name, frozenset((point.attributes or {}).items()))
                        points[key] += value
        return points

    def added(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], int]:
        """The metric points this test added to, and by how much."""
        after = self._points()
        after.subtract(self._before)
        return {key: value for key, value in after.items() if value}

    def added_to(self, name: str) -> dict[frozenset[tuple[str, Any]], int]:
        return {attrs: value for (metric, attrs), value in self.added().items() if metric == name}

    def gauge(self, name: str) -> dict[frozenset[tuple[str, Any]], float]:
        """The points of the gauge ``name`` now (a collection reads them afresh)."""
        points: dict[frozenset[tuple[str, Any]], float] = {}
        data = self._reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            key = frozenset((point.attributes or {}).items())
                            points[key] = point.value  # type: ignore[union-attr]
        return points

    def spans(self, name: str = FETCH) -> list[ReadableSpan]:
        return [span for span in self._exporter.get_finished_spans() if span.name == name]

    def everything(self) -> str:
        """Every attribute of every span, span event and metric point, as one text."""
        texts = [repr(sorted(self.added()))]
        for span in self._exporter.get_finished_spans():
            texts.append(repr(dict(span.attributes or {})))
            texts.append(repr(span.status.description))
            texts.extend(repr((e.name, dict(e.attributes or {}))) for e in span.events)
        return "\n".join(texts)


def attrs(**values: Any) -> frozenset[tuple[str, Any]]:
    return frozenset((key.replace("__", "."), value) for key, value in values.items())


def installed() -> Telemetry:
    """What the SDK receives from now on (the ``telemetry`` fixture of each module)."""
    reader, exporter = install_sdk()
    return Telemetry(reader, exporter)
