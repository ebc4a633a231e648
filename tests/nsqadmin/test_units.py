"""The small pure parts of nsqadmin: options, chart history and drawing, number formats,
notification fields, the one-time messages, the HTTPS switch."""

import base64
import xml.etree.ElementTree as ElementTree

import pytest

from nsqpy.nsqadmin.charts import (
    History,
    chart_window,
    nice_ceiling,
    render_chart,
    render_sparkline,
)
from nsqpy.nsqadmin.cluster import endpoint, https_endpoint
from nsqpy.nsqadmin.format import commafy, nanotohuman, percentile_label, rate
from nsqpy.nsqadmin.notify import basic_auth_user
from nsqpy.nsqadmin.options import (
    Options,
    OptionsError,
    build_flags,
    normalize_base_path,
    options_from_values,
)
from nsqpy.nsqadmin.pages import Flash, FlashStore, percentile_average
from nsqpy.nsqadmin.stats import ChannelStats, E2eLatency, TopicStats

# -- options ----------------------------------------------------------------------------------


def _options(*argv: str) -> Options:
    values, _explicit, _args = build_flags().parse(list(argv))
    return options_from_values(values)


def test_go_defaults_and_repeatable_flags():
    options = _options(
        "-lookupd-http-address", "127.0.0.1:4161", "--lookupd-http-address=127.0.0.1:4261"
    )
    assert options.lookupd_http_address == ["127.0.0.1:4161", "127.0.0.1:4261"]
    assert options.http_address == "0.0.0.0:4171"
    assert options.http_client_connect_timeout == 2.0
    assert options.http_client_request_timeout == 5.0
    assert options.acl_http_header == "X-Forwarded-User"
    assert options.allow_config_from_cidr == "127.0.0.1/8"
    assert options.statsd_interval == 60.0
    assert options.base_path == "/"


@pytest.mark.parametrize(
    ("given", "normalized"),
    [("", "/"), ("/", "/"), ("admin", "/admin"), ("/admin/", "/admin"), ("//a/./b/../c", "/a/c")],
)
def test_base_path_is_normalized_like_go(given, normalized):
    assert normalize_base_path(given) == normalized


def test_addresses_need_a_port():
    with pytest.raises(OptionsError, match="failed to resolve --nsqd-http-address"):
        _options("-nsqd-http-address=localhost")


def test_admin_users():
    open_to_all = _options("-nsqd-http-address=127.0.0.1:4151")
    assert open_to_all.is_admin(None) and open_to_all.is_admin("anyone")
    guarded = _options("-nsqd-http-address=127.0.0.1:4151", "-admin-user=a", "-admin-user=b")
    assert guarded.is_admin("a") and guarded.is_admin("b")
    assert not guarded.is_admin("c") and not guarded.is_admin(None) and not guarded.is_admin("")


# -- charts -----------------------------------------------------------------------------------


def _topic(messages: int, depth: int, channel_depth: int = 0) -> TopicStats:
    channel = ChannelStats(channel_name="ch", message_count=messages, depth=channel_depth)
    return TopicStats(topic_name="t", message_count=messages, depth=depth, channels=[channel])


def test_history_rates_and_depths():
    history = History(window=60)
    assert history.rate("t") is None
    history.record(1000.0, {"t": _topic(0, 5, 1)})
    assert history.rate("t") is None  # one poll is no rate
    history.record(1002.0, {"t": _topic(20, 5, 3)})
    history.record(1004.0, {"t": _topic(40, 0, 0)})
    assert history.rate("t") == 10.0
    assert history.rate("t", "ch") == 10.0
    assert history.rate_points("t") == [(1002.0, 10.0), (1004.0, 10.0)]
    # A topic's depth is what waits anywhere in it: its queue and its channels'.
    assert history.depth_points("t") == [(1000.0, 6.0), (1002.0, 8.0), (1004.0, 0.0)]
    assert history.depth_points("t", "ch") == [(1000.0, 1.0), (1002.0, 3.0), (1004.0, 0.0)]


def test_history_rate_spans_the_last_seconds_and_forgets_old_polls():
    history = History(window=30)
    for second in range(0, 41, 2):
        history.record(float(second), {"t": _topic(second * second, 0)})
    # Over the last 10 s: (40² - 30²) / 10.
    assert history.rate("t") == (1600 - 900) / 10
    assert history.samples("t")[0].at == 10.0  # older than the window is gone
    history.record(100.0, {})
    assert history.samples("t") == []


def test_a_recreated_topic_has_no_negative_rate():
    history = History()
    history.record(0.0, {"t": _topic(100, 0)})
    history.record(2.0, {"t": _topic(3, 0)})
    assert history.rate("t") == 0.0


def test_chart_is_an_svg_with_a_line_and_labels():
    points = [(100.0 + i, float(i)) for i in range(0, 120, 2)]
    svg = render_chart("Message rate", points, now=220.0, unit="/s", css_class="rate")
    root = ElementTree.fromstring(svg)
    assert root.tag.endswith("svg")
    texts = [element.text for element in root.iter() if element.tag.endswith("text")]
    assert "Message rate" in texts and "118/s" in texts and "now" in texts
    assert "−2 min" in texts
    line = next(e for e in root.iter() if e.tag.endswith("polyline"))
    xs = [float(pair.split(",")[0]) for pair in line.get("points").split()]
    assert xs == sorted(xs)
    empty = ElementTree.fromstring(render_chart("Depth", [], now=0.0))
    assert "no data yet" in [e.text for e in empty.iter()]
    ElementTree.fromstring(render_sparkline(points, now=220.0, label="t <rate>"))


def test_chart_scales():
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 10, 11, 260, 999)] == [
        1,
        1,
        1,
        10,
        10,
        20,
        500,
        1000,
    ]
    assert chart_window([], 0) == 60
    assert chart_window([(0.0, 1.0)], 150.0) == 180
    assert chart_window([(0.0, 1.0)], 5000.0) == 600


# -- formats ----------------------------------------------------------------------------------


def test_formats():
    assert commafy(1234567) == "1,234,567"
    assert commafy(None) == ""
    assert [nanotohuman(n) for n in (800, 12_000, 1_500_000, 2_500_000_000)] == [
        "800ns",
        "12us",
        "1.5ms",
        "2.5s",
    ]
    assert nanotohuman(3_723_000_000_000) == "1h2m3s"
    assert [percentile_label(q) for q in (0.99, 0.5, 0.999, 0.01, 0.02, 0.11)] == [
        "99th",
        "50th",
        "99.9th",
        "1st",
        "2nd",
        "11th",
    ]
    assert rate(None) == "–" and rate(2.345) == "2.3/s" and rate(12345.6) == "12,346/s"


def test_e2e_cells_show_nothing_until_a_message_was_measured():
    measured = E2eLatency.from_nsqd({"count": 3, "percentiles": [{"quantile": 0.99, "value": 5}]})
    assert percentile_average(measured, 0.99) == 5
    assert percentile_average(measured, 0.5) is None
    idle = E2eLatency.from_nsqd({"count": 0, "percentiles": [{"quantile": 0.99, "value": 0}]})
    assert percentile_average(idle, 0.99) is None


# -- notifications, flashes, URLs -------------------------------------------------------------


class _FakeRequest:
    def __init__(self, authorization: str) -> None:
        self.headers = {"Authorization": authorization}


@pytest.mark.parametrize(
    ("header", "user"),
    [
        ("Basic " + base64.b64encode(b"alice:pw").decode(), "alice"),
        ("Basic " + base64.b64encode(b"alice").decode(), ""),
        ("Basic !!!", ""),
        ("Bearer token", ""),
        ("", ""),
    ],
)
def test_basic_auth_user(header, user):
    assert basic_auth_user(_FakeRequest(header)) == user


def test_flash_is_shown_once():
    store = FlashStore()
    key = store.put(Flash("success", "done"))
    assert store.pop(key) == Flash("success", "done")
    assert store.pop(key) is None
    assert store.pop("forged") is None and store.pop(None) is None


def test_urls():
    assert endpoint("127.0.0.1:4161", "lookup", {"topic": "a b#ephemeral"}) == (
        "http://127.0.0.1:4161/lookup?topic=a%20b%23ephemeral"
    )
    assert endpoint("https://h:1", "info") == "https://h:1/info"
    body = b'{"message": "TLS_REQUIRED", "https_port": 4152}'
    assert https_endpoint("http://10.0.0.1:4151/stats?format=json", body) == (
        "https://10.0.0.1:4152/stats?format=json"
    )
    assert https_endpoint("http://10.0.0.1:4151/x", b'{"message":"FORBIDDEN"}') is None
    assert https_endpoint("http://10.0.0.1:4151/x", b"not json") is None
