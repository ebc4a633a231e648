"""`nsqd --workers=2`: two processes share the topics, and from outside it is one nsqd.

Which worker accepts a connection is the kernel's choice, so every test uses topics owned by
both workers (`owner_of`) and enough connections that some land on the worker that does not
own their topic and are moved or relayed to the one that does (`nsqd/handoff.py`).
"""

import asyncio
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import nsq
import pytest

from nsqpy.client.blocking import Consumer, NSQError, Producer
from nsqpy.common.command import encode_command
from nsqpy.nsqd.metadata import read_metadata
from nsqpy.nsqd.worker import WORKER_ENVIRONMENT, owner_of
from tests.harness import BIN, V2Connection, start_nsqd, start_nsqlookupd
from tests.security.support import Certificates, make_certificates
from tests.support.http import get_json, post, request
from tests.support.polling import poll
from tests.support.workers import WORKERS, topics_on_both, worker_pids


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def nsqd(tmp_path):
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}")
    yield daemon
    assert daemon.stop() == 0, daemon.log


def tcp(daemon) -> str:
    return daemon.addresses["TCP"]


def stats(daemon, **params: str) -> dict:
    query = "&".join(f"{key}={value}" for key, value in {"format": "json", **params}.items())
    return get_json(daemon.addresses["HTTP"], f"/stats?{query}")


def consume(daemon, topic: str, count: int, channel: str = "ch") -> list[bytes]:
    with Consumer(tcp(daemon), topic, channel) as consumer:
        bodies = []
        for _ in range(count):
            message = consumer.receive(timeout=10)
            assert message is not None, f"{topic}: {len(bodies)} of {count} messages"
            bodies.append(message.body)
            consumer.finish(message.id)
        return bodies


def test_every_topic_is_served_whichever_worker_accepts(nsqd):
    topics = topics_on_both(8)
    # One connection publishes to every topic: it moves to its first topic's owner, which
    # forwards the publishes for the other worker's topics.
    with Producer(tcp(nsqd)) as producer:
        for topic in topics:
            producer.publish(topic, f"{topic} one".encode())
            producer.multi_publish(topic, [f"{topic} two".encode(), f"{topic} three".encode()])
            producer.deferred_publish(topic, 1, f"{topic} four".encode())
        document = stats(nsqd)
    for topic in topics:
        assert sorted(consume(nsqd, topic, 4)) == sorted(
            f"{topic} {n}".encode() for n in ("one", "two", "three", "four")
        )
    assert [t["topic_name"] for t in document["topics"]] == sorted(topics)
    (producer_stats,) = document["producers"]
    assert {t["topic"]: t["count"] for t in producer_stats["pub_counts"]} == {
        topic: 4 for topic in topics
    }
    assert {t["topic_name"]: t["message_count"] for t in stats(nsqd)["topics"]} == {
        topic: 4 for topic in topics
    }


def test_consumers_of_a_topic_share_its_channel_on_its_owner(nsqd):
    topics = topics_on_both(2)
    consumers = [Consumer(tcp(nsqd), topic, "ch") for topic in topics for _ in range(6)]
    try:
        document = stats(nsqd)
        for topic in document["topics"]:
            (channel,) = topic["channels"]
            assert len(channel["clients"]) == 6
        ids = [c["client_id"] for t in document["topics"] for c in t["channels"][0]["clients"]]
        assert len(ids) == 12
        with Producer(tcp(nsqd)) as producer:
            for topic in topics:
                producer.multi_publish(topic, [b"%d" % n for n in range(60)])
        received: dict[str, int] = {topic: 0 for topic in topics}
        for consumer in consumers:
            while (message := consumer.receive(timeout=0.5)) is not None:
                consumer.finish(message.id)
                received[consumer.topic] += 1
        assert received == {topic: 60 for topic in topics}
    finally:
        for consumer in consumers:
            consumer.close()
    moved = [line for line in nsqd.lines if "to worker" in line]
    assert moved, "no connection was handed to another worker"


def test_http_requests_reach_the_topics_owner(nsqd):
    http = nsqd.addresses["HTTP"]
    topics = topics_on_both(6)
    for topic in topics:
        post(http, f"/topic/create?topic={topic}")
        post(http, f"/channel/create?topic={topic}&channel=c")
        post(http, f"/pub?topic={topic}", b"one")
        post(http, f"/mpub?topic={topic}", b"two\nthree")
    document = stats(nsqd)
    assert {t["topic_name"]: t["depth"] for t in document["topics"]} == {t: 0 for t in topics}
    assert {t["topic_name"]: t["channels"][0]["depth"] for t in document["topics"]} == {
        t: 3 for t in topics
    }
    first, second = topics[:2]
    post(http, f"/channel/empty?topic={first}&channel=c")
    post(http, f"/topic/pause?topic={second}")
    post(http, f"/topic/delete?topic={topics[-1]}")
    document = stats(nsqd)
    by_name = {t["topic_name"]: t for t in document["topics"]}
    assert topics[-1] not in by_name
    assert by_name[first]["channels"][0]["depth"] == 0
    assert by_name[second]["paused"] is True
    # A topic's own stats come from its owner, whichever worker is asked.
    for _ in range(6):
        (only,) = stats(nsqd, topic=second)["topics"]
        assert only["topic_name"] == second
    metrics = request(http, "GET", "/metrics").body.decode()
    for topic in topics[:-1]:
        assert f'nsq_topic_messages_total{{topic="{topic}"}} 3' in metrics
    text = request(http, "GET", "/stats").body.decode()
    for topic in topics[:-1]:
        assert f"[{topic:<15}] depth:" in text or f"[{topic}" in text


def test_settings_change_on_every_worker(nsqd):
    http = nsqd.addresses["HTTP"]
    reply = request(http, "PUT", "/config/log_level", b"debug")
    assert reply.status == 200, reply
    # Each GET lands on either worker.
    for _ in range(8):
        assert get_json(http, "/config/log_level") == 1


def test_node_wide_youzan_stats_join_every_workers(nsqd):
    """`/message/historystats` without a topic lists every worker's partitions, whichever
    worker is asked; `/serverstats` adds up their refused publishes."""
    http = nsqd.addresses["HTTP"]
    topics = topics_on_both(4, prefix="hist")
    for topic in topics:
        post(http, f"/topic/create?topic={topic}&partition_num=1")
    for _ in range(6):
        document = get_json(http, "/message/historystats")
        listed = [entry["topic_name"] for entry in document["node_hourly_pub_size_stats"]]
        assert [name for name in listed if name in topics] == sorted(topics)
        assert get_json(http, "/serverstats")["server_pub_failed"] == 0


def test_one_nsqd_dat_holds_every_workers_topics_and_a_restart_keeps_the_messages(tmp_path):
    topics = topics_on_both(6)
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}")
    with Producer(tcp(daemon)) as producer:
        for topic in topics:
            producer.multi_publish(topic, [f"{topic}-{n}".encode() for n in range(5)])
    for topic in topics[:2]:
        post(daemon.addresses["HTTP"], f"/channel/create?topic={topic}&channel=kept")
    assert daemon.stop() == 0, daemon.log
    # Go's format, one file: the topics of both workers, the channels with them.
    saved = {topic.name: topic for topic in read_metadata(str(tmp_path))}
    assert sorted(saved) == sorted(topics)
    assert [c.name for c in saved[topics[0]].channels] == ["kept"]
    restarted = start_nsqd(tmp_path, f"-workers={WORKERS}")
    try:
        for topic in topics[2:]:
            assert sorted(consume(restarted, topic, 5)) == sorted(
                f"{topic}-{n}".encode() for n in range(5)
            )
        assert sorted(consume(restarted, topics[0], 5, channel="kept")) == sorted(
            f"{topics[0]}-{n}".encode() for n in range(5)
        )
    finally:
        assert restarted.stop() == 0, restarted.log


def test_nsqlookupd_sees_one_node_with_every_topic(tmp_path):
    lookupd = start_nsqlookupd()
    daemon = start_nsqd(
        tmp_path, f"-workers={WORKERS}", f"-lookupd-tcp-address={lookupd.addresses['TCP']}"
    )
    try:
        topics = topics_on_both(4)
        with Producer(tcp(daemon)) as producer:
            for topic in topics:
                producer.publish(topic, b"x")
        lookupd_http = lookupd.addresses["HTTP"]

        def registered() -> list:
            nodes = get_json(lookupd_http, "/nodes")["producers"]
            return nodes if nodes and sorted(nodes[0]["topics"]) == sorted(topics) else []

        (node,) = poll(registered, "every topic registered")
        assert node["tcp_port"] == daemon.port("TCP")
        assert node["http_port"] == daemon.port("HTTP")
        for topic in topics:
            (producer,) = get_json(lookupd_http, f"/lookup?topic={topic}")["producers"]
            assert producer["tcp_port"] == daemon.port("TCP")
        # A channel created on either worker is registered too, and its deletion is heard.
        post(daemon.addresses["HTTP"], f"/channel/create?topic={topics[1]}&channel=c")
        poll(
            lambda: get_json(lookupd_http, f"/channels?topic={topics[1]}")["channels"] == ["c"],
            "the channel registered",
        )
        post(daemon.addresses["HTTP"], f"/topic/delete?topic={topics[0]}")
        poll(
            lambda: not get_json(lookupd_http, f"/lookup?topic={topics[0]}").get("producers"),
            "the deleted topic unregistered",
        )
        # A topic's partitions, which both workers hold, are the one node's.
        post(daemon.addresses["HTTP"], "/topic/create?topic=parts&partition_num=4")

        def partitions() -> list[str]:
            answer = request(lookupd_http, "GET", "/lookup?topic=parts")
            return sorted(answer.json().get("partitions") or {}) if answer.status == 200 else []

        poll(lambda: partitions() == ["0", "1", "2", "3"], "every partition registered")
        (producer,) = get_json(lookupd_http, "/lookup?topic=parts")["producers"]
        assert producer["tcp_port"] == daemon.port("TCP")
    finally:
        assert daemon.stop() == 0, daemon.log
        lookupd.stop()


def test_a_killed_worker_is_started_again_and_keeps_what_it_acknowledged(tmp_path):
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}", "--mem-queue-size=0", "--sync-every=1")
    try:
        topics = topics_on_both(4)
        with Producer(tcp(daemon)) as producer:
            for topic in topics:
                producer.multi_publish(topic, [f"{topic}-{n}".encode() for n in range(20)])
        first, second = worker_pids(daemon)
        os.kill(first, signal.SIGKILL)
        daemon.wait_for_log(r"WORKER\(\d\): exited with status -9; starting it again")
        poll(
            lambda: len(worker_pids(daemon)) == 2 and first not in worker_pids(daemon),
            "the worker started again",
        )
        for topic in topics:
            assert sorted(poll(lambda t=topic: _consume_when_served(daemon, t))) == sorted(
                f"{topic}-{n}".encode() for n in range(20)
            )
        assert second in worker_pids(daemon)
    finally:
        assert daemon.stop() == 0, daemon.log


def _consume_when_served(daemon, topic: str) -> list[bytes] | None:
    """The topic's 20 messages, or None while its worker is not serving yet."""
    try:
        return consume(daemon, topic, 20)
    except (OSError, AssertionError):
        return None


def test_kill_9_of_nsqd_takes_its_workers_with_it(tmp_path):
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}", "--mem-queue-size=0")
    with Producer(tcp(daemon)) as producer:
        for topic in topics_on_both(2):
            producer.publish(topic, b"kept")
    workers = worker_pids(daemon)
    daemon.kill()

    def gone() -> bool:
        return not any(os.path.exists(f"/proc/{pid}") for pid in workers)

    poll(gone, "the workers gone with their supervisor")
    # The ports are free again at once: nsqd restarts on them.
    port, http_port = daemon.port("TCP"), daemon.port("HTTP")
    restarted = start_nsqd(
        tmp_path,
        f"-workers={WORKERS}",
        f"-tcp-address=127.0.0.1:{port}",
        f"-http-address=127.0.0.1:{http_port}",
    )
    try:
        for topic in topics_on_both(2):
            assert consume(restarted, topic, 1) == [b"kept"]
    finally:
        assert restarted.stop() == 0, restarted.log


def test_ephemeral_channels_go_with_their_last_consumer(nsqd):
    for topic in topics_on_both(4):
        consumer = Consumer(tcp(nsqd), topic, "gone#ephemeral")
        (found,) = stats(nsqd, topic=topic)["topics"]
        assert [c["channel_name"] for c in found["channels"]] == ["gone#ephemeral"]
        consumer.close()
        poll(
            lambda t=topic: not stats(nsqd, topic=t)["topics"][0]["channels"],
            "the ephemeral channel deleted",
        )


def worker_index(pid: int) -> int:
    """The worker number the supervisor gave process `pid` (its `NSQPY_WORKER` setting)."""
    with open(f"/proc/{pid}/environ", "rb") as environ:
        for entry in environ.read().split(b"\0"):
            name, _, value = entry.partition(b"=")
            if name.decode() == WORKER_ENVIRONMENT:
                return int(value.split(b",")[0])
    raise AssertionError(f"process {pid} is not an nsqd worker")


def test_tls_and_compressed_connections_are_relayed_to_the_owner(tmp_path, certs):
    daemon = start_nsqd(
        tmp_path,
        f"-workers={WORKERS}",
        *certs.tls_flags(),
        wait_for=("TCP", "HTTP", "HTTPS"),
    )
    # Which worker accepts is the kernel's choice; with worker 0 stopped, worker 1 accepts
    # every connection, so each reader of a worker-0 topic must be relayed there.
    (stopped,) = [pid for pid in worker_pids(daemon) if worker_index(pid) == 0]
    try:
        topics = [
            name for name in topics_on_both(4, prefix="tls") if owner_of(name, 0, WORKERS) == 0
        ]
        received = asyncio.run(_pynsq_round_trip(daemon, topics, certs.ca, stopped))
        assert received == {topic: [b"over tls", b"and deflate"] for topic in topics}
    finally:
        os.kill(stopped, signal.SIGCONT)
        assert daemon.stop() == 0, daemon.log


async def _pynsq_round_trip(
    daemon, topics: list[str], ca: str, stopped: int
) -> dict[str, list[bytes]]:
    """pynsq Readers over TLS (every other one with deflate) on each topic, connected while
    the worker `stopped` is stopped; once each is relayed, that worker continues and pynsq
    Writers publish to every topic."""
    address = tcp(daemon)
    loop = asyncio.get_running_loop()
    received: dict[str, list[bytes]] = {topic: [] for topic in topics}
    readers = []
    options = [
        {"tls_v1": True, "tls_options": {"ca_certs": ca}, "deflate": index % 2 == 1}
        for index in range(len(topics))
    ]
    os.kill(stopped, signal.SIGSTOP)
    for topic, settings in zip(topics, options, strict=True):

        def handle(message, topic=topic) -> bool:
            received[topic].append(message.body)
            return True

        readers.append(
            nsq.Reader(
                topic=topic,
                channel="ch",
                message_handler=handle,
                nsqd_tcp_addresses=[address],
                max_in_flight=10,
                **settings,
            )
        )
    # Every reader is relayed (its writer may be too, once both workers accept).
    deadline = loop.time() + 20
    while sum("relayed to worker 0" in line for line in daemon.lines) < len(topics):
        assert loop.time() < deadline, daemon.log
        await asyncio.sleep(0.02)
    os.kill(stopped, signal.SIGCONT)
    for topic, settings in zip(topics, options, strict=True):
        writer = nsq.Writer([address], **settings)
        for body in (b"over tls", b"and deflate"):
            answered: asyncio.Future = loop.create_future()
            while not writer.conns:
                await asyncio.sleep(0.01)
            writer.pub(topic, body, callback=lambda conn, data, f=answered: f.set_result(data))
            assert await asyncio.wait_for(answered, 10) == b"OK"
        for conn in list(writer.conns.values()):
            conn.close()
    deadline = loop.time() + 20
    while any(len(bodies) < 2 for bodies in received.values()):
        assert loop.time() < deadline, received
        await asyncio.sleep(0.02)
    for reader in readers:
        reader.close()
    return {topic: sorted(bodies, reverse=True) for topic, bodies in received.items()}


def test_bad_workers_values_are_refused_in_one_line(tmp_path):
    for value in ("0", "many"):
        finished = _run_nsqd(tmp_path, f"-workers={value}")
        # Go's flag package: the value's error, then the usage, exit status 2.
        assert finished.returncode == 2
        assert finished.stderr.splitlines()[0] == (
            f"invalid value \"{value}\" for flag -workers: must be a number >= 1 or 'auto',"
            f" not '{value}'"
        )


def test_a_config_file_may_give_the_workers_as_a_number(tmp_path):
    config = tmp_path / "nsqd.toml"
    config.write_text("workers = 2\n")
    data = tmp_path / "data"
    data.mkdir()
    daemon = start_nsqd(data, f"-config={config}")
    try:
        daemon.wait_for_log(r"WORKERS: 2 processes share the topics")
        assert len(worker_pids(daemon)) == 2
    finally:
        assert daemon.stop() == 0, daemon.log


def _run_nsqd(data_path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "nsqd"), f"-data-path={data_path}", *flags],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_auto_means_one_worker_per_core(tmp_path):
    daemon = start_nsqd(tmp_path, "-workers=auto")
    try:
        cores = os.cpu_count() or 1
        if cores > 1:
            daemon.wait_for_log(rf"WORKERS: {cores} processes share the topics")
        assert len(worker_pids(daemon)) == (cores if cores > 1 else 0)
    finally:
        assert daemon.stop() == 0, daemon.log


def test_a_keep_alive_http_connection_follows_its_topics_owner(tmp_path):
    """A plain HTTP connection moves to the owner of the topic it posts to, and on to the
    other worker when it posts to one of that worker's topics; pipelined requests too."""
    nsqd = start_nsqd(tmp_path, f"-workers={WORKERS}", "-log-level=debug")
    try:
        _post_alternately(nsqd)
    except (OSError, AssertionError) as error:
        raise AssertionError(f"{error!r}\n{nsqd.log}") from error
    finally:
        assert nsqd.stop() == 0, nsqd.log
    assert any("HTTP: " in line and "moved to worker" in line for line in nsqd.lines)


def _post_alternately(nsqd) -> None:
    host, port = nsqd.addresses["HTTP"].rsplit(":", 1)
    topics = topics_on_both(2, prefix="keep")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for round_number in range(5):
            for topic in topics:
                connection.request("POST", f"/pub?topic={topic}", body=b"%d" % round_number)
                reply = connection.getresponse()
                assert (reply.status, reply.read()) == (200, b"OK")
    finally:
        connection.close()
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        requests = b"".join(
            f"POST /pub?topic={topic} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nP".encode()
            for topic in (*topics, *topics)
        )
        raw.sendall(requests)
        answers = b""
        while answers.count(b"\r\n\r\nOK") < 4:
            chunk = raw.recv(65536)
            assert chunk, answers
            answers += chunk
    depths = {t["topic_name"]: t["message_count"] for t in stats(nsqd)["topics"]}
    assert depths == {topic: 7 for topic in topics}


def test_a_corrupt_nsqd_dat_is_recovered_once_for_every_worker(tmp_path):
    topics = topics_on_both(4)
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}")
    with Producer(tcp(daemon)) as producer:
        for topic in topics:
            producer.publish(topic, f"{topic} kept".encode())
    assert daemon.stop() == 0, daemon.log
    (tmp_path / "nsqd.dat").write_bytes(b"{not json")
    restarted = start_nsqd(tmp_path, f"-workers={WORKERS}")
    try:
        (recovered,) = [line for line in restarted.lines if "moved it to" in line]
        assert "recovered 4 topics" in recovered
        for topic in topics:
            assert consume(restarted, topic, 1) == [f"{topic} kept".encode()]
    finally:
        assert restarted.stop() == 0, restarted.log
    assert sorted(topic.name for topic in read_metadata(str(tmp_path))) == sorted(topics)


def test_a_refused_forwarded_publish_closes_only_its_own_client(tmp_path):
    """The link between two workers carries every client's forwarded publishes: a publish the
    owner refuses is answered with the owner's error (and closes that client, as Go closes
    after a PUB error), and the link goes on serving the next client."""
    # At debug, each IDENTIFY is logged: the links' show how many there were.
    nsqd = start_nsqd(tmp_path, f"-workers={WORKERS}", "-log-level=debug")
    try:
        _refused_forwarded_publish(nsqd)
    finally:
        assert nsqd.stop() == 0, nsqd.log


def _refused_forwarded_publish(nsqd) -> None:
    http = nsqd.addresses["HTTP"]
    first, second = topics_on_both(2)
    refused = Producer(tcp(nsqd))
    refused.publish(first, b"moves the connection to the first topic's owner")
    post(http, "/disable/write?type=all")
    with pytest.raises(NSQError, match="E_FAILED_ON_NOT_LEADER"):
        refused.publish(second, b"forwarded, refused")
    refused.close()
    post(http, "/disable/write")
    for _ in range(3):
        with Producer(tcp(nsqd)) as producer:
            producer.publish(first, b"here")
            producer.publish(second, b"forwarded")
    links = [line for line in nsqd.lines if "'client_id': 'nsqd-worker-" in line]
    assert len(links) == 1, links  # one link, kept after the refusal
    assert sorted(consume(nsqd, second, 3)) == [b"forwarded"] * 3


def test_statsd_gets_every_workers_topics_and_each_workers_memory(tmp_path):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(10)
    daemon = start_nsqd(
        tmp_path,
        f"-workers={WORKERS}",
        f"-statsd-address=127.0.0.1:{receiver.getsockname()[1]}",
        "-statsd-interval=200ms",
        "-statsd-prefix=",
    )
    try:
        topics = topics_on_both(2)
        with Producer(tcp(daemon)) as producer:
            for topic in topics:
                producer.publish(topic, b"x")
        wanted = {
            *(f"topic.{topic}.message_count" for topic in topics),
            *(f"worker_{index}.mem.gc_runs" for index in range(WORKERS)),
        }
        seen: set[str] = set()
        while not wanted <= seen:
            packet = receiver.recv(65536).decode()
            seen.update(line.split(":", 1)[0] for line in packet.splitlines())
        assert not any(name.startswith("mem.") for name in seen)
    finally:
        receiver.close()
        assert daemon.stop() == 0, daemon.log


def test_nsqd_started_from_python_gives_its_workers_its_own_flags(tmp_path):
    """`nsqpy.nsqd.__main__.main(argv)` called by a program whose own command line is
    something else: the workers get `argv` (their data path among them), not the program's."""
    data = tmp_path / "data"
    data.mkdir()
    flags = [f"-data-path={data}", "-workers=2", "-tcp-address=127.0.0.1:0"]
    flags.append("-http-address=127.0.0.1:0")
    program = f"from nsqpy.nsqd.__main__ import main; main({flags!r})"
    process = subprocess.Popen(
        [sys.executable, "-c", program], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        address = None
        for line in process.stderr:
            if "TCP: listening on" in line:
                address = line.rsplit(" ", 1)[1].strip()
                break
        assert address is not None
        topics = topics_on_both(2)
        with Producer(address) as producer:
            for topic in topics:
                producer.publish(topic, b"x")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert sorted(topic.name for topic in read_metadata(str(data))) == sorted(topics)
    assert not (tmp_path / "nsqd.dat").exists()


def partitions_open_in_each_worker(daemon, topic: str) -> dict[int, set[int]]:
    """Worker number -> the partitions of `topic` whose queue files the worker has open."""
    opened: dict[int, set[int]] = {}
    pattern = re.compile(rf"/{re.escape(topic)}-(\d+)\.diskqueue\.")
    for pid in worker_pids(daemon):
        partitions = set()
        for descriptor in Path(f"/proc/{pid}/fd").iterdir():
            try:
                found = pattern.search(os.readlink(descriptor))
            except OSError:
                continue  # closed while listed
            if found:
                partitions.add(int(found.group(1)))
        opened[worker_index(pid)] = partitions
    return opened


def partition_stats(daemon, topic: str) -> dict[int, dict]:
    return {
        entry["topic_partition"]: entry
        for entry in stats(daemon, topic=topic)["topics"] or []
        if entry["topic_name"] == topic
    }


def test_a_topics_partitions_go_round_the_workers_and_each_is_served(nsqd):
    http = nsqd.addresses["HTTP"]
    post(http, "/topic/create?topic=spread&partition_num=4")
    owned = {
        worker: {p for p in range(4) if owner_of("spread", p, WORKERS) == worker}
        for worker in range(WORKERS)
    }
    assert owned == {0: {0, 2}, 1: {1, 3}} or owned == {0: {1, 3}, 1: {0, 2}}
    assert partitions_open_in_each_worker(nsqd, "spread") == owned
    assert sorted(partition_stats(nsqd, "spread")) == [0, 1, 2, 3]
    # A channel request that names no partition is for all four, on both workers.
    post(http, "/channel/create?topic=spread&channel=all")
    # Each partition takes Youzan's `PUB topic partition` on a connection whichever worker
    # accepted it, and `/pub?partition=`.
    for partition in range(4):
        connection = V2Connection(nsqd.port("TCP"))
        try:
            for _ in range(3):
                connection.send(encode_command("PUB", "spread", partition, body=b"tcp"))
                assert connection.read_response().data == b"OK"
        finally:
            connection.close()
        post(http, f"/pub?topic=spread&partition={partition}", b"http")
    post(http, "/channel/pause?topic=spread&channel=all")
    for entry in partition_stats(nsqd, "spread").values():
        assert entry["message_count"] == 4
        (channel,) = entry["channels"]
        assert (channel["channel_name"], channel["paused"]) == ("all", True)
    post(http, "/channel/unpause?topic=spread&channel=all")
    for partition in range(4):
        connection = V2Connection(nsqd.port("TCP"))
        try:
            connection.send(encode_command("SUB", "spread", "all", partition))
            assert connection.read_response().data == b"OK"
            connection.send(encode_command("RDY", 10))
            bodies = sorted(message.body for message in connection.read_messages(4))
            assert bodies == [b"http", b"tcp", b"tcp", b"tcp"], partition
        finally:
            connection.close()
    # Answers about every partition joined as one nsqd's.
    offsets = get_json(http, "/partition/offsets?topic=spread")
    assert [entry["partition"] for entry in offsets["partitions"]] == [0, 1, 2, 3]
    assert all(entry["end"]["count"] == 4 for entry in offsets["partitions"])
    text = request(http, "GET", "/message/stats?topic=spread&channel=all").body.decode()
    assert text.count("all") >= 4, text
    # Refusals as one nsqd's: what no worker has is not found, a bad request is bad once.
    missing = request(http, "POST", "/channel/delete?topic=spread&channel=none")
    assert (missing.status, missing.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})
    missing = request(http, "POST", "/channel/delete?topic=none&channel=none")
    assert (missing.status, missing.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
    post(http, "/topic/delete?topic=spread")
    assert partition_stats(nsqd, "spread") == {}


def test_a_partition_is_where_its_worker_left_it_after_a_restart(tmp_path):
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}")
    http = daemon.addresses["HTTP"]
    post(http, "/topic/create?topic=kept&partition_num=4")
    post(http, "/channel/create?topic=kept&channel=c")
    for partition in range(4):
        post(http, f"/pub?topic=kept&partition={partition}", b"%d" % partition)
    assert daemon.stop() == 0, daemon.log
    saved = [(t.name, t.partition) for t in read_metadata(str(tmp_path))]
    assert sorted(saved) == [("kept", p) for p in range(4)]
    restarted = start_nsqd(tmp_path, f"-workers={WORKERS}")
    try:
        kept = partition_stats(restarted, "kept")
        assert {p: [c["depth"] for c in e["channels"]] for p, e in kept.items()} == {
            p: [1] for p in range(4)
        }
        assert partitions_open_in_each_worker(restarted, "kept") == {
            worker: {p for p in range(4) if owner_of("kept", p, WORKERS) == worker}
            for worker in range(WORKERS)
        }
    finally:
        assert restarted.stop() == 0, restarted.log


def test_youzans_internal_create_topic_makes_each_partition_on_its_worker(nsqd):
    connection = V2Connection(nsqd.port("TCP"))
    try:
        for partition in range(4):
            connection.send(encode_command("INTERNAL_CREATE_TOPIC", "made", partition))
            assert connection.read_response().data == b"OK"
    finally:
        connection.close()
    assert partitions_open_in_each_worker(nsqd, "made") == {
        worker: {p for p in range(4) if owner_of("made", p, WORKERS) == worker}
        for worker in range(WORKERS)
    }


def test_closed_connections_leave_no_connection_object_on_any_worker(tmp_path, certs):
    """Consumers of ephemeral channels and producers, plain, TLS, snappy and deflate, on
    topics of both workers (so that some move to the other worker, their socket handed over,
    and some publishes are forwarded), each closed cleanly or reset: once every client has
    gone, no worker holds a connection object of one (`/debug/connections`). The workers run
    with nsqd's collector thresholds, under which a cycle would wait for many more
    allocations than these connections make (tests/nsqd/test_connection_lifetime.py holds
    one process to it with the collector off)."""
    from tests.nsqd.connection_churn import churn

    daemon = start_nsqd(
        tmp_path, f"-workers={WORKERS}", *certs.tls_flags(), wait_for=("TCP", "HTTP", "HTTPS")
    )
    try:
        port = int(tcp(daemon).rsplit(":", 1)[1])
        churn(port, certs, topics_on_both(4, prefix="life"), rounds=3)

        def counted() -> dict:
            return get_json(daemon.addresses["HTTP"], "/debug/connections")

        poll(lambda: counted()["clients"] == 0, lambda: f"every client gone: {counted()}")
        assert counted() == {"clients": 0, "connections": 0}
    finally:
        assert daemon.stop() == 0, daemon.log
