"""How numbers read on the pages: the template filters (Go nsqadmin's handlebars helpers)."""

import time


def commafy(value: int | float | None) -> str:
    """1234567 -> "1,234,567" (Go's `commafy`)."""
    if value is None:
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def nanotohuman(nanoseconds: float | int | None) -> str:
    """A duration in nanoseconds as Go nsqadmin shows it: 1h2m3s, 1m5s, 250ms, 12us, 800ns."""
    if nanoseconds is None:
        return ""
    n = int(nanoseconds)
    if n < 0:
        return "-" + nanotohuman(-n)
    text = ""
    hours, n = divmod(n, 3_600_000_000_000)
    if hours:
        text += f"{hours}h"
    minutes, n = divmod(n, 60_000_000_000)
    if minutes:
        text += f"{minutes}m"
    if text:
        return f"{text}{n // 1_000_000_000}s"
    for unit, size in (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if n >= size:
            return f"{n / size:.3g}{unit}" if n < 10 * size else f"{n // size}{unit}"
    return f"{n}ns"


def percentile_label(quantile: float) -> str:
    """0.99 -> "99th", 0.5 -> "50th", 0.999 -> "99.9th"."""
    percent = f"{quantile * 100:.4f}".rstrip("0").rstrip(".")
    last = percent[-1]
    teen = len(percent) >= 2 and percent[-2] == "1" and "." not in percent[-2:]
    suffix = "th"
    if not teen and last in "123":
        suffix = {"1": "st", "2": "nd", "3": "rd"}[last]
    return f"{percent}{suffix}"


def rate(value: float | None) -> str:
    """Messages per second, or a dash until two polls have been made."""
    if value is None:
        return "–"
    if value >= 100:
        return f"{value:,.0f}/s"
    return f"{value:,.1f}/s"


def timestamp(unix_seconds: int | float | None) -> str:
    """A unix time as local `YYYY-MM-DD HH:MM:SS`."""
    if not unix_seconds:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_seconds))


FILTERS = {
    "commafy": commafy,
    "nanotohuman": nanotohuman,
    "percentile_label": percentile_label,
    "rate": rate,
    "timestamp": timestamp,
}
