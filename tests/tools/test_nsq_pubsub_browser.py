"""nsq_pubsub's Server-Sent Events in a real browser's EventSource: headless Chromium
(Debian's `chromium` and `chromium-driver`, which `make test` installs) driven by selenium, as
in tests/nsqadmin/test_browser.py.

The page subscribes to a named channel with `new EventSource('/sub?...')` and keeps every
event. nsq_pubsub is then stopped (its subscriber's stream ends, its unfinished messages
REQueued) and messages are published straight to nsqd while it is away; started again on the
same port, the browser reconnects by itself (nsq_pubsub's `retry: 1000`), sending the last
`id:` it saw as `Last-Event-ID`, and receives what the channel kept for it.
"""

import pytest
from selenium.common.exceptions import WebDriverException

from nsqpy.client.blocking import http_publish
from tests.browser import start_chromium
from tests.harness import DaemonProcess
from tests.support.polling import poll
from tests.tools.pubsub import publish, start_pubsub, subscribers_of

DEADLINE = 15.0

# The page's script: every event's id and data, and how many times the stream opened.
SUBSCRIBE = """
window.received = [];
window.opened = 0;
const source = new EventSource(arguments[0]);
source.onopen = () => { window.opened += 1; };
source.onmessage = (event) => {
  window.received.push({id: event.lastEventId, data: event.data});
};
window.source = source;
"""


@pytest.fixture(scope="module")
def browser():
    driver = start_chromium()
    yield driver
    driver.quit()


@pytest.fixture
def launch():
    """Start nsq_pubsubs for the test; each is stopped at its end."""
    started: list[DaemonProcess] = []

    def launch_one(*args: str, port: int = 0) -> DaemonProcess:
        started.append(start_pubsub(*args, port=port))
        return started[-1]

    yield launch_one
    for daemon in started:
        daemon.stop()


def received(driver) -> list[dict]:
    try:
        return driver.execute_script("return window.received;") or []
    except WebDriverException:
        return []


def test_event_source_receives_and_resumes_after_a_restart(browser, nsqd, topic, launch):
    args = (f"-nsqd-tcp-address={nsqd.addresses['TCP']}",)
    pubsub = launch(*args)
    port = pubsub.port("HTTP")
    # A page of nsq_pubsub's own origin, so the EventSource is same-origin.
    browser.get(f"http://127.0.0.1:{port}/ping")
    browser.execute_script(SUBSCRIBE, f"/sub?topic={topic}&channel=browser")
    poll(lambda: subscribers_of(pubsub, topic), timeout=DEADLINE)
    publish(pubsub, topic, b"one")
    publish(pubsub, topic, b"two")
    publish(pubsub, topic, b"three\nlines")
    poll(lambda: len(received(browser)) == 3, timeout=DEADLINE)
    first = received(browser)
    assert [event["data"] for event in first] == ["one", "two", "three\nlines"]
    ids = [event["id"] for event in first]
    assert all(len(i) == 16 for i in ids) and len(set(ids)) == 3

    assert pubsub.stop() == 0, pubsub.log
    # While nsq_pubsub is away the channel keeps what is published.
    http_publish(nsqd.addresses["HTTP"], topic, [b"four", b"five"])
    pubsub = launch(*args, port=port)
    poll(lambda: len(received(browser)) == 5, timeout=DEADLINE)
    assert [event["data"] for event in received(browser)[3:]] == ["four", "five"]
    assert browser.execute_script("return window.opened;") == 2
    (entry,) = subscribers_of(pubsub, topic)
    # The browser told the new stream where it had got to.
    assert (entry["kind"], entry["last_event_id"]) == ("sse", ids[-1])
    browser.execute_script("window.source.close();")
    poll(lambda: not subscribers_of(pubsub, topic), timeout=DEADLINE)
