"""A live nsqd under a storm of hostile connections keeps serving its well-behaved clients.

docs/design.md §5: a client that misbehaves is disconnected; it never takes
the daemon, or another client's messages, with it. While one consumer receives a steady
stream of messages, hundreds of connections send random bytes, random commands from the
V2 command set with random arguments and bogus or huge length prefixes, and commands cut
short. The run is seeded and bounded in count and time; every hostile connection must end
with an `E_*` error frame or nsqd closing it before a deadline.
"""

import errno
import json
import random
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nsqpy.common.command import (
    CLS,
    MAGIC_V2,
    NOP,
    encode_dpub,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    FrameDecoder,
)
from nsqpy.common.message import decode_message
from tests.harness import V2Connection, start_nsqd

SEED = 0x5EED_4E53
HOSTILE_CONNECTIONS = 1000
CONCURRENT_HOSTILE = 16
# No new hostile connection starts after this long, so the test stays well under 30 s.
HOSTILE_PHASE_LIMIT = 12.0
# From its last byte sent, how long a hostile connection may wait for an error or a close.
# With IDENTIFY heartbeat_interval=1000 nsqd closes an idle connection after 2 s.
VERDICT_DEADLINE = 8.0

GOOD_TOPIC = "good"
GOOD_CHANNEL = "c"

_SIZE = struct.Struct(">i")

COMMAND_NAMES = [
    b"IDENTIFY",
    b"AUTH",
    b"SUB",
    b"RDY",
    b"FIN",
    b"REQ",
    b"TOUCH",
    b"CLS",
    b"NOP",
    b"PUB",
    b"MPUB",
    b"DPUB",
    b"PUB_TRACE",
    b"MPUB_TRACE",
    b"PUB_EXT",
    b"MPUB_EXT",
    b"SUB_ORDERED",
    b"SUB_ADVANCED",
    b"INTERNAL_CREATE_TOPIC",
]
BODY_COMMANDS = {
    b"IDENTIFY",
    b"AUTH",
    b"PUB",
    b"MPUB",
    b"DPUB",
    b"PUB_TRACE",
    b"MPUB_TRACE",
    b"PUB_EXT",
    b"MPUB_EXT",
}
# Hostile topics and channels: valid, ephemeral, too long, invalid characters, not UTF-8.
# Never the good consumer's topic, so no hostile client can take its messages.
HOSTILE_NAMES = [
    b"hostile",
    b"hostile2",
    b"h#ephemeral",
    b"h" * 64,
    b"h" * 65,
    b"a b",
    b"",
    b"\xff\xfe\x00",
    b"..",
    b"h:c",
]
VALID_HOSTILE_TOPICS = ["hostile", "hostile2", "h#ephemeral"]
# Hostile clients may subscribe to the good topic too, on their own channels: each channel
# has its own copy of every message, so they see the good stream but cannot take from it.
HOSTILE_SUBSCRIPTIONS = [
    (topic, channel)
    for topic in [*VALID_HOSTILE_TOPICS, GOOD_TOPIC]
    for channel in ["h", "d", "e#ephemeral"]
]
INTERESTING_INT32S = [0, 1, -1, 2, 16, 100, 2500, 2501, 60000, 2**31 - 1, -(2**31)]
INTERESTING_INTS = [*INTERESTING_INT32S, 2**63, 10**30]


# -- building hostile payloads -----------------------------------------------------------------


def random_int_text(rng: random.Random) -> bytes:
    if rng.random() < 0.7:
        return b"%d" % rng.choice(INTERESTING_INTS)
    return rng.choice([b"", b"abc", b"1e3", b"+5", b"0x10", b" ", b"\x00", b"-", b"9" * 40])


def random_id(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"%016x" % rng.getrandbits(64),
            rng.randbytes(16),
            b"0" * rng.randrange(0, 40),
        ]
    )


def random_arg(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(HOSTILE_NAMES)
    if kind == 1:
        return random_int_text(rng)
    if kind == 2:
        return random_id(rng)
    return rng.randbytes(rng.randrange(0, 30)).replace(b"\n", b"")


def random_identify_body(rng: random.Random) -> bytes:
    fields = {
        "client_id": lambda: rng.choice(["x", "", "h" * 300, 5]),
        "hostname": lambda: rng.choice(["host", None, ["list"]]),
        "feature_negotiation": lambda: rng.choice([True, False, "yes"]),
        "heartbeat_interval": lambda: rng.choice([-1, 0, 999, 1000, 60001, 2**40, "1"]),
        "output_buffer_size": lambda: rng.choice([-1, 0, 63, 64, 10**9]),
        "output_buffer_timeout": lambda: rng.choice([-1, 0, 1, 1000, 10**9]),
        "tls_v1": lambda: rng.choice([True, False]),
        "snappy": lambda: rng.choice([True, False]),
        "deflate": lambda: rng.choice([True, False]),
        "deflate_level": lambda: rng.choice([0, 1, 9, 100, -5]),
        "sample_rate": lambda: rng.choice([0, 50, 99, 100, -1, 2**40]),
        "msg_timeout": lambda: rng.choice([0, 999, 1000, 10**9]),
        "user_agent": lambda: rng.choice(["hostile/1.0", 1.5]),
    }
    document = {key: make() for key, make in fields.items() if rng.random() < 0.4}
    encoded = json.dumps(document).encode()
    if rng.random() < 0.2:
        encoded = encoded[: rng.randrange(len(encoded) + 1)]  # broken JSON
    if rng.random() < 0.1:
        encoded = rng.randbytes(rng.randrange(1, 200))
    return encoded


def random_mpub_body(rng: random.Random) -> bytes:
    count = rng.choice([0, 1, 3, -1, 2**31 - 1, rng.randrange(1, 50)])
    parts = [_SIZE.pack(count)]
    for _ in range(rng.randrange(0, 6)):
        body = rng.randbytes(rng.randrange(0, 40))
        size = len(body) if rng.random() < 0.7 else rng.choice(INTERESTING_INT32S)
        parts.append(_SIZE.pack(size) + body)
    return b"".join(parts)


def random_body(rng: random.Random, name: bytes) -> bytes:
    if name == b"IDENTIFY":
        return random_identify_body(rng)
    if name.startswith(b"MPUB"):
        return random_mpub_body(rng)
    return rng.randbytes(rng.choice([0, 1, 8, 9, rng.randrange(0, 300)]))


def random_size_prefix(rng: random.Random, body: bytes) -> bytes:
    """Mostly the true size; otherwise too small, too big, negative or enormous."""
    roll = rng.random()
    if roll < 0.6:
        return _SIZE.pack(len(body))
    if roll < 0.75:
        return _SIZE.pack(max(0, len(body) - rng.randrange(1, 10)))
    if roll < 0.85:
        return _SIZE.pack(len(body) + rng.randrange(1, 1000))
    return _SIZE.pack(
        rng.choice([0, -1, -(2**31), 2**31 - 1, 5 * 1024 * 1024 + 1, 1024 * 1024 + 1])
    )


def identify_command(rng: random.Random, heartbeat_ms: int | None = None) -> bytes:
    settings = {"client_id": "hostile", "feature_negotiation": rng.random() < 0.5}
    if heartbeat_ms is not None:
        settings["heartbeat_interval"] = heartbeat_ms
    elif rng.random() < 0.5:
        settings["heartbeat_interval"] = rng.choice([1000, 2000, 5000])
    if rng.random() < 0.3:
        settings["sample_rate"] = rng.randrange(0, 100)
    return encode_identify(settings)


def well_formed_command(rng: random.Random) -> bytes:
    """A command a subscribed connection may send; FIN, REQ and TOUCH of IDs it does not
    hold are refused without closing the connection, so the script goes on."""
    topic = rng.choice(VALID_HOSTILE_TOPICS)
    kind = rng.randrange(9)
    if kind == 0:
        return encode_rdy(rng.randrange(0, 100))
    if kind == 1:
        return rng.choice([b"FIN ", b"TOUCH "]) + b"%016x\n" % rng.getrandbits(64)
    if kind == 2:
        return b"REQ %016x %d\n" % (rng.getrandbits(64), rng.randrange(0, 5000))
    if kind in (3, 4):
        return encode_pub(topic, rng.randbytes(rng.randrange(1, 200)))
    if kind == 5:
        bodies = [rng.randbytes(rng.randrange(1, 50)) for _ in range(rng.randrange(1, 20))]
        return encode_mpub(topic, bodies)
    if kind == 6:
        return encode_dpub(topic, rng.randrange(0, 3000), rng.randbytes(rng.randrange(1, 50)))
    if kind == 7:
        return NOP
    return CLS if rng.random() < 0.3 else NOP


def random_command(rng: random.Random, names: list[bytes] = COMMAND_NAMES) -> bytes:
    """A random command from the command set with random arguments and body sizes."""
    name = rng.choice(names)
    if rng.random() < 0.05:
        name = name.lower()
    args = [random_arg(rng) for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 6]))]
    line = b" ".join([name, *args])
    line += rng.choice([b"\n", b"\n", b"\n", b"\r\n", b" \n"])
    if name in BODY_COMMANDS and rng.random() < 0.95:
        body = random_body(rng, name)
        return line + random_size_prefix(rng, body) + body
    return line


def command_sequence(rng: random.Random, count: int, idle: bool = False) -> list[bytes]:
    """A session that mostly follows the protocol (IDENTIFY, SUB to a hostile topic, RDY,
    then publishes and acknowledgements), with random commands ever more likely as it goes,
    so connections get deep into the protocol before something bogus arrives.

    An `idle` session sets a 1 s heartbeat first and never IDENTIFYs again (a second
    IDENTIFY is allowed and could lengthen the heartbeat or disable it, and then an idle
    connection may rightly stay open): nsqd must close it 2 s after its last command."""
    commands = []
    names = COMMAND_NAMES
    if idle:
        commands.append(identify_command(rng, heartbeat_ms=1000))
        names = [name for name in COMMAND_NAMES if name != b"IDENTIFY"]
    elif rng.random() < 0.5:
        commands.append(identify_command(rng))
    if rng.random() < 0.7:
        commands.append(encode_sub(*rng.choice(HOSTILE_SUBSCRIPTIONS)))
        commands.append(encode_rdy(rng.randrange(1, 50)))
    for index in range(count):
        if rng.random() < 0.9 - index * 0.03:
            commands.append(well_formed_command(rng))
        else:
            commands.append(random_command(rng, names))
    return commands


@dataclass
class HostileConnection:
    """One scripted hostile client.

    `ending` says how it ends and so what nsqd owes it:

    * "half-close": shut down its sending side after the payload (a disconnect seen as EOF,
      also in the middle of a command): nsqd must close the connection.
    * "expect-error": the payload is refused for sure (no protocol magic, an unknown command
      right after it, or an oversized body); nsqd must send `E_*` or close.
    * "idle": IDENTIFY with a 1 s heartbeat, then random commands (no IDENTIFY), then
      silence: nsqd must close it once its read deadline passes, if it does not refuse it
      first.
    * "reset": abort with a TCP RST mid-stream; nothing to observe, nsqd just has to cope.
    """

    number: int
    payload: bytes
    chunks: list[int]
    ending: str


def make_hostile_connection(rng: random.Random, number: int) -> HostileConnection:
    ending = rng.choices(["half-close", "expect-error", "idle", "reset"], [50, 25, 15, 10])[0]
    if ending == "expect-error":
        style = rng.randrange(4)
        if style == 0:  # anything but the magic
            payload = rng.randbytes(rng.randrange(4, 400))
            if payload.startswith(MAGIC_V2):
                payload = b"XXXX" + payload
        elif style == 1:  # a command name that is no command
            payload = MAGIC_V2 + rng.randbytes(rng.randrange(0, 60)).replace(b"\n", b"") + b"\n"
            payload += rng.randbytes(rng.randrange(0, 200))
            if payload[4:].split(b"\n")[0].split(b" ")[0] in COMMAND_NAMES:
                payload = MAGIC_V2 + b"NOT_A_COMMAND\n"
        elif style == 2:  # a body size far past every limit
            name = rng.choice([b"PUB hostile", b"MPUB hostile", b"DPUB hostile 10", b"IDENTIFY"])
            size = rng.choice([2**31 - 1, 64 * 1024 * 1024, -5])
            payload = MAGIC_V2 + name + b"\n" + _SIZE.pack(size) + rng.randbytes(100)
        else:  # a line longer than nsqd reads (16 KiB) without a newline
            payload = MAGIC_V2 + b"PUB " + bytes(rng.choice(b"abc\x00\xff") for _ in range(20_000))
    else:
        commands = command_sequence(rng, rng.randrange(1, 30), idle=ending == "idle")
        payload = MAGIC_V2 + b"".join(commands)
        if rng.random() < 0.1:
            payload += rng.randbytes(rng.randrange(1, 500))  # trailing garbage
        if ending in ("half-close", "reset") and rng.random() < 0.5:
            payload = payload[: rng.randrange(1, len(payload) + 1)]  # cut off mid-command
        if rng.random() < 0.05:
            payload = payload[4:]  # no magic at all
    chunks = []
    remaining = len(payload)
    while remaining > 0:
        size = min(remaining, rng.choice([1, 3, 7, 64, 1500, 65536]))
        chunks.append(size)
        remaining -= size
    return HostileConnection(number, payload, chunks, ending)


# -- running them ----------------------------------------------------------------------------


@dataclass
class Verdict:
    number: int
    ending: str
    outcome: str = ""  # "error", "closed", "reset" (by us); failures: "hung", "bad frame"
    detail: str = ""
    messages: int = 0  # message frames nsqd delivered to this hostile connection
    errors: int = 0  # E_* frames


def run_hostile_connection(port: int, spec: HostileConnection) -> Verdict:
    verdict = Verdict(spec.number, spec.ending)
    sock = socket.create_connection(("127.0.0.1", port), timeout=VERDICT_DEADLINE)
    try:
        _send_payload(sock, spec, verdict)
        if not verdict.outcome:
            _await_verdict(sock, spec, verdict)
    finally:
        sock.close()
    return verdict


def _send_payload(sock: socket.socket, spec: HostileConnection, verdict: Verdict) -> None:
    position = 0
    try:
        for size in spec.chunks:
            sock.sendall(spec.payload[position : position + size])
            position += size
            if spec.ending == "reset" and position > len(spec.payload) // 2:
                break
    except (BrokenPipeError, ConnectionResetError):
        verdict.outcome, verdict.detail = "closed", f"while we sent byte {position}"
        return
    if spec.ending == "reset":
        # Linger 0: close() sends RST, with whatever nsqd sent still unread.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        verdict.outcome = "reset"
    elif spec.ending == "half-close":
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError as error:
            # ENOTCONN: nsqd already closed, and its reset (it had unread input) arrived first.
            if error.errno != errno.ENOTCONN:
                raise
            verdict.outcome, verdict.detail = "closed", "reset by nsqd"


def _await_verdict(sock: socket.socket, spec: HostileConnection, verdict: Verdict) -> None:
    """Read until nsqd closes the connection (or, for "expect-error", sends `E_*`); every
    frame on the way must be well formed."""
    decoder = FrameDecoder()
    deadline = time.monotonic() + VERDICT_DEADLINE
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            verdict.outcome = "hung"
            verdict.detail = f"no close {VERDICT_DEADLINE}s after {len(spec.payload)} bytes"
            return
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            verdict.outcome, verdict.detail = "closed", "reset by nsqd"
            return
        if not data:
            verdict.outcome = "closed"
            return
        try:
            frames = decoder.receive_data(data)
        except ProtocolError as error:
            verdict.outcome, verdict.detail = "bad frame", str(error)
            return
        for frame in frames:
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                verdict.messages += 1
            elif frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_"):
                verdict.errors += 1
            elif frame.frame_type != FRAME_TYPE_RESPONSE:
                verdict.outcome, verdict.detail = "bad frame", repr(frame)
                return
        if verdict.errors and spec.ending == "expect-error":
            verdict.outcome = "error"
            return


class GoodConsumer(threading.Thread):
    """Subscribed to the good topic, FINs every message and records its body."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.connection = V2Connection(port)
        self.connection.send(encode_sub(GOOD_TOPIC, GOOD_CHANNEL))
        assert self.connection.read_response().data == b"OK"
        self.connection.send(encode_rdy(200))
        self.bodies: set[bytes] = set()
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.changed = threading.Condition()

    def run(self) -> None:
        self.connection.sock.settimeout(0.5)
        try:
            while not self.stop.is_set():
                try:
                    frame = self.connection.read_frame()
                except TimeoutError:
                    continue
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    message = decode_message(frame.data)
                    self.connection.send(b"FIN " + message.id + b"\n")
                    with self.changed:
                        self.bodies.add(message.body)
                        self.changed.notify_all()
                elif frame.data == b"_heartbeat_":
                    self.connection.send(b"NOP\n")
                else:
                    raise AssertionError(f"good consumer got {frame!r}")
        except BaseException as error:  # reported by the test
            self.error = error
            with self.changed:
                self.changed.notify_all()

    def wait_for(self, bodies: set[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not bodies <= self.bodies and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.changed.wait(remaining)


class GoodPublisher(threading.Thread):
    """Publishes a steady stream of small MPUBs to the good topic until told to stop."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.connection = V2Connection(port)
        self.published: set[bytes] = set()
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        batch = 0
        try:
            while not self.stop.is_set():
                bodies = [b"good %d-%d" % (batch, n) for n in range(5)]
                self.connection.send(encode_mpub(GOOD_TOPIC, bodies))
                assert self.connection.read_response().data == b"OK"
                self.published.update(bodies)
                batch += 1
        except BaseException as error:  # reported by the test
            self.error = error


def test_hostile_connections_never_hurt_nsqd_or_good_clients(tmp_path):
    rng = random.Random(SEED)
    specs = [make_hostile_connection(rng, n) for n in range(HOSTILE_CONNECTIONS)]
    daemon = start_nsqd(tmp_path)
    try:
        port = daemon.port()
        consumer = GoodConsumer(port)
        publisher = GoodPublisher(port)
        consumer.start()
        publisher.start()

        started = time.monotonic()
        verdicts: list[Verdict] = []
        with ThreadPoolExecutor(CONCURRENT_HOSTILE) as pool:

            def run_in_time(spec: HostileConnection) -> Verdict | None:
                if time.monotonic() - started > HOSTILE_PHASE_LIMIT:
                    return None
                return run_hostile_connection(port, spec)

            for verdict in pool.map(run_in_time, specs):
                if verdict is not None:
                    verdicts.append(verdict)

        publisher.stop.set()
        publisher.join(10)
        assert publisher.error is None, f"good publisher failed: {publisher.error!r}"
        assert len(publisher.published) > 0
        consumer.wait_for(publisher.published, timeout=10)
        consumer.stop.set()
        consumer.join(10)
        assert consumer.error is None, f"good consumer failed: {consumer.error!r}"
        missing = publisher.published - consumer.bodies
        assert not missing, f"good consumer missed {len(missing)} of {len(publisher.published)}"
        assert consumer.bodies == publisher.published

        assert len(verdicts) >= HOSTILE_CONNECTIONS // 4, "too few hostile connections ran"
        failed = [v for v in verdicts if v.outcome not in ("error", "closed", "reset")]
        assert not failed, f"seed {SEED:#x}: {failed[:10]}"
        # The storm reached deep into the protocol, not only its first command.
        assert {v.ending for v in verdicts} == {"half-close", "expect-error", "idle", "reset"}
        assert sum(1 for v in verdicts if v.messages) >= 5, "too few hostile SUBs got messages"

        # Still alive and serving a new client end to end.
        assert daemon.process.poll() is None, daemon.log
        fresh = V2Connection(port)
        fresh.send(encode_sub("after", "c") + encode_rdy(1))
        assert fresh.read_response().data == b"OK"
        fresh.send(encode_pub("after", b"still here"))
        assert fresh.read_messages(1)[0].body == b"still here"
        fresh.close()
        assert "Traceback" not in daemon.log, daemon.log
        assert daemon.stop() == 0, daemon.log
    finally:
        daemon.kill()
