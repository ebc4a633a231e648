"""Live charts without graphite: nsqadmin polls every nsqd's /stats, keeps the last minutes of
each topic's and channel's totals, and draws message rate and depth as inline SVG.

Go nsqadmin draws its charts from graphite, fed by nsqd's statsd push; nsqpy needs neither.
`History` is pure (the poller in server.py feeds it); `render_chart` returns an SVG string.
"""

import math
from collections import deque
from dataclasses import dataclass
from html import escape

from nsqpy.nsqadmin.stats import TopicStats

POLL_INTERVAL = 2.0  # seconds between two polls of the cluster's /stats
WINDOW = 600.0  # seconds of history kept and drawn
RATE_SPAN = 10.0  # the rate shown in tables: messages per second over about this long


@dataclass(frozen=True)
class Sample:
    at: float  # time.time()
    message_count: int
    depth: int  # for a topic: its own queue and all its channels' (what waits anywhere)
    in_flight: int


class History:
    """The recent totals of every topic (key `(topic, "")`) and channel (`(topic, channel)`)."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._series: dict[tuple[str, str], deque[Sample]] = {}

    def record(self, at: float, topics: dict[str, TopicStats]) -> None:
        """One poll: the cluster-wide stats of every topic (stats.aggregate_topics)."""
        for name, topic in topics.items():
            backlog = topic.depth + topic.channel_depth
            self._append(
                (name, ""), Sample(at, topic.message_count, backlog, topic.in_flight_count)
            )
            for channel in topic.channels or []:
                self._append(
                    (name, channel.channel_name),
                    Sample(at, channel.message_count, channel.depth, channel.in_flight_count),
                )
        horizon = at - self.window
        for key in list(self._series):
            series = self._series[key]
            while series and series[0].at < horizon:
                series.popleft()
            if not series:
                del self._series[key]

    def _append(self, key: tuple[str, str], sample: Sample) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = deque()
        series.append(sample)

    def samples(self, topic: str, channel: str = "") -> list[Sample]:
        return list(self._series.get((topic, channel), ()))

    def rate(self, topic: str, channel: str = "", span: float = RATE_SPAN) -> float | None:
        """Messages per second over the last `span` seconds (or what history there is);
        None until two polls have seen the topic."""
        series = self._series.get((topic, channel))
        if not series or len(series) < 2:
            return None
        return _rate_at(series, len(series) - 1, span)

    def rate_points(
        self, topic: str, channel: str = "", span: float = RATE_SPAN
    ) -> list[tuple[float, float]]:
        """(time, messages/s over the `span` before it) at each poll but the first."""
        series = self._series.get((topic, channel)) or deque()
        return [(series[i].at, _rate_at(series, i, span)) for i in range(1, len(series))]

    def depth_points(self, topic: str, channel: str = "") -> list[tuple[float, float]]:
        return [(s.at, float(s.depth)) for s in self.samples(topic, channel)]


def _rate_at(series: deque[Sample], index: int, span: float) -> float:
    """The rate at series[index], from the latest sample at least `span` seconds older (or
    the oldest there is)."""
    latest = series[index]
    earlier = series[0]
    for back in range(index - 1, -1, -1):
        if latest.at - series[back].at >= span:
            earlier = series[back]
            break
    return _per_second(earlier, latest)


def _per_second(earlier: Sample, later: Sample) -> float:
    elapsed = later.at - earlier.at
    if elapsed <= 0:
        return 0.0
    # A count that went down means the topic was deleted and created again: no rate then.
    return max(later.message_count - earlier.message_count, 0) / elapsed


# --------------------------------------------------------------------------------------------
# SVG

WIDTH = 360
HEIGHT = 110
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 44, 8, 22, 18


def nice_ceiling(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten, at least `value` (and at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def short_number(value: float) -> str:
    """1234 -> 1.2k, 2500000 -> 2.5M; small values keep one decimal when they need it."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}".removesuffix(".0") + suffix
    if value == int(value):
        return str(int(value))
    return f"{value:.1f}"


def chart_window(points: list[tuple[float, float]], now: float, longest: float = WINDOW) -> float:
    """How far back a chart looks: the history there is, in whole minutes, from 1 to
    `longest`, so that a young nsqadmin does not squeeze its few points into a corner."""
    if not points:
        return 60.0
    minutes = math.ceil(max(now - points[0][0], 1.0) / 60.0)
    return float(min(max(minutes * 60, 60), longest))


def render_chart(
    title: str,
    points: list[tuple[float, float]],
    now: float,
    window: float | None = None,
    unit: str = "",
    css_class: str = "",
) -> str:
    """An SVG line chart of `points` (time, value) over the `window` seconds before `now`
    (by default: chart_window): title and latest value on top, the y axis from 0 to a round
    maximum, minutes below."""
    if window is None:
        window = chart_window(points, now)
    inner_w = WIDTH - _PAD_LEFT - _PAD_RIGHT
    inner_h = HEIGHT - _PAD_TOP - _PAD_BOTTOM
    start = now - window
    visible = [(t, v) for t, v in points if t >= start]
    top = nice_ceiling(max((v for _, v in visible), default=0.0))

    def x(at: float) -> float:
        return _PAD_LEFT + (at - start) / window * inner_w

    def y(value: float) -> float:
        return _PAD_TOP + inner_h - value / top * inner_h

    latest = f"{short_number(visible[-1][1])}{unit}" if visible else "no data yet"
    label = f"{title}: {latest}"
    parts = [
        f'<svg class="chart {escape(css_class)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}">',
        f"<title>{escape(label)}</title>",
        f'<text class="chart-title" x="{_PAD_LEFT}" y="14">{escape(title)}</text>',
        f'<text class="chart-latest" x="{WIDTH - _PAD_RIGHT}" y="14" text-anchor="end">'
        f"{escape(latest)}</text>",
        f'<rect class="chart-frame" x="{_PAD_LEFT}" y="{_PAD_TOP}" width="{inner_w}" '
        f'height="{inner_h}"/>',
    ]
    for fraction in (0.5, 1.0):
        grid_y = y(top * fraction)
        parts.append(
            f'<line class="chart-grid" x1="{_PAD_LEFT}" x2="{WIDTH - _PAD_RIGHT}" '
            f'y1="{grid_y:.1f}" y2="{grid_y:.1f}"/>'
        )
        parts.append(
            f'<text class="chart-axis" x="{_PAD_LEFT - 4}" y="{grid_y + 4:.1f}" '
            f'text-anchor="end">{short_number(top * fraction)}</text>'
        )
    parts.append(
        f'<text class="chart-axis" x="{_PAD_LEFT - 4}" y="{_PAD_TOP + inner_h + 4}" '
        f'text-anchor="end">0</text>'
    )
    minutes = int(window // 60)
    parts.append(f'<text class="chart-axis" x="{_PAD_LEFT}" y="{HEIGHT - 4}">−{minutes} min</text>')
    parts.append(
        f'<text class="chart-axis" x="{WIDTH - _PAD_RIGHT}" y="{HEIGHT - 4}" '
        f'text-anchor="end">now</text>'
    )
    if len(visible) >= 2:
        line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in visible)
        base = _PAD_TOP + inner_h
        area = f"{x(visible[0][0]):.1f},{base} {line} {x(visible[-1][0]):.1f},{base}"
        parts.append(f'<polygon class="chart-area" points="{area}"/>')
        parts.append(f'<polyline class="chart-line" points="{line}"/>')
    elif visible:
        parts.append(
            f'<circle class="chart-dot" cx="{x(visible[0][0]):.1f}" '
            f'cy="{y(visible[0][1]):.1f}" r="2.5"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_sparkline(
    points: list[tuple[float, float]], now: float, window: float | None = None, label: str = ""
) -> str:
    """A small line (for a table cell) of `points` over the `window` before `now`."""
    if window is None:
        window = chart_window(points, now)
    width, height = 120, 24
    start = now - window
    visible = [(t, v) for t, v in points if t >= start]
    top = nice_ceiling(max((v for _, v in visible), default=0.0))
    parts = [
        f'<svg class="sparkline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<line class="sparkline-base" x1="0" x2="{width}" y1="{height - 1}" '
        f'y2="{height - 1}"/>'
    ]
    if len(visible) >= 2:
        line = " ".join(
            f"{(t - start) / window * width:.1f},{height - 1 - v / top * (height - 3):.1f}"
            for t, v in visible
        )
        parts.append(f'<polyline class="sparkline-line" points="{line}"/>')
    parts.append("</svg>")
    return "".join(parts)
