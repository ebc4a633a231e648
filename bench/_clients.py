"""The bench clients: raw sockets and our codec, each run in its own process by
`bench._support.run_clients` (spawn), so they never share a GIL with each other or nsqd.

They must not be the bottleneck: a publisher keeps `window` MPUBs outstanding and answers each
batch of OKs read with as many new MPUBs in one send; a consumer parses every received chunk
with one `struct` call per frame and answers it with all its FINs in one send. Each reports
its own CPU time (`time.process_time()`) over its timed loop, so a reader can tell.

Every client takes `(…, barrier, results)` last: it connects, waits on the barrier, runs, and
puts one tuple on `results`.
"""

import json
import os
import socket
import struct
import time

from nsqpy.common.command import (
    MAGIC_V2,
    NOP,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder

SOCKET_BUFFER = 4 * 1024 * 1024
RECEIVE_SIZE = 1024 * 1024
FRAME_HEADER = struct.Struct(">Ii")
_FRAME_HEADER_SIZE = FRAME_HEADER.size
# Offsets inside a message frame: [4 size][4 type][8 timestamp][2 attempts][16 id][body].
_ID_START = 18
_ID_END = 34
_BODY_START = 34
# The latency clients' body: the publisher's time.monotonic_ns() (CLOCK_MONOTONIC is one
# clock for every process of the machine), padded to the message size.
_STAMP = struct.Struct(">q")


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    return sock


def expect_ok(sock: socket.socket) -> None:
    """Read up to the next `OK` response (heartbeats skipped)."""
    decoder = FrameDecoder()
    while True:
        data = sock.recv(RECEIVE_SIZE)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        for frame in decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                return
            if frame.data != b"_heartbeat_":
                raise RuntimeError(f"unexpected frame {frame}")


def subscribe(port: int, topic: str | tuple[str, int], channel: str, identify: dict | None = None):
    """Connect, IDENTIFY (when given, with feature negotiation) and SUB to `topic` (a name, or
    (name, partition)): the socket, and the IDENTIFY reply (what nsqd granted) or None."""
    sock = connect(port)
    sock.sendall(MAGIC_V2)
    if identify is not None:
        sock.sendall(encode_identify({"feature_negotiation": True, **identify}))
        decoder = FrameDecoder()
        while True:
            frames = decoder.receive_data(sock.recv(RECEIVE_SIZE))
            if frames:
                break
        reply = frames[0].data
        if frames[0].frame_type != FRAME_TYPE_RESPONSE or not reply.startswith(b"{"):
            raise RuntimeError(f"IDENTIFY failed: {reply!r}")
        granted = json.loads(reply)
    else:
        granted = None
    name, *partition = _named(topic)
    sock.sendall(encode_sub(name, channel, *partition))
    expect_ok(sock)
    return sock, granted


def _named(topic: str | tuple[str, int]) -> tuple:
    """A client's `topic`: a name, or (name, partition) for one of a topic's partitions."""
    return (topic,) if isinstance(topic, str) else topic


def create_channel(port: int, topic: str, channel: str) -> None:
    """SUB once (a channel that is not #ephemeral stays), then leave."""
    subscribe(port, topic, channel)[0].close()


# -- throughput ------------------------------------------------------------------------------


def publisher(
    port, topic, batches, batch, size, window, barrier, results, printable: bool = False
) -> None:
    """MPUB `batches` batches of `batch` messages (random bytes, or `printable` ones: no
    newline in them), `window` outstanding, to `topic` (a name, or (name, partition)). Puts
    (messages, start, end, cpu, 0)."""
    bodies = [b"x" * size] * batch if printable else [os.urandom(size) for _ in range(batch)]
    name, *partition = _named(topic)
    command = encode_mpub(name, bodies, *partition)
    sock = connect(port)
    sock.sendall(MAGIC_V2)
    decoder = FrameDecoder()
    barrier.wait()
    cpu = time.process_time()
    start = time.monotonic()
    sent = min(window, batches)
    sock.sendall(command * sent)
    acked = 0
    while acked < batches:
        data = sock.recv(RECEIVE_SIZE)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        oks = 0
        for frame in decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                oks += 1
            elif frame.data == b"_heartbeat_":
                sock.sendall(NOP)
            else:
                raise RuntimeError(f"publish failed: {frame}")
        acked += oks
        more = min(oks, batches - sent)
        if more:
            sock.sendall(command * more)
            sent += more
    end = time.monotonic()
    results.put((acked * batch, start, end, time.process_time() - cpu, 0))
    sock.close()


def consumer(port, topic, channel, rdy, target, total, barrier, results) -> None:
    """SUB, RDY `rdy`; receive and FIN until `total` (a shared counter: several consumers of
    one channel add to one) reaches `target`. Clock from RDY to the last message.
    Puts (messages, start, last, cpu, receives that held messages)."""
    sock, _ = subscribe(port, topic, channel)
    barrier.wait()
    cpu = time.process_time()
    start = last = time.monotonic()
    sock.sendall(encode_rdy(rdy))
    sock.settimeout(0.05)
    unpack_from = FRAME_HEADER.unpack_from
    received = chunks = 0
    pending = b""
    while True:
        try:
            data = sock.recv(RECEIVE_SIZE)
        except TimeoutError:
            if total.value >= target:
                break
            continue
        if not data:
            raise ConnectionError("nsqd closed the connection")
        if pending:
            data = pending + data
        ids = []
        append = ids.append
        position = 0
        available = len(data)
        while available - position >= _FRAME_HEADER_SIZE:
            frame_size, frame_type = unpack_from(data, position)
            end = position + 4 + frame_size
            if end > available:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                append(data[position + _ID_START : position + _ID_END])
            elif data[position + 8 : end] == b"_heartbeat_":
                sock.sendall(NOP)
            else:
                raise RuntimeError(f"unexpected frame {data[position:end]!r}")
            position = end
        pending = data[position:]
        if ids:
            sock.sendall(b"FIN " + b"\nFIN ".join(ids) + b"\n")
            received += len(ids)
            chunks += 1
            last = time.monotonic()
            with total.get_lock():
                total.value += len(ids)
                done = total.value >= target
            if done:
                break
        elif total.value >= target:
            break
    results.put((received, start, last, time.process_time() - cpu, chunks))
    sock.close()


# -- latency ---------------------------------------------------------------------------------


def paced_publisher(port, topic, rate, count, size, barrier, results) -> None:
    """PUB `count` messages at `rate` per second on a fixed schedule (a late one does not
    shift the rest), each body stamped with time.monotonic_ns() just before its send.
    Puts ("publisher", sent, start, end, cpu, worst lateness s)."""
    sock = connect(port)
    sock.sendall(MAGIC_V2)
    padding = b"x" * max(0, size - _STAMP.size)
    decoder = FrameDecoder()
    barrier.wait()
    cpu = time.process_time()
    start = time.monotonic()
    late = 0.0
    for index in range(count):
        due = start + index / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            late = max(late, now - due)
        sock.sendall(encode_pub(topic, _STAMP.pack(time.monotonic_ns()) + padding))
        while True:  # the OK (nsqd answers within the tick; this keeps the socket drained)
            frames = decoder.receive_data(sock.recv(RECEIVE_SIZE))
            if any(frame.data == b"OK" for frame in frames):
                break
            for frame in frames:
                if frame.data == b"_heartbeat_":
                    sock.sendall(NOP)
                else:
                    raise RuntimeError(f"PUB failed: {frame}")
    end = time.monotonic()
    results.put(("publisher", count, start, end, time.process_time() - cpu, late))
    sock.close()


def stamped_consumer(port, topic, channel, rdy, identify, count, barrier, results) -> None:
    """SUB (after IDENTIFY `identify`, when given), RDY `rdy`; for each message the time from
    its stamp to the receive that brought it, in seconds; FIN each at once.
    Puts ("consumer", latencies, cpu, IDENTIFY reply or None)."""
    sock, granted = subscribe(port, topic, channel, identify)
    sock.sendall(encode_rdy(rdy))
    barrier.wait()
    cpu = time.process_time()
    sock.settimeout(60)
    unpack_from = FRAME_HEADER.unpack_from
    stamp_from = _STAMP.unpack_from
    latencies: list[float] = []
    pending = b""
    while len(latencies) < count:
        data = sock.recv(RECEIVE_SIZE)
        received_ns = time.monotonic_ns()
        if not data:
            raise ConnectionError("nsqd closed the connection")
        if pending:
            data = pending + data
        ids = []
        position = 0
        available = len(data)
        while available - position >= _FRAME_HEADER_SIZE:
            frame_size, frame_type = unpack_from(data, position)
            end = position + 4 + frame_size
            if end > available:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                ids.append(data[position + _ID_START : position + _ID_END])
                (stamp,) = stamp_from(data, position + _BODY_START)
                latencies.append((received_ns - stamp) / 1e9)
            elif data[position + 8 : end] == b"_heartbeat_":
                sock.sendall(NOP)
            else:
                raise RuntimeError(f"unexpected frame {data[position:end]!r}")
            position = end
        pending = data[position:]
        if ids:
            sock.sendall(b"FIN " + b"\nFIN ".join(ids) + b"\n")
    results.put(("consumer", latencies, time.process_time() - cpu, granted))
    sock.close()
