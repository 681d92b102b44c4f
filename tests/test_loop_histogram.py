"""ops.metrics.LoopHistogram (#33): a prometheus_client Histogram observed from the event
loop without its locks. It leans on Histogram's own exposition, so what it exposes must
stay what Histogram exposes for the same observations (a prometheus_client upgrade that
changed those internals fails here, not on a scrape)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kafscale.ops.metrics import LATENCY_BUCKETS, LoopHistogram


def _exposed(cls) -> list[str]:
    registry = CollectorRegistry()
    h = cls("kafscale_test_seconds", "a test histogram", ["op"], buckets=LATENCY_BUCKETS, registry=registry)
    for op, amount in [("put", 0.0004), ("put", 0.0005), ("get", 0.003), ("put", 0.7), ("get", 31.0), ("get", float("nan")), ("put", 0.0)]:
        h.labels(op).observe(amount)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_loop_histogram_exposes_what_histogram_exposes():
    loop, plain = _exposed(LoopHistogram), _exposed(Histogram)
    assert loop == plain
    assert 'kafscale_test_seconds_bucket{le="0.0005",op="put"} 3.0' in loop  # 0.0, 0.0004 and 0.0005 (le is inclusive)
    assert 'kafscale_test_seconds_count{op="get"} 2.0' in loop  # a NaN lands in no bucket
    assert 'kafscale_test_seconds_sum{op="put"} 0.7009' in loop
