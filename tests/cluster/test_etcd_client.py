"""nsqpy/etcd.py: the codec without a server, then every call against a real etcd 3.4 on
127.0.0.1 (tests/cluster/etcd_server.py), including its restarts, kills and pauses."""

import base64
import http.client
import json
import time

import httptools
import pytest
import trio

from nsqpy.common.http_response import ResponseParser
from nsqpy.etcd import (
    EtcdClient,
    EtcdCompacted,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaseLost,
    LineSplitter,
    WatchEvent,
    decode_answer,
    decode_kv,
    decode_range,
    decode_stream_line,
    decode_txn,
    decode_watch,
    encode_request,
    keep_lease_alive,
    key_range,
    prefix_range_end,
    put_request,
    txn_request,
    watch_request,
)
from nsqpy.etcd_model import EtcdModel
from nsqpy.etcd_model_network import ModelNetwork
from tests.cluster.etcd_server import EtcdServer, free_port, summary, take
from tests.support.polling import wait_until

# The shortest lease of the test etcd (3/2 of its 250 ms election timeout, rounded up).
TEST_ETCD_MINIMUM_TTL = 1


@pytest.fixture
async def etcd(request, nursery):
    """An EtcdClient on a real etcd, or (`on_etcd_and_its_model`) on the etcd model over
    its in-memory network: the same client, the same assertions."""
    if getattr(request, "param", "etcd") == "model":
        network = ModelNetwork(EtcdModel(minimum_ttl=TEST_ETCD_MINIMUM_TTL), nursery)
        await nursery.start(network.run)
        async with EtcdClient(["http://etcd-model:2379"], network=network) as client:
            yield client
        return
    server = request.getfixturevalue("etcd_server")
    async with EtcdClient([server.client_url]) as client:
        yield client


# A test of the client's semantics alone runs on real etcd and on the model (which
# tests/cluster/test_etcd_model_contract.py holds to etcd request by request).
on_etcd_and_its_model = pytest.mark.parametrize("etcd", ["etcd", "model"], indirect=True)

# Answers as etcd 3.4's gateway wrote them (int64 as strings, zero fields left out).
HEADER = {"cluster_id": "324952591200643719", "member_id": "3319814642761637952"}
RANGE_ANSWER = {
    "header": {**HEADER, "revision": "3", "raft_term": "2"},
    "kvs": [
        {
            "key": "Zm9v",
            "create_revision": "2",
            "mod_revision": "3",
            "version": "2",
            "value": "YmFy",
            "lease": "2324035606246973458",
        }
    ],
    "count": "1",
}
WATCH_LINES = (
    b'{"result":{"header":{"revision":"7"},"created":true}}\n'
    b'{"result":{"header":{"revision":"8"},"events":[{"kv":{"key":"YTE=",'
    b'"create_revision":"8","mod_revision":"8","version":"1","value":"MQ=="}}]}}\n'
    b'{"result":{"header":{"revision":"10"},"events":[{"type":"DELETE","kv":{"key":"YTE=",'
    b'"mod_revision":"10"}},{"type":"DELETE","kv":{"key":"YTI=","mod_revision":"10"}}]}}\n'
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- codec ----------------------------------------------------------------------------------


def test_prefix_range_end_is_the_first_key_past_the_prefix():
    assert prefix_range_end(b"nodes/") == b"nodes0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"a\xff\xff") == b"b"
    # Every key: etcd reads range_end "\0" as "to the end".
    assert prefix_range_end(b"") == b"\0"
    assert prefix_range_end(b"\xff") == b"\0"


def test_request_bodies_are_base64_with_int64_as_strings():
    assert key_range("k") == {"key": b64("k")}
    assert key_range("a/", prefix=True) == {"key": b64("a/"), "range_end": b64("a0")}
    assert put_request("k", "v") == {"key": b64("k"), "value": b64("v")}
    assert put_request("k", b"\x00\xff", lease=7) == {
        "key": b64("k"),
        "value": "AP8=",
        "lease": "7",
    }
    assert txn_request("k", "MOD", 12, {"request_delete_range": key_range("k")}) == {
        "compare": [{"key": b64("k"), "target": "MOD", "result": "EQUAL", "mod_revision": "12"}],
        "success": [{"request_delete_range": {"key": b64("k")}}],
    }
    create = txn_request("k", "CREATE", 0, {})["compare"][0]
    assert create["target"] == "CREATE" and create["create_revision"] == "0"
    assert watch_request("a/", 5) == {
        "create_request": {"key": b64("a/"), "range_end": b64("a0"), "start_revision": "5"}
    }
    assert "start_revision" not in watch_request("a/", 0)["create_request"]


def test_encoded_request_is_one_well_formed_http_post():
    class Events:
        def __init__(self):
            self.headers, self.body, self.url, self.complete = {}, b"", b"", False

        def on_url(self, url):
            self.url += url

        def on_header(self, name, value):
            self.headers[name.decode().lower()] = value.decode()

        def on_body(self, body):
            self.body += body

        def on_message_complete(self):
            self.complete = True

    events = Events()
    parser = httptools.HttpRequestParser(events)
    parser.feed_data(encode_request("127.0.0.1:2379", "/v3/kv/put", put_request("k", "é")))
    assert events.complete and parser.get_method() == b"POST" and events.url == b"/v3/kv/put"
    assert events.headers["host"] == "127.0.0.1:2379"
    assert parser.should_keep_alive()
    assert json.loads(events.body) == {"key": b64("k"), "value": b64("é")}


def test_decoding_keys_and_ranges():
    kvs, revision = decode_range(RANGE_ANSWER)
    assert revision == 3
    assert kvs == [KeyValue("foo", b"bar", 2, 3, 2, 2324035606246973458)]
    # Zero fields are left out; a key that is not UTF-8 round-trips through str.
    assert decode_kv({"key": base64.b64encode(b"k\xff").decode()}) == KeyValue(
        "k\udcff", b"", 0, 0, 0, 0
    )
    assert decode_range({"header": {"revision": "9"}}) == ([], 9)
    assert decode_txn({"header": {"revision": "4"}, "succeeded": True}) == (True, 4)
    assert decode_txn({"header": {"revision": "4"}}) == (False, 4)


def test_decoding_a_watch_stream_split_anywhere():
    splitter = LineSplitter()
    lines = []
    for index in range(0, len(WATCH_LINES), 7):
        lines += splitter.feed(WATCH_LINES[index : index + 7])
    created, put, deletes = (decode_watch(decode_stream_line(line)) for line in lines)
    assert created.created and created.revision == 7 and not created.events
    assert put.events == [WatchEvent("PUT", KeyValue("a1", b"1", 8, 8, 1, 0))]
    assert [(event.kind, event.kv.key, event.kv.mod_revision) for event in deletes.events] == [
        ("DELETE", "a1", 10),
        ("DELETE", "a2", 10),
    ]
    canceled = decode_watch({"header": {}, "canceled": True, "compact_revision": "9"})
    assert canceled.canceled and canceled.compact_revision == 9


def test_decoding_errors():
    with pytest.raises(EtcdError, match="requested lease not found") as raised:
        decode_answer(404, b'{"error":"etcdserver: requested lease not found","code":5}')
    assert raised.value.code == 5 and not isinstance(raised.value, EtcdUnavailable)
    with pytest.raises(EtcdUnavailable, match="no leader"):
        decode_answer(
            503, (b'{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}')
        )
    with pytest.raises(EtcdUnavailable, match="HTTP 502"):
        decode_answer(502, b"Bad Gateway")
    # Streaming RPCs report errors inside a 200 answer, in grpc-gateway's stream form.
    stream_error = b'{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}}'
    with pytest.raises(EtcdUnavailable, match="no leader"):
        decode_stream_line(stream_error)
    assert decode_stream_line(b'{"result":{"ID":"1","TTL":"5"}}') == {"ID": "1", "TTL": "5"}


def test_response_parser_reads_a_chunked_answer_with_a_trailer_byte_by_byte():
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Trailer: Grpc-Trailer-Content-Type\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'13\r\n{"result":{"ID":"1"\r\n2\r\n}}\r\n1\r\n\n\r\n'
        b"0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n"
    )
    parser = ResponseParser()
    for index in range(len(answer)):
        assert not parser.complete
        parser.feed(answer[index : index + 1])
    assert parser.complete and parser.status == 200 and parser.keep_alive
    assert parser.take_body() == b'{"result":{"ID":"1"}}\n'


# --- keys -----------------------------------------------------------------------------------


@on_etcd_and_its_model
async def test_put_get_and_delete(etcd):
    first = await etcd.put("k", "one")
    kv = await etcd.get("k")
    assert kv == KeyValue("k", b"one", first, first, 1, 0)
    second = await etcd.put("k", b"\x00two")
    assert second > first
    assert await etcd.get("k") == KeyValue("k", b"\x00two", first, second, 2, 0)
    assert await etcd.get("missing") is None
    assert await etcd.delete("k") == 1
    assert await etcd.delete("k") == 0
    assert await etcd.get("k") is None


@on_etcd_and_its_model
async def test_prefixes(etcd):
    await etcd.put("nodes/b", "2")
    await etcd.put("nodes/a", "1")
    await etcd.put("nodes0", "not under nodes/")
    latest = await etcd.put("topics/t", "t")
    kvs, revision = await etcd.get_prefix("nodes/")
    assert [(kv.key, kv.value) for kv in kvs] == [("nodes/a", b"1"), ("nodes/b", b"2")]
    assert revision == latest
    assert await etcd.delete_prefix("nodes/") == 2
    assert await etcd.get_prefix("nodes/") == ([], revision + 1)
    assert (await etcd.get("nodes0")).value == b"not under nodes/"


@on_etcd_and_its_model
async def test_create_only_if_absent(etcd):
    revision = await etcd.create("leader", "node-1")
    assert revision
    assert await etcd.create("leader", "node-2") == 0
    kv = await etcd.get("leader")
    assert (kv.value, kv.create_revision, kv.mod_revision) == (b"node-1", revision, revision)


@on_etcd_and_its_model
async def test_replace_is_compare_and_swap_on_mod_revision(etcd):
    first = await etcd.put("replica", "epoch 1")
    second = await etcd.replace("replica", "epoch 2", first)
    assert second > first
    assert await etcd.replace("replica", "stale writer", first) == 0
    assert (await etcd.get("replica")).value == b"epoch 2"
    assert await etcd.replace("missing", "x", first) == 0
    assert await etcd.get("missing") is None


@on_etcd_and_its_model
async def test_delete_if_is_compare_and_delete_on_mod_revision(etcd):
    first = await etcd.put("session", "a")
    second = await etcd.put("session", "b")
    assert not await etcd.delete_if("session", first)
    assert (await etcd.get("session")).value == b"b"
    assert await etcd.delete_if("session", second)
    assert await etcd.get("session") is None
    assert not await etcd.delete_if("session", second)


# --- leases ---------------------------------------------------------------------------------


@on_etcd_and_its_model
async def test_lease_keys_go_with_a_revoke(etcd):
    lease = await etcd.grant_lease(30)
    await etcd.put("nodes/1", "info", lease=lease)
    assert (await etcd.get("nodes/1")).lease == lease
    assert 0 < await etcd.keep_alive_once(lease) <= 30
    await etcd.revoke(lease)
    assert await etcd.get("nodes/1") is None
    assert await etcd.keep_alive_once(lease) == 0
    await etcd.revoke(lease)  # already gone: no error


@on_etcd_and_its_model
async def test_kept_alive_lease_outlives_its_ttl_and_expires_once_let_go(etcd):
    lease = await etcd.grant_lease(1)
    await etcd.put("nodes/1", "info", lease=lease)
    with trio.move_on_after(2.5):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_lease_alive, etcd, lease, 1)
            # Over two TTLs: only the refreshes every 1/3 s keep the key.
            await trio.sleep_forever()
    assert await etcd.get("nodes/1") is not None

    async def gone() -> bool:
        return await etcd.get("nodes/1") is None

    with trio.fail_after(5):
        while not await gone():
            await trio.sleep(0.05)


@on_etcd_and_its_model
async def test_keep_lease_alive_raises_when_the_lease_is_revoked(etcd):
    lease = await etcd.grant_lease(1)
    with trio.fail_after(5), pytest.RaisesGroup(pytest.RaisesExc(LeaseLost, match="is gone")):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_lease_alive, etcd, lease, 1)
            await etcd.revoke(lease)
    with pytest.raises(LeaseLost, match="is gone"):
        await keep_lease_alive(etcd, lease, 1)


async def test_keep_lease_alive_gives_up_when_etcd_answers_nothing_for_a_ttl(etcd, etcd_server):
    """And says etcd is unreachable: the refresh's own attempt (1 s) outlasts what is left
    of a 1 s lease, so no attempt of its own ran out to say it."""
    lease = await etcd.grant_lease(1)
    try:
        with trio.fail_after(5), pytest.RaisesGroup(pytest.RaisesExc(LeaseLost, match="within")):
            async with trio.open_nursery() as nursery:
                await nursery.start(keep_lease_alive, etcd, lease, 1)
                etcd_server.pause()
        assert not etcd.health.reachable
        assert "lease's TTL" in etcd.health.error
    finally:
        etcd_server.resume()


async def test_keep_lease_alive_gives_up_when_its_own_process_did_not_run_for_a_ttl(etcd):
    """A holder frozen past its TTL (SIGSTOP, here the event loop blocked) wakes up to
    LeaseLost, whatever etcd would say: what the lease guarded may be someone else's now."""
    lease = await etcd.grant_lease(1)
    with trio.fail_after(5), pytest.RaisesGroup(pytest.RaisesExc(LeaseLost, match="within")):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_lease_alive, etcd, lease, 1)
            time.sleep(2.5)  # the whole process stands still, as under SIGSTOP


# --- watch ----------------------------------------------------------------------------------


@on_etcd_and_its_model
async def test_watch_from_a_revision_sees_puts_and_deletes_in_order(etcd):
    await etcd.put("w/before", "not seen")
    _, revision = await etcd.get_prefix("w/")
    await etcd.put("w/1", "a")
    await etcd.put("other/1", "not under w/")
    await etcd.put("w/2", "b")
    await etcd.put("w/1", "c")
    await etcd.delete_prefix("w/")
    async with etcd.watch_prefix("w/", revision + 1) as watch:
        events = await take(watch, 6)
        assert summary(events) == [
            ("PUT", "w/1", b"a"),
            ("PUT", "w/2", b"b"),
            ("PUT", "w/1", b"c"),
            # One delete_prefix: one revision, in key order.
            ("DELETE", "w/1", b""),
            ("DELETE", "w/2", b""),
            ("DELETE", "w/before", b""),
        ]
        assert events[2].kv.version == 2 and events[3].kv.mod_revision == events[5].kv.mod_revision
        # Live events follow the history.
        revision = await etcd.put("w/3", "d")
        [live] = await take(watch, 1)
        assert summary([live]) == [("PUT", "w/3", b"d")] and live.kv.mod_revision == revision
        assert watch.revision == revision + 1


async def test_watch_resumes_after_a_kill_from_the_revision_after_its_last_event(etcd, etcd_server):
    async with etcd.watch_prefix("w/", 0) as watch:
        await watch.open()
        await etcd.put("w/1", "a")
        assert summary(await take(watch, 1)) == [("PUT", "w/1", b"a")]
        # Not reading meanwhile: these reach the watch only by its re-open from a revision.
        etcd_server.kill()
        etcd_server.start()
        await etcd.put("w/2", "b")
        await etcd.delete("w/1")
        assert summary(await take(watch, 2)) == [("PUT", "w/2", b"b"), ("DELETE", "w/1", b"")]


async def test_watch_misses_and_repeats_nothing_across_a_restart_while_iterating(etcd, etcd_server):
    seen: list[WatchEvent] = []

    async def collect(watch) -> None:
        async for event in watch:
            seen.append(event)

    async with etcd.watch_prefix("w/", 0) as watch, trio.open_nursery() as nursery:
        await watch.open()
        nursery.start_soon(collect, watch)
        await etcd.put("w/1", "a")
        await wait_until(lambda: len(seen) == 1)
        await trio.to_thread.run_sync(etcd_server.restart)
        for value in "bcd":
            await etcd.put("w/1", value)
        await wait_until(lambda: len(seen) == 4)
        nursery.cancel_scope.cancel()
    assert summary(seen) == [("PUT", "w/1", value.encode()) for value in "abcd"]
    assert [event.kv.version for event in seen] == [1, 2, 3, 4]


@on_etcd_and_its_model
async def test_watch_is_cancellable_and_closes_its_connection(etcd):
    async with etcd.watch_prefix("quiet/", 0) as watch:
        # Opened first: "from now" is when etcd created it (a wait cancelled before that
        # would leave "now" for the next wait to fix).
        await watch.open()
        with trio.move_on_after(0.1) as scope:
            await anext(watch)
        assert scope.cancelled_caught
        # Still usable after a cancelled wait.
        await etcd.put("quiet/1", "x")
        assert summary(await take(watch, 1)) == [("PUT", "quiet/1", b"x")]
    assert watch._connection is None
    with pytest.raises(StopAsyncIteration):
        await anext(watch)


async def test_watch_from_a_compacted_revision_raises(etcd, etcd_server):
    first = await etcd.put("w/1", "a")
    await etcd.put("w/1", "b")
    latest = await etcd.put("w/1", "c")
    post(etcd_server, "/v3/kv/compaction", {"revision": str(latest)})
    with pytest.raises(EtcdCompacted, match="compacted") as raised:
        async with etcd.watch_prefix("w/", first) as watch:
            await take(watch, 1)
    assert raised.value.compact_revision == latest


async def test_following_a_prefix_outlives_an_etcd_away_when_the_watch_opens(etcd, etcd_server):
    """A daemon follows its keys for good: an etcd away when the watch opens (nsqd exited
    over it in a chaos run) is told to `failed` and the watch opened again from where it
    was, so nothing in between is missed."""
    seen: list[WatchEvent] = []
    failures: list[EtcdError] = []

    async def reload() -> int:
        raise AssertionError("nothing was compacted: no read again")

    revision = await etcd.put("fp/0", "a")
    async with EtcdClient([etcd_server.client_url], timeout=1) as client:
        etcd_server.kill()
        async with trio.open_nursery() as nursery:
            follow = client.follow_prefix
            nursery.start_soon(follow, "fp/", revision + 1, seen.append, reload, failures.append)
            await wait_until(lambda: len(failures) >= 2)
            await trio.to_thread.run_sync(etcd_server.start)
            await etcd.put("fp/1", "b")
            await wait_until(lambda: len(seen) == 1)
            nursery.cancel_scope.cancel()
    assert summary(seen) == [("PUT", "fp/1", b"b")]
    assert all(isinstance(failure, EtcdUnavailable) for failure in failures)


async def test_following_a_compacted_prefix_reads_it_again_and_goes_on(etcd, etcd_server):
    first = await etcd.put("fc/1", "a")
    latest = await etcd.put("fc/1", "b")
    post(etcd_server, "/v3/kv/compaction", {"revision": str(latest)})
    seen: list[WatchEvent] = []
    failures: list[EtcdError] = []
    reads: list[int] = []

    async def reload() -> int:
        _kvs, revision = await etcd.get_prefix("fc/")
        reads.append(revision)
        return revision

    async with trio.open_nursery() as nursery:
        nursery.start_soon(etcd.follow_prefix, "fc/", first, seen.append, reload, failures.append)
        await wait_until(lambda: reads)
        await etcd.put("fc/1", "c")
        await wait_until(lambda: len(seen) == 1)
        nursery.cancel_scope.cancel()
    assert summary(seen) == [("PUT", "fc/1", b"c")]
    assert [type(failure) for failure in failures] == [EtcdCompacted]


def post(server: EtcdServer, path: str, body: dict) -> dict:
    """A call the client does not offer (compaction), straight to the gateway."""
    connection = http.client.HTTPConnection("127.0.0.1", server.client_port, timeout=5)
    try:
        connection.request("POST", path, json.dumps(body))
        response = connection.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        connection.close()


# --- endpoints, failures --------------------------------------------------------------------


def dead_endpoint() -> str:
    """A URL on a port nothing listens on: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"


async def test_failover_past_a_dead_endpoint(etcd_server):
    async with EtcdClient([dead_endpoint(), etcd_server.client_url], timeout=2) as client:
        revision = await client.put("k", "v")
        assert (await client.get("k")).mod_revision == revision
        assert await client.create("k2", "v")
        async with client.watch_prefix("k", revision) as watch:
            assert summary(await take(watch, 2)) == [("PUT", "k", b"v"), ("PUT", "k2", b"v")]


async def test_no_endpoint_answering_is_one_clear_error_at_once():
    endpoints = [dead_endpoint(), dead_endpoint()]
    async with EtcdClient(endpoints, timeout=5) as client:
        with trio.fail_after(1), pytest.raises(EtcdUnavailable) as raised:
            await client.put("k", "v")
        message = str(raised.value)
        assert "\n" not in message and "/v3/kv/put" in message
        assert all(f"{url} connect failed" in message for url in endpoints)
        with trio.fail_after(1), pytest.raises(EtcdUnavailable, match="watch"):
            await client.watch_prefix("k", 0).open()


async def test_a_call_to_a_paused_etcd_times_out(etcd_server):
    async with EtcdClient([etcd_server.client_url], timeout=0.5) as client:
        # A loaded machine's etcd can take longer than 0.5 s to answer while running: the test
        # is of a paused one.
        with trio.fail_after(20):
            while True:
                try:
                    await client.put("k", "v")
                    break
                except EtcdUnavailable:
                    continue
        etcd_server.pause()
        try:
            with trio.fail_after(3):
                with pytest.raises(EtcdUnavailable, match="no answer within 0.5 s"):
                    await client.get("k")
                # A transaction that may have reached etcd is not sent again.
                with pytest.raises(EtcdUnavailable, match="may have applied it"):
                    await client.create("k2", "v")
        finally:
            etcd_server.resume()
        assert (await client.get("k")).value == b"v"


async def test_the_client_works_again_once_etcd_is_back(etcd, etcd_server):
    await etcd.put("k", "before")
    etcd_server.kill()
    with pytest.raises(EtcdUnavailable, match="connect failed"):
        await etcd.get("k")
    etcd_server.start()
    assert (await etcd.get("k")).value == b"before"
    # The pooled connection died with the restart; a transaction must not be lost to it.
    etcd_server.restart()
    assert await etcd.create("k2", "after")


def test_endpoints_must_be_http_or_https_urls():
    with pytest.raises(ValueError, match="expected http://HOST:PORT or https://HOST:PORT"):
        EtcdClient(["unix:///run/etcd.sock"])
    assert EtcdClient(["https://127.0.0.1:2379"]).endpoints == ["https://127.0.0.1:2379"]
    with pytest.raises(ValueError, match="at least one"):
        EtcdClient([])


async def test_read_prefix_asks_again_until_etcd_answers_and_says_why_each_time(etcd_server):
    """A daemon's first read of what it then watches: each failure goes to `failed`, and the
    read is asked again; with etcd answering, the keys and their revision, no failure."""
    failures: list[EtcdError] = []

    class Enough(Exception):
        pass

    def failed(error: EtcdError) -> None:
        failures.append(error)
        if len(failures) == 2:
            raise Enough

    async with EtcdClient([dead_endpoint()], timeout=1) as client:
        with pytest.raises(Enough):
            await client.read_prefix("rp/", failed, retry=0.01)
    assert len(failures) == 2 and all(isinstance(e, EtcdUnavailable) for e in failures)
    async with EtcdClient([etcd_server.client_url], timeout=2) as client:
        revision = await client.put("rp/a", "1")
        kvs, read_at = await client.read_prefix("rp/", failed)
        assert [(kv.key, kv.value) for kv in kvs] == [("rp/a", b"1")] and read_at >= revision
    assert len(failures) == 2


async def test_the_model_keeps_and_expires_leases_on_a_virtual_clock(nursery, autojump_clock):
    """Under a simulation's clock the production client and the model take no real time: a
    60 s lease kept alive for ten virtual minutes keeps its key, and let go, the key is gone
    within 60 s, seen by a watch as a DELETE at the revision after the put."""
    network = ModelNetwork(EtcdModel(), nursery)
    await nursery.start(network.run)
    async with EtcdClient(["http://etcd-model:2379"], network=network) as client:
        lease = await client.grant_lease(60)
        put = await client.put("nodes/1", "info", lease=lease)
        with trio.move_on_after(600):
            await keep_lease_alive(client, lease, 60)
        assert await client.get("nodes/1") is not None
        let_go = trio.current_time()
        async with client.watch_prefix("nodes/", put + 1) as watch:
            with trio.fail_after(120):
                gone = await anext(watch)
        assert summary([gone]) == [("DELETE", "nodes/1", b"")]
        assert gone.kv.mod_revision == put + 1
        # Within a TTL of its last refresh (one every 20 s while it was kept).
        assert 0 < trio.current_time() - let_go <= 60


async def model_members(nursery, count: int) -> tuple[ModelNetwork, list[str]]:
    """The etcd model reached at `count` member URLs, its lease clock running."""
    network = ModelNetwork(EtcdModel(minimum_ttl=TEST_ETCD_MINIMUM_TTL), nursery)
    await nursery.start(network.run)
    return network, [f"http://etcd-{number}:2379" for number in range(count)]


async def test_on_the_model_a_member_down_or_paused_is_left_for_the_next(nursery, autojump_clock):
    """The client's failover on a virtual clock: a member refusing connections is passed at
    once; a paused one (connections accepted, nothing answered) after `attempt_timeout`;
    each said in the health, and the member answers again once resumed."""
    network, members = await model_members(nursery, 2)
    async with EtcdClient(members, attempt_timeout=1.0, network=network) as client:
        await client.put("k", "1")
        network.refuse(members[0])
        started = trio.current_time()
        await client.put("k", "2")
        assert trio.current_time() - started < 0.5
        assert members[0] in client.health.failing
        network.resume(members[0])
        network.pause(members[1])  # the member that answered last, tried first
        started = trio.current_time()
        assert (await client.get("k")).value == b"2"
        assert 1.0 <= trio.current_time() - started < 1.5
        assert "no answer within" in client.health.failing[members[1]][1]
        network.resume(members[1])


async def test_on_the_model_a_watch_leaves_a_paused_member(nursery, autojump_clock):
    """A watch whose member stops answering asks it for a read after a silent second, gets
    none, and goes on from its revision on another member: nothing missed or repeated."""
    network, members = await model_members(nursery, 2)
    async with EtcdClient(members, attempt_timeout=1.0, network=network) as client:
        async with client.watch_prefix("w/", 0) as watch:
            await watch.open()
            await client.put("w/1", "a")
            assert summary([await anext(watch)]) == [("PUT", "w/1", b"a")]
            network.pause(members[0])
            await client.put("w/2", "b")  # after a timeout, on the other member
            with trio.fail_after(10):
                event = await anext(watch)
            assert summary([event]) == [("PUT", "w/2", b"b")]
            network.resume(members[0])
