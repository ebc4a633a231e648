"""End-to-end processing latency: publish to FIN, as percentiles over a sliding window.

Go nsqd keeps these with `--e2e-processing-latency-percentile` and
`--e2e-processing-latency-window-time` in two rotating quantile streams, each covering half the
window. We keep the same two halves, each a bounded uniform sample (reservoir) of the latencies
seen in it, so memory stays fixed however many messages pass; the percentiles are read from
the two samples together, like Go's merged streams. JSON shape: Go's quantile.Result,
`{"count": N, "percentiles": [{"quantile": q, "value": ns}, ...]}` (`null` when none tracked).
"""

import random

# Samples kept per half window: enough for a stable p99 (about 40 samples above it).
RESERVOIR_SIZE = 4096


class _Half:
    __slots__ = ("started", "count", "samples")

    def __init__(self, started: float) -> None:
        self.started = started
        self.count = 0
        self.samples: list[int] = []


class LatencyStream:
    def __init__(self, percentiles: list[float], window: float, rng: random.Random) -> None:
        self.percentiles = sorted(percentiles, reverse=True)
        self.half_window = window / 2
        self._rng = rng
        self._current = _Half(0.0)
        self._previous = _Half(0.0)

    def insert(self, latency_ns: int, now: float) -> None:
        current = self._current
        if now - current.started >= self.half_window:
            self._previous = current if now - current.started < 2 * self.half_window else _Half(now)
            current = self._current = _Half(now)
        current.count += 1
        samples = current.samples
        if len(samples) < RESERVOIR_SIZE:
            samples.append(latency_ns)
        else:
            index = self._rng.randrange(current.count)
            if index < RESERVOIR_SIZE:
                samples[index] = latency_ns

    def halves(self, now: float) -> list[_Half]:
        """The halves still inside the window at `now`."""
        return [
            h for h in (self._previous, self._current) if now - h.started < 2 * self.half_window
        ]

    def result(self, now: float) -> dict:
        return merged_result(self.percentiles, [self], now)


def _go_float(value: float) -> float | int:
    """Go's encoding/json prints an integral float64 without `.0` (`1`, not `1.0`)."""
    return int(value) if float(value).is_integer() and abs(value) < 1e21 else value


def merged_result(percentiles: list[float], streams: list[LatencyStream], now: float) -> dict:
    """Go's quantile.Result for one or more streams (a topic merges its channels')."""
    if not percentiles:
        # Go keeps no stream at all then: quantile.Result{} is a zero count and null.
        return {"count": 0, "percentiles": None}
    count = 0
    weighted: list[tuple[int, float]] = []
    for stream in streams:
        for half in stream.halves(now):
            if half.samples:
                count += half.count
                weight = half.count / len(half.samples)
                weighted.extend((sample, weight) for sample in half.samples)
    if not weighted:
        values = [{"quantile": _go_float(q), "value": 0} for q in sorted(percentiles, reverse=True)]
        return {"count": count, "percentiles": values}
    weighted.sort()
    total = sum(weight for _sample, weight in weighted)
    values = []
    for quantile in sorted(percentiles, reverse=True):
        target = quantile * total
        running = 0.0
        value = weighted[-1][0]
        for sample, weight in weighted:
            running += weight
            if running >= target:
                value = sample
                break
        values.append({"quantile": _go_float(quantile), "value": value})
    return {"count": count, "percentiles": values}
