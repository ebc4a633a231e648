"""nsqadmin's JSON API and command line against a live cluster of our own daemons: one
nsqlookupd and two nsqd (tests/nsqadmin/conftest.py), plus nsqadmin processes started with the
flags each test is about. Every figure nsqadmin reports is checked against the nsqd's own
/stats, and every action against what the nsqd and nsqlookupd hold afterwards."""

import subprocess
from urllib.parse import quote

import pytest

from tests.harness import BIN
from tests.nsqadmin.support import (
    REFERENCE_DIR,
    USER_AGENT,
    Recorder,
    get_json,
    http,
    reference,
    start_nsqadmin,
    subscribe,
)
from tests.support.polling import poll

# -- the command line ------------------------------------------------------------------------


def test_help_prints_go_nsqadmins_flags():
    result = subprocess.run(
        [str(BIN / "nsqadmin"), "--help"], capture_output=True, text=True, timeout=30
    )
    expected = (REFERENCE_DIR / "nsqadmin_help.txt").read_text().split("# exit status")[0]
    assert result.returncode == 0
    assert result.stderr == expected


def test_version_line():
    result = subprocess.run(
        [str(BIN / "nsqadmin"), "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout.startswith("nsqadmin v1.3.0 (built w/nsqpy-")
    assert "python3." in result.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "--nsqd-http-address or --lookupd-http-address required"),
        (
            ["-nsqd-http-address=127.0.0.1:1", "-lookupd-http-address=127.0.0.1:2"],
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            ["-nsqd-http-address=127.0.0.1:1", "-http-client-tls-cert=x.pem"],
            "--http-client-tls-key must be specified with --http-client-tls-cert",
        ),
        (
            ["-nsqd-http-address=127.0.0.1:1", "-allow-config-from-cidr=nonsense"],
            "failed to parse --allow-config-from-cidr (nonsense)",
        ),
    ],
)
def test_bad_options_are_refused_like_go(flags, message):
    result = subprocess.run(
        [str(BIN / "nsqadmin"), *flags], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    assert f"FATAL: failed to instantiate nsqadmin - {message}" in result.stderr


def test_config_file_and_graphite_flag(tmp_path, cluster):
    config = tmp_path / "nsqadmin.toml"
    config.write_text(
        f'nsqlookupd_http_addresses = ["{cluster.lookupd_http_address}"]\n'
        'admin_users = ["alice", "bob"]\n'
        'acl_http_header = "X-Remote-User"\n'
    )
    admin = start_nsqadmin(f"-config={config}", "-graphite-url=http://127.0.0.1:1")
    try:
        url = f"http://127.0.0.1:{admin.port('HTTP')}"
        assert get_json(f"{url}/config/nsqlookupd_http_addresses") == [cluster.lookupd_http_address]
        assert get_json(f"{url}/config/admin_users") == ["alice", "bob"]
        assert get_json(f"{url}/config/acl_http_header") == "X-Remote-User"
        assert get_json(f"{url}/config/http_client_request_timeout") == 5_000_000_000
        assert any("graphite" in line and "ignored" in line for line in admin.lines)
        assert len(get_json(f"{url}/api/nodes")["nodes"]) == 2
    finally:
        admin.stop()


# -- plain endpoints -------------------------------------------------------------------------


def test_ping_static_and_not_found(cluster):
    ping = http("GET", f"{cluster.url}/ping")
    go_ping = reference("nsqadmin_ping.http")
    assert (ping.status, ping.body) == (go_ping.status, go_ping.body)
    assert ping.headers["content-type"] == go_ping.headers["content-type"]

    css = http("GET", f"{cluster.url}/static/nsqadmin.css")
    assert css.status == 200 and css.headers["content-type"].startswith("text/css")
    assert b"font" in css.body
    assert http("GET", f"{cluster.url}/static/nsqadmin.js").status == 200

    for url in (f"{cluster.url}/static/nope.css", f"{cluster.url}/nope"):
        missing = http("GET", url)
        assert (missing.status, missing.json()) == (404, {"message": "NOT_FOUND"})
    wrong_method = http("PUT", f"{cluster.url}/api/nodes")
    assert (wrong_method.status, wrong_method.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})


# -- what nsqadmin reports -------------------------------------------------------------------


def _publish_on_both(cluster, topic, counts=(3, 5), channel="ch"):
    for nsqd, count in zip(cluster.nsqds, counts, strict=True):
        nsqd.create_channel(topic, channel)
        nsqd.publish(topic, count)
    cluster.wait_registered(topic)
    cluster.wait_in_channels(topic)


def test_topic_adds_up_every_nsqd(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    reply = http("GET", f"{cluster.url}/api/topics/{topic_name}")
    assert reply.headers["content-type"] == "application/json; charset=utf-8"
    assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
    body = reply.json()
    per_node = {n.http_address: n.topic(topic_name) for n in cluster.nsqds}
    assert body["node"] == "*" and body["message"] == ""
    assert body["message_count"] == sum(t["message_count"] for t in per_node.values()) == 8
    assert body["depth"] == sum(t["depth"] for t in per_node.values())
    assert {n["node"]: n["message_count"] for n in body["nodes"]} == {
        address: topic["message_count"] for address, topic in per_node.items()
    }
    [channel] = body["channels"]
    assert channel["node"] == "*"
    assert channel["depth"] == 8 == sum(t["channels"][0]["depth"] for t in per_node.values())
    assert [list(body)[:3], list(body)[-2:]] == [
        ["node", "hostname", "topic_name"],
        ["e2e_processing_latency", "message"],
    ]
    assert topic_name in get_json(f"{cluster.url}/api/topics")["topics"]


def test_channel_lists_every_client(cluster, topic_name):
    _publish_on_both(cluster, topic_name, counts=(4, 0))
    consumer = subscribe(cluster.nsqds[0], topic_name, "ch", ready=2)
    try:
        poll(
            lambda: cluster.nsqds[0].channel(topic_name, "ch")["in_flight_count"] == 2,
            "two messages in flight",
        )
        body = get_json(f"{cluster.url}/api/topics/{topic_name}/ch")
        assert (body["node"], body["in_flight_count"], body["depth"]) == ("*", 2, 2)
        assert len(body["nodes"]) == 2
        [client] = body["clients"]
        nsqd_client = cluster.nsqds[0].channel(topic_name, "ch")["clients"][0]
        assert client["node"] == cluster.nsqds[0].http_address
        assert client["user_agent"] == USER_AGENT
        assert client["remote_address"] == nsqd_client["remote_address"]
        assert (client["ready_count"], client["in_flight_count"]) == (2, 2)
        assert client["connected"] >= 0
        unknown = get_json(f"{cluster.url}/api/topics/{topic_name}/nope")
        assert unknown == {"message": ""}  # Go writes only `message` for a missing channel
    finally:
        consumer.close()


def test_nodes_node_and_counter(cluster, topic_name):
    _publish_on_both(cluster, topic_name, counts=(2, 6))
    nodes = get_json(f"{cluster.url}/api/nodes")
    addresses = sorted(f"{n['broadcast_address']}:{n['http_port']}" for n in nodes["nodes"])
    assert addresses == sorted(n.http_address for n in cluster.nsqds)
    for node in nodes["nodes"]:
        assert node["remote_addresses"][0].startswith(cluster.lookupd_http_address + "/")
        assert {"topic": topic_name, "tombstoned": False} in node["topics"]

    nsqd = cluster.nsqds[1]
    detail = get_json(f"{cluster.url}/api/nodes/{nsqd.http_address}")
    stats = nsqd.stats()
    assert detail["node"] == nsqd.http_address
    assert detail["total_messages"] == sum(t["message_count"] for t in stats["topics"])
    assert {t["topic_name"] for t in detail["topics"]} == {t["topic_name"] for t in stats["topics"]}
    missing = http("GET", f"{cluster.url}/api/nodes/127.0.0.1:1")
    assert (missing.status, missing.json()) == (404, {"message": "NODE_NOT_FOUND"})
    page = http("GET", f"{cluster.url}/nodes/127.0.0.1:1")
    assert page.status == 404 and b"No nsqd with the HTTP address 127.0.0.1:1" in page.body

    counter = get_json(f"{cluster.url}/api/counter")["stats"]
    for nsqd in cluster.nsqds:
        key = f"{topic_name}:ch:{nsqd.http_address}"
        assert counter[key] == {
            "node": nsqd.http_address,
            "topic_name": topic_name,
            "channel_name": "ch",
            "message_count": nsqd.channel(topic_name, "ch")["message_count"],
        }
    assert list(counter) == sorted(counter)


# -- actions ----------------------------------------------------------------------------------


def _every_nsqd(cluster, predicate):
    return all(predicate(nsqd) for nsqd in cluster.nsqds)


def test_pause_unpause_and_empty_through_the_api(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    base = f"{cluster.url}/api/topics/{topic_name}"
    for action, paused in (("pause", True), ("unpause", False)):
        reply = http("POST", base, {"action": action})
        assert (reply.status, reply.json()) == (200, {"message": ""})
        assert all(n.topic(topic_name)["paused"] is paused for n in cluster.nsqds)
        reply = http("POST", f"{base}/ch", {"action": action})
        assert reply.status == 200
        assert all(n.channel(topic_name, "ch")["paused"] is paused for n in cluster.nsqds)

    assert http("POST", f"{base}/ch", {"action": "empty"}).status == 200
    assert _every_nsqd(cluster, lambda n: n.channel(topic_name, "ch")["depth"] == 0)
    for nsqd in cluster.nsqds:
        nsqd.publish(topic_name, 2)
    # Messages published with the channel there go to the channel, not the topic: pause the
    # topic first so that they stay at the topic, then empty it.
    http("POST", base, {"action": "pause"})
    for nsqd in cluster.nsqds:
        nsqd.publish(topic_name, 3)
    assert _every_nsqd(cluster, lambda n: n.topic(topic_name)["depth"] == 3)
    assert http("POST", base, {"action": "empty"}).status == 200
    assert _every_nsqd(cluster, lambda n: n.topic(topic_name)["depth"] == 0)

    bad = http("POST", base, {"action": "explode"})
    assert (bad.status, bad.json()) == (400, {"message": "INVALID_ACTION"})
    assert http("POST", base, b"not json").status == 400


def test_delete_channel_then_topic(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    base = f"{cluster.url}/api/topics/{topic_name}"
    assert http("DELETE", f"{base}/ch").json() == {"message": ""}
    assert _every_nsqd(cluster, lambda n: n.channel(topic_name, "ch") is None)
    lookupd_channels = get_json(f"{cluster.lookupd_url}/channels?topic={topic_name}")
    assert "ch" not in lookupd_channels["channels"]

    assert http("DELETE", base).json() == {"message": ""}
    assert _every_nsqd(cluster, lambda n: n.topic(topic_name) is None)
    assert topic_name not in get_json(f"{cluster.lookupd_url}/topics")["topics"]


def test_create_topic_and_channel(cluster, topic_name):
    # A topic only nsqlookupd knows (no nsqd has it): listed as inactive.
    reply = http("POST", f"{cluster.url}/api/topics", {"topic": topic_name})
    assert reply.json() == {"message": ""}
    assert topic_name in get_json(f"{cluster.lookupd_url}/topics")["topics"]
    inactive = get_json(f"{cluster.url}/api/topics?inactive=true")["topics"]
    assert inactive[topic_name] == []

    # Once nsqd have it, creating a channel creates it on each of them.
    for nsqd in cluster.nsqds:
        nsqd.publish(topic_name, 1)
    cluster.wait_registered(topic_name)
    reply = http("POST", f"{cluster.url}/api/topics", {"topic": topic_name, "channel": "made"})
    assert reply.json() == {"message": ""}
    assert _every_nsqd(cluster, lambda n: n.channel(topic_name, "made") is not None)
    assert "made" in get_json(f"{cluster.lookupd_url}/channels?topic={topic_name}")["channels"]

    for body, message in (
        ({"topic": "bad topic!"}, "INVALID_TOPIC"),
        ({"topic": topic_name, "channel": "bad channel!"}, "INVALID_CHANNEL"),
    ):
        reply = http("POST", f"{cluster.url}/api/topics", body)
        assert (reply.status, reply.json()) == (400, {"message": message})


def test_tombstone_a_topic_on_one_nsqd(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    node = cluster.nsqds[0].http_address
    reply = http("DELETE", f"{cluster.url}/api/nodes/{node}", {"topic": topic_name})
    assert reply.json() == {"message": ""}
    assert cluster.nsqds[0].topic(topic_name) is None
    assert cluster.nsqds[1].topic(topic_name) is not None

    def lookup_lists_only_the_other_nsqd() -> bool:
        producers = get_json(f"{cluster.lookupd_url}/lookup?topic={topic_name}")["producers"]
        return [p["http_port"] for p in producers] == [cluster.nsqds[1].process.port("HTTP")]

    # Tombstoned (and then unregistered by the nsqd): consumers no longer find it there.
    poll(lookup_lists_only_the_other_nsqd, "nsqlookupd forgot the tombstoned nsqd")
    bad = http("DELETE", f"{cluster.url}/api/nodes/{node}", b"{}")
    assert (bad.status, bad.json()) == (400, {"message": "INVALID_TOPIC"})


# -- who may act, and who is told -------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(cluster):
    """nsqadmin with --admin-user alice and a notification endpoint."""
    recorder = Recorder()
    admin = start_nsqadmin(
        f"-lookupd-http-address={cluster.lookupd_http_address}",
        "-admin-user=alice",
        "--admin-user",
        "carol",
        f"-notification-http-endpoint={recorder.url}",
    )
    yield f"http://127.0.0.1:{admin.port('HTTP')}", recorder
    admin.stop()
    recorder.close()


def test_only_admin_users_may_act(cluster, guarded, topic_name):
    url, _recorder = guarded
    _publish_on_both(cluster, topic_name)
    endpoint = f"{url}/api/topics/{topic_name}"
    for headers in ({}, {"X-Forwarded-User": "bob"}):
        for method, body in (("POST", {"action": "pause"}), ("DELETE", None)):
            reply = http(method, endpoint, body, headers=headers)
            assert (reply.status, reply.json()) == (403, {"message": "FORBIDDEN"})
        reply = http("POST", f"{url}/api/topics", {"topic": "x"}, headers=headers)
        assert reply.status == 403
        form = http(
            "POST",
            f"{url}/topics/{topic_name}",
            "action=pause",
            headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert form.status == 403 and b"admin" in form.body
    assert _every_nsqd(cluster, lambda n: n.topic(topic_name)["paused"] is False)
    # Reading is for everyone; the page shows no buttons to a non-admin.
    page = http("GET", f"{url}/topics/{topic_name}", headers={"X-Forwarded-User": "bob"})
    assert page.status == 200 and b'data-action="pause"' not in page.body
    page = http("GET", f"{url}/topics/{topic_name}", headers={"X-Forwarded-User": "carol"})
    assert b'data-action="pause"' in page.body

    reply = http("POST", endpoint, {"action": "pause"}, headers={"X-Forwarded-User": "alice"})
    assert reply.status == 200
    assert _every_nsqd(cluster, lambda n: n.topic(topic_name)["paused"] is True)


def test_actions_are_notified_in_gos_shape(cluster, guarded, topic_name):
    url, recorder = guarded
    _publish_on_both(cluster, topic_name)
    admin = {"X-Forwarded-User": "alice", "User-Agent": "notify-test/1"}
    basic = {**admin, "Authorization": "Basic YWxpY2U6c2VjcmV0"}  # alice:secret
    http("POST", f"{url}/api/topics/{topic_name}/ch", {"action": "empty"}, headers=basic)
    http(
        "DELETE",
        f"{url}/api/nodes/{cluster.nsqds[0].http_address}",
        {"topic": topic_name},
        headers=admin,
    )

    def mine() -> list[dict]:
        return [n for n in recorder.received() if n["topic"] == topic_name]

    notifications = poll(lambda: len(mine()) == 2 and mine(), "2 notifications")
    empty, tombstone = sorted(notifications, key=lambda n: n["action"])
    assert list(empty) == [
        "action",
        "topic",
        "channel",
        "timestamp",
        "user",
        "remote_ip",
        "user_agent",
        "url",
        "via",
    ]
    assert empty["action"] == "empty_channel" and empty["channel"] == "ch"
    assert empty["user"] == "alice"
    assert empty["user_agent"] == "notify-test/1"
    assert empty["url"] == f"{url}/api/topics/{topic_name}/ch"
    assert empty["remote_ip"].startswith("127.0.0.1:")
    assert isinstance(empty["timestamp"], int) and empty["via"]
    assert tombstone["action"] == "tombstone_topic_producer"
    assert tombstone["node"] == cluster.nsqds[0].http_address
    assert "channel" not in tombstone and "user" not in tombstone
    assert recorder.headers[0]["content-type"] == "application/json"


# -- when nodes cannot be reached -------------------------------------------------------------


def test_an_unreachable_nsqd_is_a_warning_not_a_failure(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    dead = "127.0.0.1:9"  # discard: nothing listens there
    admin = start_nsqadmin(
        f"-nsqd-http-address={cluster.nsqds[0].http_address}", f"-nsqd-http-address={dead}"
    )
    url = f"http://127.0.0.1:{admin.port('HTTP')}"
    try:
        body = get_json(f"{url}/api/topics/{topic_name}")
        assert body["message"].startswith("WARNING: ")
        assert dead in body["message"]
        assert body["message_count"] == cluster.nsqds[0].topic(topic_name)["message_count"]
        nodes = get_json(f"{url}/api/nodes")["nodes"]
        assert [n["remote_addresses"] for n in nodes] == [None]  # asked directly
        for path in (
            "/",
            f"/topics/{topic_name}",
            f"/topics/{topic_name}/ch",
            "/nodes",
            "/counter",
        ):
            page = http("GET", url + path)
            assert page.status == 200, path
            assert b"banner-warning" in page.body and dead.encode() in page.body, path
        assert f'data-topic="{topic_name}"'.encode() in http("GET", url + "/").body
    finally:
        admin.stop()


def test_an_unreachable_lookupd_is_an_error_banner_and_a_502():
    admin = start_nsqadmin("-lookupd-http-address=127.0.0.1:9")
    url = f"http://127.0.0.1:{admin.port('HTTP')}"
    try:
        for path in ("/api/topics", "/api/nodes", "/api/topics/x", "/api/counter"):
            reply = http("GET", url + path)
            assert reply.status == 502, path
            assert reply.json()["message"].startswith("UPSTREAM_ERROR: failed to query any ")
        for path in (
            "/",
            "/topics/x",
            "/topics/x/y",
            "/nodes",
            "/nodes/1.2.3.4:5",
            "/counter",
            "/lookup",
        ):
            page = http("GET", url + path)
            assert page.status in (200, 404), path
            assert b"banner-error" in page.body and b"127.0.0.1:9" in page.body, path
    finally:
        admin.stop()


# -- /config and --base-path -----------------------------------------------------------------


def test_config_endpoint(cluster):
    url = cluster.url
    assert get_json(f"{url}/config/nsqlookupd_http_addresses") == [cluster.lookupd_http_address]
    assert get_json(f"{url}/config/log_level") == "info"
    reply = http("PUT", f"{url}/config/log_level", b"debug")
    assert reply.json() == "debug"
    assert http("PUT", f"{url}/config/log_level", b"info").json() == "info"
    bad = http("PUT", f"{url}/config/log_level", b"loud")
    assert (bad.status, bad.json()) == (400, {"message": "INVALID_VALUE"})
    bad = http("GET", f"{url}/config/nope")
    assert (bad.status, bad.json()) == (400, {"message": "INVALID_OPTION"})


def test_config_is_refused_outside_the_cidr(cluster):
    admin = start_nsqadmin(
        f"-lookupd-http-address={cluster.lookupd_http_address}",
        "-allow-config-from-cidr=10.0.0.0/8",
    )
    try:
        reply = http("GET", f"http://127.0.0.1:{admin.port('HTTP')}/config/log_level")
        assert (reply.status, reply.json()) == (403, {"message": "FORBIDDEN"})
    finally:
        admin.stop()


def test_base_path(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    admin = start_nsqadmin(
        f"-lookupd-http-address={cluster.lookupd_http_address}", "-base-path=admin/"
    )
    url = f"http://127.0.0.1:{admin.port('HTTP')}"
    try:
        assert http("GET", f"{url}/admin/ping").text == "OK"
        assert http("GET", f"{url}/ping").status == 404
        for path in ("/admin", "/admin/", f"/admin/topics/{quote(topic_name)}"):
            page = http("GET", url + path)
            assert page.status == 200, path
            assert b'href="/admin/static/nsqadmin.css"' in page.body
            assert b'href="/admin/nodes"' in page.body
        assert http("GET", f"{url}/admin/static/nsqadmin.css").status == 200
        assert topic_name in get_json(f"{url}/admin/api/topics")["topics"]
    finally:
        admin.stop()


def test_nsqd_mode_creates_on_every_nsqd(cluster, topic_name):
    admin = start_nsqadmin(*(f"-nsqd-http-address={n.http_address}" for n in cluster.nsqds))
    url = f"http://127.0.0.1:{admin.port('HTTP')}"
    try:
        reply = http("POST", f"{url}/api/topics", {"topic": topic_name, "channel": "c"})
        assert reply.json() == {"message": ""}
        assert _every_nsqd(cluster, lambda n: n.channel(topic_name, "c") is not None)
        assert len(get_json(f"{url}/api/nodes")["nodes"]) == 2
        assert get_json(f"{url}/api/topics/{topic_name}")["message_count"] == 0
        # Go lists only nsqlookupd's inactive topics; without nsqlookupd the map is empty.
        assert get_json(f"{url}/api/topics?inactive=true") == {"topics": {}, "message": ""}
    finally:
        admin.stop()


def test_charts_fill_from_polled_stats(cluster, topic_name):
    _publish_on_both(cluster, topic_name, counts=(10, 10))
    page_url = f"{cluster.url}/topics/{topic_name}"

    def both_charts_drawn() -> bool:
        return http("GET", page_url).body.count(b'class="chart-line"') == 2

    # Two polls of every nsqd (2 s apart) make the first line.
    poll(both_charts_drawn, "rate and depth lines", timeout=15)
    channel_page = http("GET", f"{page_url}/ch").body
    assert channel_page.count(b'<svg class="chart') == 2
    streams = http("GET", cluster.url + "/").body
    assert b'class="sparkline-line"' in streams


# -- the UI's forms, without a browser ---------------------------------------------------------

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_forms_confirm_redirect_and_refuse_other_sites(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    node = cluster.nsqds[0].http_address
    node_page = f"{cluster.url}/nodes/{node}"
    form = f"action=tombstone&topic={topic_name}&next=node&node_page={node}"

    # Without confirm=yes: the question, nothing done.
    asked = http("POST", node_page, form, headers=FORM)
    assert asked.status == 200 and b"Are you sure?" in asked.body
    assert b'name="confirm" value="yes"' in asked.body
    assert cluster.nsqds[0].topic(topic_name) is not None

    # From another site: refused, whatever it says.
    forged = http(
        "POST", node_page, form + "&confirm=yes", headers={**FORM, "Origin": "http://evil.example"}
    )
    assert forged.status == 403 and b"another site" in forged.body
    assert cluster.nsqds[0].topic(topic_name) is not None

    # Confirmed, from our own page: done, then back to the node page with a one-time note.
    own_origin = cluster.url
    done = http("POST", node_page, form + "&confirm=yes", headers={**FORM, "Origin": own_origin})
    assert done.status == 200  # after the 303, followed
    assert f"Tombstoned topic {topic_name} on {node}.".encode() in done.body
    assert cluster.nsqds[0].topic(topic_name) is None

    unknown = http("POST", f"{cluster.url}/topics/{topic_name}", "action=explode", headers=FORM)
    assert unknown.status == 400
    bad_name = http("POST", f"{cluster.url}/lookup", "topic=no+spaces", headers=FORM)
    assert bad_name.status == 400 and b"INVALID_TOPIC" in bad_name.body


# -- log topics ------------------------------------------------------------------------------


def test_a_log_topic_channel_shows_its_lag_and_resets_to_a_time(cluster, topic_name):
    """A log topic's channel (nsqd's docs/design.md §13) shows how many messages it has not
    confirmed, summed over the nsqd, and `reset` makes it deliver again from a point in time
    on every nsqd, through nsqd's /channel/setoffset."""
    for nsqd in cluster.nsqds:
        for path in (
            f"topic/create?topic={topic_name}&partition_num=1",
            f"channel/create?topic={topic_name}&channel=ch&partition=0",
        ):
            assert http("POST", f"{nsqd.url}/{path}").status == 200
        for _ in range(3):
            assert http("POST", f"{nsqd.url}/pub?topic={topic_name}", b"m").status == 200
    cluster.wait_registered(topic_name)
    url = f"{cluster.url}/api/topics/{quote(topic_name)}/ch"
    assert get_json(url)["lag"] == 6
    for nsqd in cluster.nsqds:  # everything consumed: the cursor at the end
        reply = http(
            "POST", f"{nsqd.url}/channel/setoffset?topic={topic_name}&channel=ch", b"special:-1"
        )
        assert reply.status == 200
    assert get_json(url)["lag"] == 0
    page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}/ch").body.decode()
    assert 'id="reset-form"' in page and 'data-field="lag"' in page

    reply = http("POST", url, {"action": "reset", "timestamp": 0})
    assert (reply.status, reply.json()) == (200, {"message": ""})
    assert [n.channel(topic_name, "ch")["lag"] for n in cluster.nsqds] == [3, 3]
    assert get_json(url)["lag"] == 6

    bad = http("POST", url, {"action": "reset", "timestamp": "yesterday"})
    assert (bad.status, bad.json()) == (400, {"message": "INVALID_TIMESTAMP"})


def _delayed_on_every_nsqd(cluster, topic_name: str, count: int) -> None:
    """`count` DPUBs (10 minutes) to channel `ch` of a log topic on each nsqd."""
    for nsqd in cluster.nsqds:
        for path in (
            f"topic/create?topic={topic_name}&partition_num=1",
            f"channel/create?topic={topic_name}&channel=ch&partition=0",
        ):
            assert http("POST", f"{nsqd.url}/{path}").status == 200
        for _ in range(count):
            reply = http("POST", f"{nsqd.url}/pub?topic={topic_name}&defer=600000", b"m")
            assert reply.status == 200
    cluster.wait_registered(topic_name)


def test_a_log_topic_channel_shows_its_delay_queue_and_empties_it(cluster, topic_name):
    """A log topic's channel shows how many of its messages wait in the partitions' delay
    queues (DPUBs here), summed over the nsqd, and `emptydelayed` empties them on every nsqd,
    through nsqd's /channel/emptydelayed."""
    _delayed_on_every_nsqd(cluster, topic_name, 2)
    url = f"{cluster.url}/api/topics/{quote(topic_name)}/ch"
    assert get_json(url)["delayed_queue_count"] == 4
    page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}/ch").body.decode()
    assert 'id="emptydelayed-form"' in page and 'data-field="delayed_queue_count"' in page

    reply = http("POST", url, {"action": "emptydelayed"})
    assert (reply.status, reply.json()) == (200, {"message": ""})
    assert [n.channel(topic_name, "ch")["delayed_queue_count"] for n in cluster.nsqds] == [0, 0]
    assert get_json(url)["delayed_queue_count"] == 0


def test_requeuedelayed_delivers_a_log_topic_channels_delayed_messages_now(cluster, topic_name):
    """`requeuedelayed` makes them due on every nsqd (nsqd's /channel/requeuedelayed): they
    leave the delay queues for the channel's queue."""
    _delayed_on_every_nsqd(cluster, topic_name, 1)
    url = f"{cluster.url}/api/topics/{quote(topic_name)}/ch"
    page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}/ch").body.decode()
    assert 'id="requeuedelayed-form"' in page
    reply = http("POST", url, {"action": "requeuedelayed"})
    assert (reply.status, reply.json()) == (200, {"message": ""})
    for nsqd in cluster.nsqds:
        consumer = subscribe(nsqd, topic_name, "ch", ready=1)
        try:
            (message,) = consumer.read_messages(1)  # not in ten minutes: now
            assert message.body == b"m"
        finally:
            consumer.close()


def test_a_channels_dead_letters_are_shown_and_replayed(cluster, topic_name):
    """A channel with an attempt limit (nsqd's /channel/setmaxattempts) shows how many
    messages went to its dead-letter topic and wait there, links that topic, and
    `replaydeadletters` puts them back (nsqd's /channel/replaydeadletters)."""
    nsqd = cluster.nsqds[0]
    assert http("POST", f"{nsqd.url}/pub?topic={topic_name}", b"poison").status == 200
    limit = f"{nsqd.url}/channel/setmaxattempts?topic={topic_name}&channel=ch&max_attempts=1"
    consumer = subscribe(nsqd, topic_name, "ch", ready=1)
    try:
        assert http("POST", limit).status == 200
        (message,) = consumer.read_messages(1)
        consumer.send(b"REQ " + message.id + b" 0\n")
        url = f"{cluster.url}/api/topics/{quote(topic_name)}/ch"
        stats = poll(
            lambda: (found := get_json(url)).get("dead_letter_count") == 1 and found,
            lambda: f"the dead letter in nsqadmin: {get_json(url)}",
        )
        assert (stats["dead_letter_waiting"], stats["max_attempts"]) == (1, 1), stats
        assert stats["dead_letter_topic"] == f"{topic_name}.ch.dead"
        page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}/ch").body.decode()
        assert 'id="replaydeadletters-form"' in page and 'data-field="dead_letter_count"' in page
        assert f"/topics/{quote(topic_name)}.ch.dead" in page

        http("POST", limit[: -len("1")] + "0")  # no limit: the replayed one goes out
        dead_topic = f"{topic_name}.ch.dead"
        poll(lambda: (nsqd.channel(dead_topic, "replay") or {}).get("depth") == 1, "in replay")
        reply = http("POST", url, {"action": "replaydeadletters"})
        assert (reply.status, reply.json()) == (200, {"message": ""})
        (again,) = consumer.read_messages(1)
        assert (again.body, again.attempts) == (b"poison", 1)
    finally:
        consumer.close()


def test_a_log_topic_shows_each_partitions_log_start_and_end(cluster, topic_name):
    """The topic's nodes, one per partition of each nsqd, carry the partition and its log's
    start and end, in the API and on the topic page."""
    for nsqd in cluster.nsqds:
        create = f"{nsqd.url}/topic/create?topic={topic_name}&partition_num=2"
        assert http("POST", create).status == 200
    first = cluster.nsqds[0]
    for body in (b"a", b"bb", b"ccc"):
        assert http("POST", f"{first.url}/pub?topic={topic_name}", body).status == 200
    cluster.wait_registered(topic_name)
    own = {
        (nsqd.http_address, t["topic_partition"]): t
        for nsqd in cluster.nsqds
        for t in nsqd.stats()["topics"]
        if t["topic_name"] == topic_name
    }
    nodes = get_json(f"{cluster.url}/api/topics/{quote(topic_name)}")["nodes"]
    assert len(nodes) == 4 and {n["partition"] for n in nodes} == {0, 1}
    for node in nodes:
        reported = own[node["node"], node["partition"]]
        for key in ("log_start_offset", "log_start_count", "log_end_offset", "log_end_count"):
            assert node[key] == reported[key], key
    assert sum(n["log_end_count"] for n in nodes) == 3
    page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}").body.decode()
    assert ">Log end</th>" in page and 'data-field="log_end"' in page


def test_a_classic_channel_has_no_lag_or_reset(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    assert "lag" not in get_json(f"{cluster.url}/api/topics/{quote(topic_name)}/ch")
    page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}/ch").body.decode()
    assert 'id="reset-form"' not in page and 'id="emptydelayed-form"' not in page
    assert "delayed_queue_count" not in get_json(f"{cluster.url}/api/topics/{quote(topic_name)}/ch")
    topic_page = http("GET", f"{cluster.url}/topics/{quote(topic_name)}").body.decode()
    assert "Log end" not in topic_page
    assert "partition" not in get_json(f"{cluster.url}/api/topics/{quote(topic_name)}")["nodes"][0]


# -- cluster topics (partition replicas) -----------------------------------------------------


def _replica_fields(node: dict) -> dict:
    return {key: value for key, value in node.items() if key.startswith("cluster_")}


def test_a_replicated_topic_is_one_row_per_partition_the_leaders(replicated):
    """Each partition of a cluster topic is on three nsqd; the API shows it once, as its
    leader reports it, both through nsqlookupd and with every nsqd named
    (--nsqd-http-address), and its totals count each message once."""
    local = replicated.local
    replicated.create_topic("three", 2, 3)
    counts = {0: 3, 1: 2}
    for partition, count in counts.items():
        leader = local.node_leading("three", partition)
        for _ in range(count):
            reply = http(
                "POST",
                f"http://127.0.0.1:{leader.http_port}/pub?topic=three&partition={partition}",
                b"m",
            )
            assert reply.status == 200, reply.body
    by_nsqd = start_nsqadmin(
        *(f"-nsqd-http-address={replicated.nsqd_http_address(n)}" for n in local.nodes)
    )
    try:
        for url in (replicated.url, f"http://127.0.0.1:{by_nsqd.port('HTTP')}"):
            body = get_json(f"{url}/api/topics/three")
            assert sorted(n["partition"] for n in body["nodes"]) == [0, 1], url
            assert body["message_count"] == 5
            assert body["under_replicated_partitions"] == 0
            for node in body["nodes"]:
                info = local.partition("three", node["partition"])
                leader = local.node(info["leader"])
                assert node["node"] == replicated.nsqd_http_address(leader)
                assert node["message_count"] == counts[node["partition"]]
                assert _replica_fields(node) == {
                    "cluster_role": "leader",
                    "cluster_leader": f"127.0.0.1:{leader.tcp_port}",
                    "cluster_isr": info["isr"],
                    "cluster_catchup": [],
                    "cluster_write_epoch": info["write_epoch"],
                    "cluster_writable": True,
                    "cluster_replicas": 3,
                }
                assert node["under_replicated"] is False
    finally:
        by_nsqd.stop()
    # A node's own page keeps its every partition, as leader or follower.
    follower = local.node(local.partition("three", 0)["isr"][1])
    node = get_json(f"{replicated.url}/api/nodes/{replicated.nsqd_http_address(follower)}")
    roles = {t["partition"]: t["cluster_role"] for t in node["topics"]}
    assert roles[0] == "follower"


def test_a_dead_follower_is_flagged_under_replicated(replicated):
    local = replicated.local
    replicated.create_topic("two", 1, 2)
    info = local.partition("two", 0)
    victim = local.node(info["isr"][1])
    url = f"{replicated.url}/api/topics/two"
    assert get_json(url)["under_replicated_partitions"] == 0
    victim.kill()
    body = poll(
        lambda: (body := get_json(url))["under_replicated_partitions"] == 1 and body,
        "nsqadmin reporting two/0 under-replicated",
        timeout=20,
    )
    [node] = body["nodes"]
    assert node["under_replicated"] is True
    assert node["cluster_isr"] == [info["leader"]]
    assert node["cluster_catchup"] == [victim.node_id]
    assert node["cluster_writable"] is False
    page = http("GET", f"{replicated.url}/").body.decode()
    assert 'data-flag="under-replicated"' in page and "1 under-replicated" in page


def test_a_follower_alone_stands_in_for_its_leader(replicated):
    """An nsqadmin that can ask only a follower shows the follower's view, marked so."""
    local = replicated.local
    local.create_topic("two", 1, 2)
    info = local.partition("two", 0)
    follower = local.node(info["isr"][1])
    admin = start_nsqadmin(f"-nsqd-http-address={replicated.nsqd_http_address(follower)}")
    try:
        url = f"http://127.0.0.1:{admin.port('HTTP')}"
        [node] = get_json(f"{url}/api/topics/two")["nodes"]
        assert node["node"] == replicated.nsqd_http_address(follower)
        assert (node["cluster_role"], node["cluster_isr"]) == ("follower", info["isr"])
        page = http("GET", f"{url}/topics/two").body.decode()
        assert 'data-flag="no-leader-view"' in page and "seen by a follower" in page
    finally:
        admin.stop()


def test_a_partition_no_complete_replica_can_lead_says_why(replicated):
    """Its follower dead (out of the ISR), then its leader: no replica that holds every
    acknowledged message is alive, none is elected, and the topic's page says so."""
    local = replicated.local
    replicated.create_topic("two", 1, 2)
    info = local.partition("two", 0)
    leader, follower = local.node(info["leader"]), local.node(info["isr"][1])
    follower.kill()
    poll(lambda: follower.node_id in local.partition("two", 0)["catchup"], "out of the ISR")
    leader.kill()

    def page() -> str | None:
        body = http("GET", f"{replicated.url}/topics/two").body.decode()
        return body if 'data-flag="no-leader"' in body else None

    shown = poll(page, "the topic page saying partition 0 has no leader")
    assert "waiting for one to come back" in shown
    assert local.partition("two", 0)["leader"] == leader.node_id


def test_statistics_rank_topics_and_channels_as_youzans(cluster, topic_name):
    """Youzan's `/api/statistics`: its sorts, then the top ten by one, largest first."""
    filters = get_json(f"{cluster.url}/api/statistics")
    assert filters == {
        "filters": [
            "channel-depth",
            "hourly-pubsize",
            "channel-timeout",
            "channel-requeue",
            "channel-delayedqueue",
        ]
    }
    _publish_on_both(cluster, topic_name, counts=(400, 600))
    ranked = get_json(f"{cluster.url}/api/statistics/channel-depth")
    assert (ranked["rank_name"], ranked["message"]) == ("Top10 topics in Total Channel Depth", "")
    entry = next(item for item in ranked["top10"] if item["name"] == topic_name)
    assert (entry["total_channel_depth"], entry["message_count"]) == (1000, 1000)
    depths = [item.get("total_channel_depth", 0) for item in ranked["top10"]]
    assert depths == sorted(depths, reverse=True)
    hourly = get_json(f"{cluster.url}/api/statistics/hourly-pubsize")
    assert hourly["rank_name"] == "Top10 topics in Hourly Pub Size(in bytes)"
    requeues = get_json(f"{cluster.url}/api/statistics/channel-requeue")
    assert requeues["rank_name"] == "Top10 channels in Requeue"
    assert all(item.get("requeue_count", 0) > 0 for item in requeues["top10"])


def test_coordinators_and_cluster_stats_outside_a_cluster(cluster, topic_name):
    _publish_on_both(cluster, topic_name)
    nsqd = cluster.nsqds[0]
    missing = http("GET", f"{cluster.url}/api/coordinators/127.0.0.1:1/{topic_name}/0")
    assert (missing.status, missing.json()) == (404, {"message": "NODE_NOT_FOUND"})
    reply = get_json(f"{cluster.url}/api/coordinators/{nsqd.http_address}/{topic_name}/0")
    assert "Coordinator is disabled." in reply["message"]
    stats = http("GET", f"{cluster.url}/api/cluster/stats")
    assert (stats.status, stats.json()) == (503, {"message": "Service Unavailable"})


def test_a_channel_client_action_finishes_a_message_by_id(cluster, topic_name):
    """Youzan's `POST /api/topics/<t>/<c>/client` `finish`: one message a consumer holds in
    flight is finished on its nsqd by its decimal ID; Youzan's refusals otherwise."""
    nsqd = cluster.nsqds[0]
    nsqd.create_channel(topic_name, "ch")
    nsqd.publish(topic_name, 1)
    consumer = subscribe(nsqd, topic_name, "ch", ready=1)
    try:
        (message,) = consumer.read_messages(1)
        url = f"{cluster.url}/api/topics/{topic_name}/ch/client"
        action = {"action": "finish", "node": nsqd.http_address, "partition": 0}
        for body, message_text in [
            (
                {**action, "msgid": "x"},
                'INVALID_MSGID: strconv.ParseInt: parsing "x": invalid syntax',
            ),
            ({**action, "msgid": "123456"}, "INVALID_MSGID: Message ID not in flight"),
            ({**action, "node": "", "msgid": "1"}, "INVALID_NSQD_NODE"),
            ({"action": "wipe"}, "INVALID_ACTION"),
        ]:
            refused = http("POST", url, body)
            assert (refused.status, refused.json()) == (400, {"message": message_text})
        done = http("POST", url, {**action, "msgid": str(int(message.id, 16))})
        assert (done.status, done.json()) == (200, {"message": ""})
        poll(lambda: nsqd.channel(topic_name, "ch")["in_flight_count"] == 0, "finished")
    finally:
        consumer.close()


def test_a_log_channels_limits_are_set_on_every_nsqd_through_the_api(cluster, topic_name):
    """`POST /api/topics/<t>/<c>` with `ratelimit` (`ratekilobytes`) or `setclientlimit`
    (`ready`, `client_prefix`): nsqd's `/channel/ratelimit` and `/channel/setclientlimit` on
    every nsqd with the topic; a count that is not a number is 400 `INVALID_OPTION`."""
    cluster.create_log_channel(topic_name, "ch")
    url = f"{cluster.url}/api/topics/{topic_name}/ch"
    done = http("POST", url, {"action": "ratelimit", "ratekilobytes": 300})
    assert (done.status, done.json()) == (200, {"message": ""})
    assert [n.channel(topic_name, "ch")["rate_limit_kb"] for n in cluster.nsqds] == [300, 300]
    consumer = subscribe(cluster.nsqds[1], topic_name, "ch", ready=20)
    try:
        limit = {"action": "setclientlimit", "ready": "2", "client_prefix": ""}
        assert http("POST", url, limit).status == 200
        (client,) = cluster.nsqds[1].channel(topic_name, "ch")["clients"]
        assert client["limited_rdy"] == 2
    finally:
        consumer.close()
    for body in (
        {"action": "ratelimit", "ratekilobytes": "fast"},
        {"action": "setclientlimit", "ready": "", "client_prefix": "10."},
    ):
        refused = http("POST", url, body)
        assert (refused.status, refused.json()) == (400, {"message": "INVALID_OPTION"})
