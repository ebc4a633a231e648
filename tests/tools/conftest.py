"""Fixtures of the tools tests: one real nsqd (and one nsqlookupd it registers with) as
subprocesses on ephemeral ports, shared by the module; each test uses its own topic."""

import itertools
import os
import signal
import subprocess
import time
import urllib.error

import pytest

from nsqpy.client.blocking import http_json
from tests.harness import BIN, DaemonProcess, start_nsqd

_topic_numbers = itertools.count()


@pytest.fixture(scope="module")
def lookupd():
    daemon = DaemonProcess(
        "nsqlookupd",
        ["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0", "-broadcast-address=127.0.0.1"],
    ).start(wait_for=("TCP", "HTTP"))
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def nsqd(lookupd, tmp_path_factory):
    daemon = start_nsqd(
        tmp_path_factory.mktemp("nsqd"),
        f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
        "-broadcast-address=127.0.0.1",
    )
    yield daemon
    daemon.stop()


@pytest.fixture
def topic(request) -> str:
    return f"tools_{request.node.name[:30].strip('_[]')}_{next(_topic_numbers)}".replace("[", "_")


def run_tool(name: str, *args: str, stdin: bytes = b"", timeout: float = 20.0):
    """Run a tool's console script to completion; the CompletedProcess (bytes)."""
    return subprocess.run(
        [str(BIN / name), *args], input=stdin, capture_output=True, timeout=timeout, check=False
    )


def start_tool(name: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / name), *args],
        stdin=kwargs.pop("stdin", subprocess.DEVNULL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def stop_tool(process: subprocess.Popen, timeout: float = 15.0) -> tuple[bytes, bytes]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err.decode()
    return out, err


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.02):
    """Poll `predicate` until it returns something true (returned), failing at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict | None:
    stats = http_json(nsqd.addresses["HTTP"], "/stats", format="json", topic=topic)
    for topic_stats in stats.get("topics") or []:
        if topic_stats["topic_name"] == topic:
            for channel_stats in topic_stats["channels"]:
                if channel_stats["channel_name"] == channel:
                    return channel_stats
    return None


def topic_channels(nsqd: DaemonProcess, topic: str) -> list[dict]:
    stats = http_json(nsqd.addresses["HTTP"], "/stats", format="json", topic=topic)
    for topic_stats in stats.get("topics") or []:
        if topic_stats["topic_name"] == topic:
            return topic_stats["channels"]
    return []


__all__ = ["os", "run_tool", "start_tool", "stop_tool", "wait_until"]


def lookupd_has_topic(lookupd: DaemonProcess, topic: str) -> bool:
    try:
        document = http_json(lookupd.addresses["HTTP"], "/lookup", topic=topic)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise
    return bool(document.get("producers"))
