"""Hostile input on nsqlookupd's TCP port: random bytes and malformed commands, many
connections, seeded and bounded.

The `nsqlookupd` console script runs as a process, so a crash is a dead process. Two good peers
(a classic one and a partitioned one) register before the storm and stay connected through it;
after every batch of hostile connections both must still be in /lookup and /nodes, with their
channels. Some hostile peers identify as the good ones (same broadcast address and ports) and
UNREGISTER their topic: a peer is its connection, so that must change nothing for them. Every
reply the daemon sends must be a well-formed V1 frame, and after an error reply it must close
the connection (docs/protocol.md §4.1).
"""

import json
import random
import socket
import struct

import trio

from nsqpy.common.lookup_protocol import (
    MAGIC_V1,
    LookupClientConnection,
    encode_identify,
    encode_register,
    encode_unregister,
)
from tests.harness import start_nsqlookupd
from tests.nsqlookupd.support import CLASSIC_IDENTIFY, HOST, YOUZAN_IDENTIFY, identified_peer
from tests.support.http import raw_get_json, raw_request

SEED = 20261122
CONNECTIONS = 240
CONCURRENCY = 24
BATCHES = 6
QUIET = 0.2  # a connection the server leaves open is closed after this long without data
CLOSE_DEADLINE = 3.0  # after an error reply, the server must close within this

WORDS = [
    "PING",
    "IDENTIFY",
    "REGISTER",
    "UNREGISTER",
    "good",
    "c",
    "t",
    "ch",
    "0",
    "1",
    "-11",
    "255",
    "x" * 65,
    "bad!",
    "#ephemeral",
    "t#ephemeral",
    "",
    " ",
    "\t",
    "\r",
    "\x00",
    "é",
    "\udcff",
]


def random_line(rng: random.Random) -> bytes:
    words = [rng.choice(WORDS) for _ in range(rng.randint(0, 5))]
    return " ".join(words).encode("utf-8", "surrogateescape") + rng.choice([b"\n", b"\r\n", b""])


def identify_frame(rng: random.Random) -> bytes:
    """IDENTIFY with a size and body that are anything from right to absurd."""
    body = rng.choice(
        [
            json.dumps(rng.choice([CLASSIC_IDENTIFY, YOUZAN_IDENTIFY])).encode(),
            json.dumps({"version": rng.choice(["", "HA", 1, None]), "tcp_port": -1}).encode(),
            b"{" * rng.randint(1, 5000),
            b'{"tcp_port": 1e400, "http_port": [], "broadcast_address": {}}',
            rng.randbytes(rng.randint(0, 300)),
        ]
    )
    size = rng.choice([len(body), len(body) + 10, max(len(body) - 3, 0), -1, 2**31 - 1, 0])
    return b"IDENTIFY\n" + struct.pack(">i", size) + body


def impostor(rng: random.Random) -> bytes:
    """A peer that identifies as a good one and unregisters what it registered."""
    classic = rng.random() < 0.5
    info = CLASSIC_IDENTIFY if classic else YOUZAN_IDENTIFY
    partition = None if classic else 0
    commands = [MAGIC_V1, encode_identify(info)]
    for _ in range(rng.randint(1, 6)):
        encode = rng.choice([encode_register, encode_unregister])
        commands.append(encode("good", rng.choice([None, "c"]), partition))
    commands.append(rng.choice([b"", random_line(rng), rng.randbytes(20)]))
    return b"".join(commands)


def hostile_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:  # no magic at all
        return rng.randbytes(rng.randint(1, 2000))
    if kind == 1:  # magic, then noise
        return MAGIC_V1 + rng.randbytes(rng.randint(1, 2000))
    if kind == 2:  # magic, then plausible lines
        return MAGIC_V1 + b"".join(random_line(rng) for _ in range(rng.randint(1, 20)))
    if kind == 3:
        return MAGIC_V1 + identify_frame(rng) + random_line(rng)
    if kind == 4:
        return impostor(rng)
    if kind == 5:  # identified, then plausible lines in its grammar or the other
        info = rng.choice([CLASSIC_IDENTIFY, YOUZAN_IDENTIFY])
        lines = b"".join(random_line(rng) for _ in range(rng.randint(1, 20)))
        return MAGIC_V1 + encode_identify({**info, "tcp_port": rng.randint(1, 65535)}) + lines
    if kind == 6:  # a line that never ends
        return MAGIC_V1 + b"REGISTER " + b"a" * rng.randint(4000, 20000)
    return MAGIC_V1 + b"PING\n" * rng.randint(1, 500)  # a pipelined burst


def is_well_formed(reply: bytes) -> bool:
    if reply == b"OK" or reply.startswith(b"E_"):
        return True
    try:
        document = json.loads(reply)  # the IDENTIFY reply
    except ValueError:
        return False
    return sorted(document) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]


async def play_hostile(port: int, payload: bytes, rng: random.Random, problems: list[str]) -> None:
    stream = await trio.open_tcp_stream(HOST, port)
    decoder = LookupClientConnection()
    replies: list[bytes] = []
    closed = False
    try:
        # Some payloads go in pieces, some are cut short.
        cut = len(payload) if rng.random() < 0.8 else rng.randint(0, len(payload))
        position = 0
        while position < cut:
            step = rng.choice([1, 7, 64, 4096, cut])
            await stream.send_all(payload[position : min(position + step, cut)])
            position += step
        if rng.random() < 0.2:
            await stream.send_eof()
        while not closed:
            quiet = CLOSE_DEADLINE if any(r.startswith(b"E_") for r in replies) else QUIET
            data = None
            with trio.move_on_after(quiet):
                data = await stream.receive_some(65536)
            if data is None:
                break  # quiet: the server is waiting for more
            closed = not data
            replies.extend(decoder.receive_data(data))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        closed = True
    except Exception as error:  # a malformed frame
        problems.append(f"{payload[:60]!r}: {error!r}")
    finally:
        if rng.random() < 0.3:  # leave with a reset instead of a FIN
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()
    bad = [reply for reply in replies if not is_well_formed(reply)]
    if bad:
        problems.append(f"{payload[:60]!r}: malformed replies {bad[:3]!r}")
    if any(reply.startswith(b"E_") for reply in replies) and not closed:
        problems.append(f"{payload[:60]!r}: left open after {replies[-1]!r}")


async def good_peers_registered(http_port: int, peers) -> None:
    document = await raw_get_json(http_port, "/lookup?topic=good")
    producers = {producer["remote_address"] for producer in document["producers"]}
    assert {peer.local_address for peer in peers} <= producers, document
    assert "c" in document["channels"]
    assert "0" in document["partitions"]
    nodes = await raw_get_json(http_port, "/nodes")
    listed = {node["remote_address"] for node in nodes["producers"]}
    assert {peer.local_address for peer in peers} <= listed


async def test_hostile_peers_never_kill_nsqlookupd_nor_touch_good_peers():
    daemon = await trio.to_thread.run_sync(start_nsqlookupd)
    tcp_port, http_port = daemon.port("TCP"), daemon.port("HTTP")
    try:
        classic = await identified_peer(tcp_port, CLASSIC_IDENTIFY)
        await classic.register("good", "c")
        youzan = await identified_peer(tcp_port, YOUZAN_IDENTIFY)
        await youzan.register("good", "c", partition=0)
        good = [classic, youzan]
        await good_peers_registered(http_port, good)

        rng = random.Random(SEED)
        payloads = [hostile_payload(rng) for _ in range(CONNECTIONS)]
        seeds = [rng.getrandbits(32) for _ in range(CONNECTIONS)]
        problems: list[str] = []
        limiter = trio.CapacityLimiter(CONCURRENCY)

        async def hostile(index: int) -> None:
            async with limiter:
                await play_hostile(tcp_port, payloads[index], random.Random(seeds[index]), problems)

        per_batch = CONNECTIONS // BATCHES
        with trio.fail_after(60):
            for batch in range(BATCHES):
                async with trio.open_nursery() as nursery:
                    for index in range(batch * per_batch, (batch + 1) * per_batch):
                        nursery.start_soon(hostile, index)
                assert daemon.process.poll() is None, daemon.log
                await good_peers_registered(http_port, good)

            # Many idle connections at once, then all gone.
            streams = []
            for _ in range(200):
                stream = await trio.open_tcp_stream(HOST, tcp_port)
                await stream.send_all(MAGIC_V1)
                streams.append(stream)
            await good_peers_registered(http_port, good)
            for stream in streams:
                await stream.aclose()

        assert problems == []
        # The good peers' own connections still work, and so does the HTTP side.
        for peer in good:
            await peer.ping()
        await good_peers_registered(http_port, good)
        reply = await raw_request(http_port, "GET", "/ping")
        assert (reply.status, reply.body) == (200, b"OK")
        for peer in good:
            await peer.aclose()
    finally:
        alive = daemon.process.poll() is None
        returncode = await trio.to_thread.run_sync(daemon.stop)
    assert alive, daemon.log
    assert returncode == 0, daemon.log
    for marker in ("Traceback", "internal error"):
        assert marker not in daemon.log, daemon.log[-5000:]
