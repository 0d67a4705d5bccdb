"""The Prometheus metrics of ``GET /metrics``: the service's own histograms and counters, plus
gauges and counters read from the engine (through :class:`Service`) at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from code2wav.server.service import Service


class _Metrics:
    def __init__(self, service: Service):
        self.service = service
        self.registry = CollectorRegistry()
        self.registry.register(self)  # the engine-derived gauges/counters below, read at scrape time
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes etc., for load tests
        self.step_seconds = Histogram(
            "code2wav_step_seconds",
            "Time of one batched forward (GPU time on CUDA, wall time on CPU)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.ttfp_seconds = Histogram(
            "code2wav_ttfp_seconds",
            "Time to first audio packet: first chunk received -> its audio sent",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=self.registry,
        )
        self.errors = Counter("code2wav_errors", "Errors returned to clients, by code", ["code"], registry=self.registry)
        self.connections = Gauge("code2wav_websocket_connections", "Open WebSocket connections", registry=self.registry)
        self.requests = Counter("code2wav_requests", "Requests by endpoint", ["endpoint"], registry=self.registry)
        self.stream_requests = self.requests.labels("stream")  # bound once: a label lookup (a lock, a dict) per connection is not free
        self.http_in_progress = Gauge("code2wav_http_requests_in_progress", "POST /v1/decode requests in progress (body, parse or decode)",
                                      registry=self.registry)
        service.on_step(lambda seconds, rows, frames: self.step_seconds.observe(seconds))

    def collect(self) -> Iterator[Metric]:
        service, stats = self.service, self.service.stats
        yield GaugeMetricFamily("code2wav_active_streams", "Streams open in the engine", value=service.active_streams)
        yield GaugeMetricFamily("code2wav_pool_slots_in_use", "State-pool slots in use", value=service.slots_in_use)
        yield GaugeMetricFamily("code2wav_pool_slots_total", "State-pool slots in all", value=service.max_streams)
        yield GaugeMetricFamily("code2wav_requests_in_flight", "HTTP requests and WebSocket connections being handled (a drain waits for them)",
                                value=service.requests_in_flight)
        yield CounterMetricFamily("code2wav_steps", "Batched forwards (one group of rows each)", value=stats.steps)
        yield CounterMetricFamily("code2wav_step_rows", "Rows over all batched forwards", value=stats.rows)
        yield CounterMetricFamily("code2wav_chunks", "Stream chunks decoded and handed over", value=stats.chunks)
        yield CounterMetricFamily("code2wav_decoded_frames", "Frames decoded", value=stats.frames)
        yield _by_label("code2wav_engine_errors", "Errors raised inside the engine, by code", "code", stats.errors)
        pc = service.prefix_cache_stats()  # EngineConfig.prefix_cache_bytes > 0
        if pc is not None:
            yield CounterMetricFamily("code2wav_prefix_cache_hits", "Streams whose reference prefix state came from the cache", value=pc["hits"])
            yield CounterMetricFamily("code2wav_prefix_cache_misses", "Streams whose reference prefix was prefilled", value=pc["misses"])
            yield CounterMetricFamily("code2wav_prefix_cache_evictions", "Prefix states dropped to stay under the bound", value=pc["evictions"])
            yield GaugeMetricFamily("code2wav_prefix_cache_bytes", "Bytes of prefix states kept", value=pc["bytes"])
            yield _by_label("code2wav_prefix_cache_restores", "Cached states written into their streams' slots, by how: inside the stream's first step "
                            "(a restore pair) or by a launch of their own (restores_in_step off, or a prefix cached after the stream opened)", "how",
                            {"step": pc["restored_in_step"], "alone": pc["restored_alone"]})
        g = service.graph_stats()  # a GraphRunner (CUDA); the eager runner has none
        if g is not None:
            yield CounterMetricFamily("code2wav_graph_replays", "Batched forwards and prefill passes replayed from CUDA graphs", value=g["hits"])
            yield _by_label("code2wav_graph_fallbacks", "Passes run eagerly for want of a captured graph, by reason", "reason", g["fallbacks"])
            yield CounterMetricFamily("code2wav_graph_frames", "Real frames in replayed step graphs", value=g["frames"])
            yield CounterMetricFamily("code2wav_graph_padded_frames", "Rows x frames of replayed step graphs, padding included",
                                      value=g["padded_frames"])
            yield GaugeMetricFamily("code2wav_graph_pool_bytes", "Memory of the CUDA graphs' shared pool, after capture", value=g["pool_bytes"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _by_label(name: str, doc: str, label: str, counts: dict) -> CounterMetricFamily:
    """A counter family with one sample per key of ``counts``."""
    c = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        c.add_metric([str(key)], n)
    return c
