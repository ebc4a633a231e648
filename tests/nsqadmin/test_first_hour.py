"""What a newcomer meets first in nsqadmin: one clear banner when the cluster cannot be reached
and no false "no topics" claim, paused topics and channels on the Streams page, `/api` status
codes as Go nsqadmin v1.3.0 answers them, and no cluster change from another site's page."""

import re

import pytest

from tests.nsqadmin.support import http, start_nsqadmin

EVIL = {"Origin": "http://evil.example", "Content-Type": "text/plain"}


# -- 11: an unreachable cluster ---------------------------------------------------------------


@pytest.mark.parametrize(
    "flag", ["-lookupd-http-address=127.0.0.1:9", "-nsqd-http-address=127.0.0.1:9"]
)
def test_an_unreachable_cluster_is_one_banner_and_no_false_statement(flag):
    admin = start_nsqadmin(flag)
    url = f"http://127.0.0.1:{admin.port('HTTP')}"
    try:
        paths = ["/", "/nodes", "/topics/x", "/topics/x/y", "/counter"]
        if "lookupd" in flag:
            paths.append("/lookup")  # without nsqlookupd it asks nothing
        for path in paths:
            page = http("GET", url + path).body.decode()
            assert page.count('class="banner banner-error"') == 1, path
            assert "127.0.0.1:9" in page, path
            assert 'class="notice"' not in page.replace(
                "nsqadmin is not configured with --lookupd-http-address", ""
            ), path
        assert "No topics exist" not in http("GET", url + "/").body.decode()
    finally:
        admin.stop()


# -- 12: paused topics and channels on Streams ------------------------------------------------


def test_streams_page_shows_paused_topics_and_channels(cluster, topic_name):
    for nsqd in cluster.nsqds:
        nsqd.create_channel(topic_name, "running")
        nsqd.create_channel(topic_name, "held")
    cluster.wait_registered(topic_name)
    base = f"{cluster.url}/api/topics/{topic_name}"
    assert http("POST", f"{base}/held", {"action": "pause"}).status == 200
    row = _streams_row(cluster, topic_name)
    assert 'data-paused-channel="held"' in row
    assert 'data-paused-channel="running"' not in row
    assert 'class="badge badge-paused">paused<' not in row

    assert http("POST", base, {"action": "pause"}).status == 200
    row = _streams_row(cluster, topic_name)
    assert 'class="badge badge-paused">paused<' in row
    assert 'data-paused-channel="held"' in row


def _streams_row(cluster, topic_name: str) -> str:
    page = http("GET", cluster.url + "/").body.decode()
    match = re.search(rf'<tr data-topic="{re.escape(topic_name)}">(.*?)</tr>', page, re.S)
    assert match, page
    return match.group(1)


# -- 13: /api status codes as Go's -------------------------------------------------------------


def test_unknown_topic_and_channel_are_502_like_go(cluster):
    for path in ("/api/topics/never-seen", "/api/topics/never-seen/ch"):
        reply = http("GET", cluster.url + path)
        assert reply.status == 502, path
        message = reply.json()["message"]
        assert message.startswith("UPSTREAM_ERROR: failed to query any nsqlookupd: "), message
        assert 'got response 404 Not Found "{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"' in message


def test_topic_lookupd_knows_without_producers_is_502_like_go(cluster, topic_name):
    lookupd = cluster.lookupd_url
    assert http("POST", f"{lookupd}/topic/create?topic={topic_name}").status == 200
    for path in (f"/api/topics/{topic_name}", f"/api/topics/{topic_name}/ch"):
        reply = http("GET", cluster.url + path)
        assert (reply.status, reply.json()) == (
            502,
            {"message": "UPSTREAM_ERROR: failed to query any nsqd: "},
        ), path


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("", 400, "INVALID_ARG_METRIC"),
        ("?metric=x", 400, "INVALID_ARG_METRIC"),
        ("?metric=rate", 400, "INVALID_ARG_TARGET"),
        # No --graphite-url: Go's request to graphite fails.
        ("?metric=rate&target=x", 500, "INTERNAL_ERROR"),
    ],
)
def test_graphite_arguments_are_checked_like_go(cluster, query, status, message):
    reply = http("GET", f"{cluster.url}/api/graphite{query}")
    assert (reply.status, reply.json()) == (status, {"message": message})


# -- 14: no cluster change from another site ----------------------------------------------------


def test_api_actions_from_another_site_are_refused(cluster, topic_name):
    for nsqd in cluster.nsqds:
        nsqd.create_channel(topic_name, "ch")
    base = f"{cluster.url}/api/topics/{topic_name}"
    attempts = [
        ("POST", base, b'{"action":"pause"}'),
        ("POST", f"{base}/ch", b'{"action":"pause"}'),
        (
            "POST",
            f"{cluster.url}/api/topics",
            b'{"topic":"%s","channel":"x"}' % topic_name.encode(),
        ),
        ("DELETE", f"{base}/ch", None),
        ("DELETE", base, None),
        ("DELETE", f"{cluster.url}/api/nodes/{cluster.nsqds[0].http_address}", b"{}"),
        ("PUT", f"{cluster.url}/config/log_level", b"debug"),
    ]
    for method, url, body in attempts:
        reply = http(method, url, body, headers=EVIL)
        assert (reply.status, reply.json()) == (403, {"message": "FORBIDDEN_ORIGIN"}), url
    for nsqd in cluster.nsqds:
        topic = nsqd.topic(topic_name)
        assert topic is not None and topic["paused"] is False
        assert [c["channel_name"] for c in topic["channels"]] == ["ch"]
        assert nsqd.channel(topic_name, "ch")["paused"] is False


def test_api_actions_without_origin_or_from_nsqadmin_itself_still_work(cluster, topic_name):
    for nsqd in cluster.nsqds:
        nsqd.create_channel(topic_name, "ch")
    base = f"{cluster.url}/api/topics/{topic_name}"
    assert http("POST", base, {"action": "pause"}).status == 200  # curl, scripts: no Origin
    own = {"Origin": cluster.url, "Content-Type": "application/json"}
    assert http("POST", base, b'{"action":"unpause"}', headers=own).status == 200
    assert all(nsqd.topic(topic_name)["paused"] is False for nsqd in cluster.nsqds)
