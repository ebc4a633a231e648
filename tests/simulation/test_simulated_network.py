"""The simulator's network (`nsqpy/simulated_network.py`) behaves as the faults it models
say: cut links hold what is sent until they heal, a one-way cut holds one direction, a
crashed host's connections reset after what it had sent, a restarted host binds its ports
again, and an HTTP call is answered by a daemon's own HTTP server over it."""

import logging
import random
from functools import partial

import pytest
import trio
import trio.testing

from nsqpy import network
from nsqpy.daemon.http_server import Router, serve_http, text_response
from nsqpy.etcd import SOCKETS
from nsqpy.simulated_network import FIRST_PORT, SimulatedNetwork


def make_network() -> SimulatedNetwork:
    return SimulatedNetwork(SOCKETS, random.Random(1))


async def connected(net: SimulatedNetwork, a: str, b: str):
    listener = net.listen(b, 0)
    client = await net.connect(a, b, listener.address[1])
    server = await listener.accept()
    return listener, client, server


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_what_is_sent_over_a_cut_arrives_when_it_heals(autojump_clock):
    net = make_network()
    _listener, client, server = await connected(net, "a", "b")
    net.cut("a", "b")
    await client.send_all(b"held")
    with trio.move_on_after(10) as waited:
        await server.receive_some()
    assert waited.cancelled_caught
    started = trio.current_time()
    net.uncut("a", "b")
    assert await server.receive_some() == b"held"
    assert trio.current_time() - started < 0.01


async def test_a_one_way_cut_holds_one_direction(autojump_clock):
    net = make_network()
    _listener, client, server = await connected(net, "a", "b")
    net.cut("a", "b", one_way=True)
    await server.send_all(b"back")
    assert await client.receive_some() == b"back"
    await client.send_all(b"there")
    with trio.move_on_after(5) as waited:
        await server.receive_some()
    assert waited.cancelled_caught


async def test_overlapping_cuts_heal_one_at_a_time(autojump_clock):
    net = make_network()
    net.cut("a", "b")
    net.cut("a", "b", one_way=True)
    net.uncut("a", "b")
    assert net.is_cut("a", "b") and not net.is_cut("b", "a")
    net.uncut("a", "b", one_way=True)
    assert not net.is_cut("a", "b")


async def test_a_new_connection_over_a_cut_waits_for_it_to_heal(autojump_clock):
    net = make_network()
    listener = net.listen("b", 0)
    net.cut("b", "a", one_way=True)
    with trio.move_on_after(30) as waited:
        await net.connect("a", "b", listener.address[1])
    assert waited.cancelled_caught


async def test_connecting_where_nothing_listens_is_refused(autojump_clock):
    net = make_network()
    with pytest.raises(ConnectionRefusedError):
        await net.connect("a", "b", 4150)


async def test_a_crashed_host_resets_its_connections_after_what_it_sent(autojump_clock):
    net = make_network()
    listener, client, server = await connected(net, "a", "b")
    await server.send_all(b"last words")
    net.crash("b")
    assert await client.receive_some() == b"last words"
    with pytest.raises(trio.BrokenResourceError):
        await client.receive_some()
    with pytest.raises(trio.BrokenResourceError):
        await client.send_all(b"anyone?")
    # Its listener went with it; nothing it still runs reaches anyone.
    with pytest.raises(ConnectionRefusedError):
        await net.connect("a", "b", listener.address[1])
    with pytest.raises(OSError):
        await net.connect("b", "a", 1)


async def test_a_restarted_host_binds_the_ports_it_had(autojump_clock):
    net = make_network()
    first = [net.listen("b", 0).address for _ in range(3)]
    assert first == [("b", FIRST_PORT), ("b", FIRST_PORT + 1), ("b", FIRST_PORT + 2)]
    net.crash("b")
    net.revive("b")
    assert [net.listen("b", 0).address for _ in range(3)] == first


async def test_a_slow_link_delays_in_order(autojump_clock):
    net = make_network()
    _listener, client, server = await connected(net, "a", "b")
    net.slow("a", "b", 0.5)
    started = trio.current_time()
    for index in range(20):
        await client.send_all(b"%d," % index)
    received = b""
    while received.count(b",") < 20:
        received += await server.receive_some()
    assert received == b"".join(b"%d," % index for index in range(20))
    assert trio.current_time() - started > 0.05


async def test_an_http_call_is_answered_by_the_daemons_own_server(autojump_clock):
    net = make_network()
    router = Router()
    router.add("GET", "/ping", lambda request: text_response(200, "OK"))
    async with trio.open_nursery() as nursery:
        with network.using(net.host("b")):
            listener = await network.current().listen("b:0")
        log = logging.getLogger("test")
        nursery.start_soon(partial(serve_http, listener, router, nursery, log, max_body_size=1024))
        client = net.host("a")
        answer = await client.request("GET", f"http://b:{FIRST_PORT}/ping", timeout=1)
        assert answer == (200, b"OK")
        missing = await client.request("GET", f"http://b:{FIRST_PORT}/nothing", timeout=1)
        assert missing.status == 404
        net.cut("a", "b")
        with pytest.raises(TimeoutError):
            await client.request("GET", f"http://b:{FIRST_PORT}/ping", timeout=1)
        nursery.cancel_scope.cancel()
