"""nsqadmin in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
installed by `make test`) driven by selenium, against the live cluster of conftest.py.

Every page is opened and its numbers compared with what each nsqd's /stats says; every action
is taken by clicking, through the confirmation page where there is one, and checked on the
nsqd and nsqlookupd afterwards. The Topic page's screenshot goes to
tests/nsqadmin/artifacts/topic.png (its path is printed)."""

import pytest
from selenium.common.exceptions import NoSuchElementException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.browser import start_chromium
from tests.nsqadmin.support import ARTIFACTS, USER_AGENT, get_json, http, start_nsqadmin, subscribe
from tests.support.polling import poll


@pytest.fixture(scope="module")
def browser():
    driver = start_chromium("--window-size=1280,1000")
    yield driver
    driver.quit()


# -- reading the page ------------------------------------------------------------------------


def number(text: str) -> int:
    return int(text.replace(",", "").strip())


def field(driver, selector: str, name: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, f'{selector} [data-field="{name}"]').text


def numbers(driver, selector: str, *names: str) -> dict[str, int]:
    return {name: number(field(driver, selector, name)) for name in names}


def click_through(driver, element) -> None:
    """Click a button or link and wait until the next page has loaded. (The old page is
    marked, and the mark gone means a new document: waiting for the button to go stale
    trips over chromedriver while the page is being replaced.)"""
    driver.execute_script("window.oldPage = true;")
    element.click()
    WebDriverWait(driver, 15, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return window.oldPage === undefined && document.readyState === 'complete';"
        )
    )


def click_action(driver, action: str, scope: str = "body") -> None:
    """Click the button of an action and wait for the next page."""
    click_through(
        driver, driver.find_element(By.CSS_SELECTOR, f'{scope} button[data-action="{action}"]')
    )


def confirm(driver) -> None:
    assert driver.find_element(By.TAG_NAME, "h1").text == "Are you sure?"
    click_through(driver, driver.find_element(By.ID, "confirm"))


def fill(driver, selector: str, text: str) -> None:
    """Type `text` into the input `selector` names, in place of what it holds."""
    element = driver.find_element(By.CSS_SELECTOR, selector)
    element.clear()
    element.send_keys(text)


def flash(driver) -> str:
    return driver.find_element(By.ID, "flash").text


# -- a topic on both nsqd, with a consumer ----------------------------------------------------


@pytest.fixture
def busy_topic(cluster, topic_name):
    """Channel `ch` on both nsqd, 3 + 5 messages, a consumer on the first with 2 in flight."""
    for nsqd, count in zip(cluster.nsqds, (3, 5), strict=True):
        nsqd.create_channel(topic_name, "ch")
        nsqd.publish(topic_name, count)
    cluster.wait_registered(topic_name)
    cluster.wait_in_channels(topic_name)
    consumer = subscribe(cluster.nsqds[0], topic_name, "ch", ready=2)
    poll(lambda: cluster.nsqds[0].channel(topic_name, "ch")["in_flight_count"] == 2)
    yield topic_name
    consumer.close()


def test_every_page_shows_what_the_nsqds_report(cluster, browser, busy_topic):
    topic = busy_topic
    first, second = cluster.nsqds
    topics = {n.http_address: n.topic(topic) for n in cluster.nsqds}
    channels = {n.http_address: n.channel(topic, "ch") for n in cluster.nsqds}

    # Streams: one row per topic, the cluster's totals.
    browser.get(cluster.url + "/")
    assert browser.title.startswith("Streams")
    row = f'#topics tr[data-topic="{topic}"]'
    assert numbers(browser, row, "message_count", "depth", "in_flight_count", "channels") == {
        "message_count": sum(t["message_count"] for t in topics.values()),
        "depth": sum(t["depth"] for t in topics.values()),
        "in_flight_count": 2,
        "channels": 1,
    }
    assert numbers(browser, row, "client_count", "nodes") == {"client_count": 1, "nodes": 2}
    assert number(field(browser, row, "channel_depth")) == sum(
        c["depth"] for c in channels.values()
    )

    # The charts need two polls of the cluster (2 s apart); publish between them for a rate.
    def charts_drawn() -> bool:
        first.publish(topic, 3)
        page = http("GET", f"{cluster.url}/topics/{topic}").body
        return page.count(b'class="chart-line"') == 2

    poll(charts_drawn, "the topic's charts", timeout=15, interval=0.2)
    topics = {n.http_address: n.topic(topic) for n in cluster.nsqds}
    channels = {n.http_address: n.channel(topic, "ch") for n in cluster.nsqds}

    # Topic: a row per nsqd, the total, the channel.
    click_through(browser, browser.find_element(By.LINK_TEXT, topic))
    assert browser.title.startswith(topic)
    for address, stats in topics.items():
        row = f'#topic-nodes tr[data-node="{address}"]'
        assert numbers(browser, row, "depth", "message_count") == {
            "depth": stats["depth"],
            "message_count": stats["message_count"],
        }
    assert number(field(browser, '#topic-nodes tr[data-node="*"]', "message_count")) == sum(
        t["message_count"] for t in topics.values()
    )
    row = '#channels tr[data-channel="ch"]'
    assert numbers(browser, row, "depth", "in_flight_count", "message_count", "client_count") == {
        "depth": sum(c["depth"] for c in channels.values()),
        "in_flight_count": 2,
        "message_count": sum(c["message_count"] for c in channels.values()),
        "client_count": 1,
    }
    # e2e percentile columns, as configured on the nsqd.
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#channels th.e2e")]
    assert headers == ["E2E 99TH", "E2E 50TH"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 2
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "topic.png"
    browser.save_screenshot(str(screenshot))
    print(f"\nTopic page screenshot: {screenshot}")

    # Channel: a row per nsqd and the consumer.
    click_through(browser, browser.find_element(By.LINK_TEXT, "ch"))
    assert browser.title.startswith(f"{topic} / ch")
    for address, stats in channels.items():
        row = f'#channel-nodes tr[data-node="{address}"]'
        assert numbers(
            browser,
            row,
            "depth",
            "in_flight_count",
            "deferred_count",
            "requeue_count",
            "timeout_count",
            "message_count",
            "client_count",
        ) == {
            key: stats[key]
            for key in (
                "depth",
                "in_flight_count",
                "deferred_count",
                "requeue_count",
                "timeout_count",
                "message_count",
                "client_count",
            )
        }
    client = channels[first.http_address]["clients"][0]
    row = f'#clients tr[data-client="{client["remote_address"]}"]'
    assert field(browser, row, "remote_address") == client["remote_address"]
    assert field(browser, row, "user_agent") == USER_AGENT
    assert field(browser, row, "attributes") == "plain"
    assert numbers(browser, row, "ready_count", "in_flight_count", "message_count") == {
        "ready_count": 2,
        "in_flight_count": 2,
        "message_count": client["message_count"],
    }
    assert browser.find_element(By.CSS_SELECTOR, row).get_attribute("data-node") == (
        first.http_address
    )
    browser.save_screenshot(str(ARTIFACTS / "channel.png"))

    # Nodes: both nsqd with their versions and topics.
    click_through(browser, browser.find_element(By.LINK_TEXT, "Nodes"))
    assert browser.title.startswith("Nodes")
    for nsqd in cluster.nsqds:
        row = f'#nodes tr[data-node="{nsqd.http_address}"]'
        assert field(browser, row, "version") == nsqd.stats()["version"]
        assert number(field(browser, row, "http_port")) == nsqd.process.port("HTTP")
        badges = browser.find_elements(By.CSS_SELECTOR, f'{row} [data-field="topics"] a')
        assert topic in [badge.text for badge in badges]
    row = f'#nodes tr[data-node="{first.http_address}"]'
    first_stats = first.stats()
    assert number(field(browser, row, "client_count")) == sum(
        c["client_count"] for t in first_stats["topics"] for c in t["channels"]
    )

    # Node: its totals and its topics.
    browser.get(f"{cluster.url}/nodes/{second.http_address}")
    second_stats = second.stats()
    assert number(field(browser, ".summary", "total_messages")) == sum(
        t["message_count"] for t in second_stats["topics"]
    )
    assert number(field(browser, ".summary", "topic_count")) == len(second_stats["topics"])
    row = f'#node-topics tr.channel-row[data-topic="{topic}"][data-channel="ch"]'
    assert number(field(browser, row, "depth")) == channels[second.http_address]["depth"]

    # Counter: every channel's messages, counting live.
    def counted() -> int:
        return sum(
            c["message_count"]
            for n in cluster.nsqds
            for t in n.stats()["topics"]
            for c in t["channels"]
        )

    browser.get(cluster.url + "/counter")
    value = browser.find_element(By.ID, "counter-value")
    assert number(value.text) == counted()
    second.publish(topic, 4)
    expected = counted()
    WebDriverWait(browser, 10).until(lambda _: number(value.text) == expected)

    # Lookup: the create form.
    browser.get(cluster.url + "/lookup")
    assert browser.find_element(By.ID, "create-form").is_displayed()


def test_pause_and_unpause_topic_and_channel(cluster, browser, busy_topic):
    topic = busy_topic
    browser.get(f"{cluster.url}/topics/{topic}")
    click_action(browser, "pause")
    assert flash(browser) == f"Paused topic {topic}."
    assert all(n.topic(topic)["paused"] for n in cluster.nsqds)
    assert browser.find_element(By.CSS_SELECTOR, "h1 .badge-paused").text == "paused"
    click_action(browser, "unpause")
    assert not any(n.topic(topic)["paused"] for n in cluster.nsqds)

    browser.get(f"{cluster.url}/topics/{topic}/ch")
    click_action(browser, "pause")
    assert flash(browser) == f"Paused channel ch of topic {topic}."
    assert all(n.channel(topic, "ch")["paused"] for n in cluster.nsqds)
    # While paused, the Streams page says so for the channel, and for the topic once it is too.
    browser.get(f"{cluster.url}/")
    row = f'#topics tr[data-topic="{topic}"]'
    badge = browser.find_element(By.CSS_SELECTOR, f'{row} [data-paused-channel="ch"]')
    assert badge.is_displayed() and badge.text == "ch: paused"
    assert not browser.find_elements(By.CSS_SELECTOR, f"{row} span.badge-paused")
    browser.get(f"{cluster.url}/topics/{topic}")
    click_action(browser, "pause")
    browser.get(f"{cluster.url}/")
    assert browser.find_element(By.CSS_SELECTOR, f"{row} span.badge-paused").text == "paused"
    browser.save_screenshot(str(ARTIFACTS / "streams-paused.png"))
    browser.get(f"{cluster.url}/topics/{topic}")
    click_action(browser, "unpause")

    browser.get(f"{cluster.url}/topics/{topic}/ch")
    click_action(browser, "unpause")
    assert not any(n.channel(topic, "ch")["paused"] for n in cluster.nsqds)


def test_an_unreachable_cluster_is_one_banner_in_the_browser(browser):
    admin = start_nsqadmin("-lookupd-http-address=127.0.0.1:9")
    try:
        browser.get(f"http://127.0.0.1:{admin.port('HTTP')}/")
        banners = browser.find_elements(By.CSS_SELECTOR, ".banner-error")
        assert len(banners) == 1 and banners[0].is_displayed()
        assert "127.0.0.1:9" in banners[0].text
        assert "No topics exist" not in browser.find_element(By.TAG_NAME, "main").text
        browser.save_screenshot(str(ARTIFACTS / "unreachable-cluster.png"))
    finally:
        admin.stop()


def test_empty_then_delete_channel(cluster, browser, busy_topic):
    topic = busy_topic
    page = f"{cluster.url}/topics/{topic}/ch"
    browser.get(page)
    depth_before = [n.channel(topic, "ch")["depth"] for n in cluster.nsqds]
    assert sum(depth_before) > 0

    # Cancel changes nothing.
    click_action(browser, "empty")
    assert "Empty channel ch" in browser.find_element(By.CSS_SELECTOR, ".question").text
    click_through(browser, browser.find_element(By.ID, "cancel"))
    assert browser.current_url == page
    assert [n.channel(topic, "ch")["depth"] for n in cluster.nsqds] == depth_before

    click_action(browser, "empty")
    confirm(browser)
    assert flash(browser) == f"Emptied channel ch of topic {topic}."
    assert [n.channel(topic, "ch")["depth"] for n in cluster.nsqds] == [0, 0]
    assert number(field(browser, '#channel-nodes tr[data-node="*"]', "depth")) == 0

    click_action(browser, "delete")
    confirm(browser)
    assert browser.current_url.startswith(f"{cluster.url}/topics/{topic}?flash=")
    assert flash(browser) == f"Deleted channel ch of topic {topic}."
    assert all(n.channel(topic, "ch") is None for n in cluster.nsqds)
    assert browser.find_elements(By.CSS_SELECTOR, '#channels tr[data-channel="ch"]') == []


def test_tombstone_then_delete_topic(cluster, browser, busy_topic):
    topic = busy_topic
    first, second = cluster.nsqds
    browser.get(f"{cluster.url}/topics/{topic}")
    click_action(browser, "tombstone", f'#topic-nodes tr[data-node="{first.http_address}"]')
    assert first.http_address in browser.find_element(By.CSS_SELECTOR, ".question").text
    confirm(browser)
    assert flash(browser) == f"Tombstoned topic {topic} on {first.http_address}."
    assert first.topic(topic) is None and second.topic(topic) is not None

    def lookupd_producers() -> list[int]:
        body = get_json(f"{cluster.lookupd_url}/lookup?topic={topic}")
        return [p["http_port"] for p in body["producers"]]

    poll(lambda: lookupd_producers() == [second.process.port("HTTP")])
    browser.get(f"{cluster.url}/topics/{topic}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#topic-nodes tbody tr")
    assert [r.get_attribute("data-node") for r in rows] == [second.http_address]

    click_action(browser, "delete", ".page-head")
    confirm(browser)
    assert browser.current_url.startswith(f"{cluster.url}/?flash=")
    assert flash(browser) == f"Deleted topic {topic}."
    assert all(n.topic(topic) is None for n in cluster.nsqds)
    assert topic not in get_json(f"{cluster.lookupd_url}/topics")["topics"]
    assert browser.find_elements(By.CSS_SELECTOR, f'#topics tr[data-topic="{topic}"]') == []


def test_create_and_delete_from_the_lookup_page(cluster, browser, topic_name):
    browser.get(cluster.url + "/lookup")
    browser.find_element(By.ID, "create-topic").send_keys(topic_name)
    browser.find_element(By.ID, "create-channel").send_keys("early")
    click_through(browser, browser.find_element(By.ID, "create-submit"))
    assert flash(browser) == f"Created topic {topic_name} and its channel early."
    assert topic_name in get_json(f"{cluster.lookupd_url}/topics")["topics"]
    # No nsqd has it yet: nsqlookupd lists it with no producer, with its channel.
    row = f'#inactive tr[data-topic="{topic_name}"]'
    assert browser.find_element(By.CSS_SELECTOR, f'{row} [data-channel="early"]')

    # Creating a channel of a topic the nsqd have creates it on each of them.
    for nsqd in cluster.nsqds:
        nsqd.publish(topic_name, 1)
    cluster.wait_registered(topic_name)
    browser.get(cluster.url + "/lookup")
    browser.find_element(By.ID, "create-topic").send_keys(topic_name)
    browser.find_element(By.ID, "create-channel").send_keys("late")
    click_through(browser, browser.find_element(By.ID, "create-submit"))
    assert all(n.channel(topic_name, "late") is not None for n in cluster.nsqds)

    # A topic only nsqlookupd knows is deleted from the Lookup page.
    only_in_lookupd = f"{topic_name}-x"
    browser.get(cluster.url + "/lookup")
    browser.find_element(By.ID, "create-topic").send_keys(only_in_lookupd)
    click_through(browser, browser.find_element(By.ID, "create-submit"))
    click_action(browser, "delete", f'#inactive tr[data-topic="{only_in_lookupd}"] td.name')
    confirm(browser)
    assert browser.current_url.startswith(f"{cluster.url}/lookup?flash=")
    assert only_in_lookupd not in get_json(f"{cluster.lookupd_url}/topics")["topics"]


def test_an_unreachable_nsqd_shows_a_banner_and_the_rest(cluster, browser, busy_topic):
    dead = "127.0.0.1:9"
    admin = start_nsqadmin(
        f"-nsqd-http-address={cluster.nsqds[1].http_address}", f"-nsqd-http-address={dead}"
    )
    try:
        browser.get(f"http://127.0.0.1:{admin.port('HTTP')}/topics/{busy_topic}")
        banner = browser.find_element(By.CSS_SELECTOR, ".banner-warning")
        assert banner.is_displayed() and dead in banner.text
        row = f'#topic-nodes tr[data-node="{cluster.nsqds[1].http_address}"]'
        assert number(field(browser, row, "message_count")) == 5
        browser.save_screenshot(str(ARTIFACTS / "unreachable.png"))
    finally:
        admin.stop()


def test_only_admin_users_see_and_use_the_buttons(cluster, browser, busy_topic):
    admin = start_nsqadmin(
        f"-lookupd-http-address={cluster.lookupd_http_address}", "-admin-user=alice"
    )
    url = f"http://127.0.0.1:{admin.port('HTTP')}/topics/{busy_topic}"
    try:
        browser.get(url)
        with pytest.raises(NoSuchElementException):
            browser.find_element(By.CSS_SELECTOR, 'button[data-action="pause"]')
        # As the proxy in front of nsqadmin would say: this is alice.
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"X-Forwarded-User": "alice"}}
        )
        browser.get(url)
        assert "alice" in browser.find_element(By.CSS_SELECTOR, ".topbar .user").text
        click_action(browser, "pause")
        assert all(n.topic(busy_topic)["paused"] for n in cluster.nsqds)
    finally:
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
        admin.stop()


def test_pages_work_without_javascript(cluster, busy_topic):
    """The same forms with JavaScript off: a plain form post, a confirmation, a redirect."""
    driver = start_chromium(prefs={"profile.managed_default_content_settings.javascript": 2})
    try:
        driver.get(f"{cluster.url}/topics/{busy_topic}/ch")
        assert driver.find_elements(By.ID, "auto-refresh") == []  # added by the script only
        click_action(driver, "pause")
        assert all(n.channel(busy_topic, "ch")["paused"] for n in cluster.nsqds)
        click_action(driver, "empty")
        confirm(driver)
        assert [n.channel(busy_topic, "ch")["depth"] for n in cluster.nsqds] == [0, 0]
    finally:
        driver.quit()


def test_reset_a_log_topic_channel_to_a_time(cluster, browser, topic_name):
    """A log topic's channel page shows its lag and an admin resets the channel to a time:
    the nsqds deliver again from there (nsqd's /channel/setoffset)."""
    for nsqd in cluster.nsqds:
        for path in (
            f"topic/create?topic={topic_name}&partition_num=1",
            f"channel/create?topic={topic_name}&channel=ch&partition=0",
        ):
            assert http("POST", f"{nsqd.url}/{path}").status == 200
        assert http("POST", f"{nsqd.url}/pub?topic={topic_name}", b"m").status == 200
        skip = http(
            "POST", f"{nsqd.url}/channel/setoffset?topic={topic_name}&channel=ch", b"special:-1"
        )
        assert skip.status == 200
    cluster.wait_registered(topic_name)
    browser.get(f"{cluster.url}/topics/{topic_name}/ch")
    assert number(field(browser, '#channel-nodes tr[data-node="*"]', "lag")) == 0
    browser.execute_script(
        "document.querySelector('#reset-form input[name=timestamp]').value = '2000-01-01T00:00:00'"
    )
    click_action(browser, "reset", "#reset-form")
    confirm(browser)
    assert flash(browser) == f"Reset channel ch of topic {topic_name} to 2000-01-01 00:00:00 UTC."
    assert [n.channel(topic_name, "ch")["lag"] for n in cluster.nsqds] == [1, 1]
    assert number(field(browser, '#channel-nodes tr[data-node="*"]', "lag")) == 2
    # The topic page: each nsqd's partition 0 with its log's end (1 message).
    browser.get(f"{cluster.url}/topics/{topic_name}")
    for nsqd in cluster.nsqds:
        row = f'#topic-nodes tr[data-node="{nsqd.http_address}"]'
        assert field(browser, row, "partition") == "0"
        assert field(browser, row, "log_end").split()[0] == "1"


def test_skip_and_unskip_a_log_topic_channel(cluster, browser, topic_name):
    """A log topic's channel page offers Youzan's skip: after a confirmation every nsqd's
    channel is skipped (nsqd's /channel/skip) and the page says so; unskip turns it back. A
    rate limit shows as a badge."""
    cluster.create_log_channel(topic_name, "ch")
    browser.get(f"{cluster.url}/topics/{topic_name}/ch")
    assert not browser.find_elements(By.ID, "skipped-badge")
    click_action(browser, "skip", "#skip-form")
    confirm(browser)
    what = f"channel ch of topic {topic_name}"
    assert flash(browser) == f"Skipped {what}: it drops what is published."
    assert [n.channel(topic_name, "ch")["skipped"] for n in cluster.nsqds] == [True, True]
    assert browser.find_element(By.ID, "skipped-badge").text == "skipped"
    click_action(browser, "unskip", "#skip-form")
    confirm(browser)
    assert flash(browser) == f"Unskipped {what}."
    assert [n.channel(topic_name, "ch")["skipped"] for n in cluster.nsqds] == [False, False]
    assert not browser.find_elements(By.ID, "skipped-badge")
    # A rate limit (nsqd's /channel/ratelimit) shows as a badge, the highest of the nodes'.
    assert not browser.find_elements(By.ID, "rate-limit-badge")
    for nsqd, kilobytes in zip(cluster.nsqds, (640, 2048), strict=True):
        target = f"channel/ratelimit?topic={topic_name}&channel=ch&partition=0"
        assert http("POST", f"{nsqd.url}/{target}&ratekilobytes={kilobytes}").status == 200
    browser.get(f"{cluster.url}/topics/{topic_name}/ch")
    assert browser.find_element(By.ID, "rate-limit-badge").text == "at most 2,048 KiB/s"
    # The forms set both limits on every nsqd: the rate, and the client limit a connected
    # consumer's RDY is held to.
    fill(browser, "#ratelimit-form input[name=ratekilobytes]", "512")
    click_action(browser, "ratelimit", "#ratelimit-form")
    assert (
        flash(browser)
        == f"Channel ch of topic {topic_name} delivers at most 512 KiB/s of bodies over 1 KiB."
    )
    assert [n.channel(topic_name, "ch")["rate_limit_kb"] for n in cluster.nsqds] == [512, 512]
    assert browser.find_element(By.ID, "rate-limit-badge").text == "at most 512 KiB/s"
    consumer = subscribe(cluster.nsqds[0], topic_name, "ch", ready=50)
    try:
        fill(browser, "#setclientlimit-form input[name=client_prefix]", "127.0.0.1")
        fill(browser, "#setclientlimit-form input[name=ready]", "3")
        click_action(browser, "setclientlimit", "#setclientlimit-form")
        assert flash(browser) == (
            f"Channel ch of topic {topic_name}: consumers at 127.0.0.1… hold at most 3 in flight."
        )
        (client,) = cluster.nsqds[0].channel(topic_name, "ch")["clients"]
        assert (client["ready_count"], client["limited_rdy"]) == (50, 3)
    finally:
        consumer.close()


def test_the_statistics_page_ranks_topics_and_channels(cluster, browser, topic_name):
    """Youzan's Statistics page, from the menu: the topics by channel depth (a topic with
    1,000 waiting among them, its depth and messages shown), and each sort a tab."""
    for nsqd, count in zip(cluster.nsqds, (400, 600), strict=True):
        nsqd.create_channel(topic_name, "ch")
        nsqd.publish(topic_name, count)
    cluster.wait_registered(topic_name)
    cluster.wait_in_channels(topic_name)
    browser.get(f"{cluster.url}/counter")
    click_through(browser, browser.find_element(By.LINK_TEXT, "Statistics"))
    assert browser.find_element(By.ID, "rank-name").text == "Top10 topics in Total Channel Depth"
    row = f'#statistics-top tr[data-name="{topic_name}"]'
    assert numbers(browser, row, "total_channel_depth", "message_count") == {
        "total_channel_depth": 1000,
        "message_count": 1000,
    }
    tab = '#statistics-filters a[data-filter="channel-requeue"]'
    click_through(browser, browser.find_element(By.CSS_SELECTOR, tab))
    assert browser.find_element(By.ID, "rank-name").text == "Top10 channels in Requeue"
    assert "active" in browser.find_element(By.CSS_SELECTOR, tab).get_attribute("class")


def test_the_topic_page_shows_each_partitions_replicas(replicated, browser):
    """A cluster topic's page: each partition once, with its leader, ISR, catch-up nodes and
    write epoch, the partition leading to its coordinator page; a follower killed, the
    partition is flagged under-replicated. The page's screenshot goes to
    tests/nsqadmin/artifacts/replicas.png."""
    local = replicated.local
    local.create_topic("two", 1, 2)
    info = local.partition("two", 0)
    leader, victim = (local.node(node_id) for node_id in info["isr"])
    assert leader.node_id == info["leader"]
    row = '#partition-replicas tr[data-partition="0"]'

    def chips(cell: str) -> list[str]:
        elements = browser.find_elements(By.CSS_SELECTOR, f'{row} [data-field="{cell}"] .node-chip')
        return [element.get_attribute("data-node-id") for element in elements]

    def flags() -> list[str]:
        elements = browser.find_elements(By.CSS_SELECTOR, f"{row} [data-flag]")
        return [element.get_attribute("data-flag") for element in elements]

    browser.get(f"{replicated.url}/topics/two")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#partition-replicas tbody tr")) == 1
    assert field(browser, row, "leader") == f"127.0.0.1:{leader.tcp_port}"
    assert chips("isr") == info["isr"]
    assert field(browser, row, "isr_size") == "2/2"
    assert chips("catchup") == []
    assert field(browser, row, "write_epoch") == str(info["write_epoch"])
    assert field(browser, row, "state") == "in sync"
    assert flags() == []
    assert not browser.find_elements(By.ID, "under-replicated")
    # The leader's name leads to its node page.
    link = browser.find_element(By.CSS_SELECTOR, f'{row} [data-field="leader"] a')
    assert link.get_attribute("href").endswith(f"/nodes/127.0.0.1%3A{leader.http_port}")
    # The partition leads to its coordinator, as the node that reported it sees it.
    click_through(
        browser, browser.find_element(By.CSS_SELECTOR, f'{row} [data-field="partition"] a')
    )
    coordinator = '#coordinators tr[data-partition="0"]'
    isr = browser.find_elements(By.CSS_SELECTOR, f'{coordinator} [data-field="isr"] .chip')
    assert [chip.get_attribute("data-node") for chip in isr] == info["isr"]
    assert field(browser, coordinator, "catchup") == "–"

    victim.kill()

    def flagged() -> bool:
        browser.get(f"{replicated.url}/topics/two")
        return "under-replicated" in flags()

    poll(flagged, "the topic page flagging two/0 under-replicated", timeout=20)
    assert "under-replicated" in browser.find_element(By.CSS_SELECTOR, row).get_attribute("class")
    badge = browser.find_element(By.CSS_SELECTOR, f'{row} [data-flag="under-replicated"]')
    assert badge.is_displayed() and badge.text == "under-replicated"
    assert flags() == ["under-replicated", "not-writable"]
    assert browser.find_element(By.ID, "under-replicated").text == (
        "1 of 1 partitions under-replicated"
    )
    assert chips("isr") == [leader.node_id]
    assert chips("catchup") == [victim.node_id]
    assert field(browser, row, "isr_size") == "1/2"
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "replicas.png"
    browser.save_screenshot(str(screenshot))
    print(f"replicas page screenshot: {screenshot}")

    # The Streams page flags the topic too.
    browser.get(f"{replicated.url}/")
    flag = browser.find_element(
        By.CSS_SELECTOR, 'tr[data-topic="two"] [data-flag="under-replicated"]'
    )
    assert flag.text == "1 under-replicated"


def test_a_replicated_clusters_operations_in_the_browser(replicated, browser):
    """Youzan's create form, the Streams page's partitions × replicas, expanding and moving
    from the Topic page, and on the Nodes page the cluster (master, etcd, each node's leaders
    and replicas), upgrade mode and removing a node: each confirmed, then checked on the
    master nsqlookupd."""
    local = replicated.local
    url = replicated.url

    browser.get(f"{url}/lookup")
    for element_id, value in (
        ("create-topic", "ops"),
        ("create-channel", "c"),
        ("create-partitions", "2"),
        ("create-replicas", "2"),
        ("create-retention", "3"),
    ):
        browser.find_element(By.ID, element_id).send_keys(value)
    click_through(browser, browser.find_element(By.ID, "create-submit"))
    assert flash(browser) == "Created topic ops (2 partitions × 2 replicas) and its channel c."
    for partition in (0, 1):
        poll(lambda p=partition: local.node_leading("ops", p), f"ops/{partition}")
    meta = get_json(f"http://{replicated.lookupd_http_address}/lookup?topic=ops&metainfo=true")
    assert (meta["meta"]["partition_num"], meta["meta"]["replica"]) == (2, 2)

    def streams_badge() -> str:
        browser.get(f"{url}/")
        found = browser.find_elements(
            By.CSS_SELECTOR, 'tr[data-topic="ops"] [data-flag="partitioned"]'
        )
        return found[0].text if found else ""

    poll(lambda: streams_badge() == "2 × 2", "the Streams page's 2 × 2")

    # Expand to three partitions.
    browser.get(f"{url}/topics/ops")
    count = browser.find_element(By.ID, "expand-partitions")
    count.clear()
    count.send_keys("3")
    click_through(browser, browser.find_element(By.ID, "expand-submit"))
    confirm(browser)
    assert flash(browser) == "Expanded topic ops to 3 partitions."
    poll(lambda: local.node_leading("ops", 2), "ops/2 led")

    # Move partition 0, with its leadership, to the node that does not hold it.
    entry = local.partition("ops", 0)
    [spare] = [n.node_id for n in local.nodes if n.node_id not in entry["isr"]]
    browser.get(f"{url}/topics/ops")
    Select(browser.find_element(By.ID, "move-partition")).select_by_value("0")
    Select(browser.find_element(By.ID, "move-from")).select_by_value(entry["leader"])
    Select(browser.find_element(By.ID, "move-to")).select_by_value(spare)
    browser.find_element(By.ID, "move-leader").click()
    click_through(browser, browser.find_element(By.ID, "move-submit"))
    confirm(browser)
    assert flash(browser) == f"Moved partition 0 of topic ops to {spare}."
    assert local.partition("ops", 0)["leader"] == spare

    # The Nodes page: the cluster as the master sees it.
    def nodes_page_matches() -> bool:
        browser.get(f"{url}/nodes")
        return all(
            numbers(
                browser, f'#cluster-nodes tr[data-node-id="{node["id"]}"]', "leaders", "replicas"
            )
            == {"leaders": node["leaders"], "replicas": node["replicas"]}
            for node in local.stats()["nodes"]
        )

    poll(nodes_page_matches, "the Nodes page showing each node's leaders and replicas")
    master = local.stats()["master"]
    assert browser.find_element(By.ID, "cluster-master").text == (
        f"{master['NodeIP']}:{master['HttpPort']}"
    )
    assert browser.find_element(By.ID, "cluster-etcd").text.startswith("reachable")

    # Upgrade mode on and off.
    click_action(browser, "upgrade_begin", "#cluster")
    confirm(browser)
    assert flash(browser) == "Upgrade mode on."
    assert local.stats()["upgrading"] is True
    assert browser.find_element(By.CSS_SELECTOR, '#cluster [data-flag="upgrading"]').is_displayed()
    click_action(browser, "upgrade_done", "#cluster")
    confirm(browser)
    assert flash(browser) == "Upgrade mode off."
    assert local.stats()["upgrading"] is False

    # Remove the node that now leads partition 0: it ends holding nothing.
    click_action(browser, "remove_node", f'#cluster-nodes tr[data-node-id="{spare}"]')
    confirm(browser)
    assert flash(browser) == f"Removing {spare}: its replicas are moving to other nodes."

    def holds_nothing() -> bool:
        stats = local.stats()
        return stats["removed_nodes"] == [spare] and all(
            spare not in [e["leader"], *e["isr"], *e["catchup"]] for e in stats["partitions"]
        )

    poll(
        holds_nothing,
        lambda: f"the removed node holding nothing\n{local.describe()}",
        timeout=60,
    )
    browser.get(f"{url}/nodes")
    row = f'#cluster-nodes tr[data-node-id="{spare}"]'
    assert numbers(browser, row, "replicas") == {"replicas": 0}
    assert browser.find_element(By.CSS_SELECTOR, f'{row} [data-flag="removed"]').text == (
        "removed: may be stopped"
    )


def test_the_nodes_page_says_what_is_wrong_with_the_control_plane(replicated, browser):
    """A node frozen past its lease, then etcd stopped: the Nodes page lists each as its
    master nsqlookupd sees it, while it lasts, and says healthy once it is over."""
    local = replicated.local
    local.create_topic("cp", 1, 3)

    def problems() -> list[str]:
        browser.get(f"{replicated.url}/nodes")
        found = browser.find_elements(By.CSS_SELECTOR, "#cluster-control-plane [data-problem]")
        return [element.text for element in found]

    assert problems() == []
    assert browser.find_element(By.ID, "cluster-control-plane").text == "healthy"
    frozen = local.nodes[2]
    frozen.pause()
    try:
        listed = poll(
            lambda: [problem for problem in problems() if frozen.node_id in problem],
            "the frozen node on the Nodes page",
        )
        assert listed[0].startswith(f"degraded node {frozen.node_id}: its lease is lost"), listed
    finally:
        frozen.resume()
    poll(lambda: not problems(), "the control plane healthy again")
    local.etcd.pause()
    try:
        listed = poll(
            lambda: [problem for problem in problems() if "etcd unreachable since" in problem],
            "etcd unreachable on the Nodes page",
        )
        assert listed[0].startswith("degraded etcd unreachable since "), listed
    finally:
        local.etcd.resume()
    poll(lambda: not problems(), "the control plane healthy again")
    assert browser.find_element(By.ID, "cluster-control-plane").text == "healthy"
