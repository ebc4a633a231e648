"""Drive grammar sessions against a live nsqd over many concurrent connections and judge every
reply with the oracle (fuzz/tcp_oracle.py).

Each session gets its own connection, sent in whole, in random pieces or a byte at a time,
read while it is sent (select), and ended with a half-close (nsqd must answer what it got and
close) or a reset. Slowloris connections dribble a command a byte at a time and must be cut
off by nsqd's read deadline.
"""

import random
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from fuzz.tcp_grammar import Grammar, Session, chunks
from fuzz.tcp_oracle import Matcher
from fuzz.workers import run_workers
from nsqpy.common.command import MAGIC_V2
from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder

# From the last byte sent, how long nsqd has to answer everything and close. Safety net
# against a hang (reported as a violation), never a measure of speed.
VERDICT_DEADLINE = 60.0


@dataclass
class TCPStats:
    sessions: int = 0
    inputs_sent: int = 0
    inputs_parsed: int = 0
    bytes_sent: int = 0
    replies: int = 0
    messages_received: int = 0
    errors_by_code: Counter = field(default_factory=Counter)
    endings: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    slowloris: int = 0
    slowloris_cut: int = 0

    def merge(self, other: "TCPStats") -> None:
        self.sessions += other.sessions
        self.inputs_sent += other.inputs_sent
        self.inputs_parsed += other.inputs_parsed
        self.bytes_sent += other.bytes_sent
        self.replies += other.replies
        self.messages_received += other.messages_received
        self.errors_by_code.update(other.errors_by_code)
        self.endings.update(other.endings)
        self.violation_count += other.violation_count
        self.violations.extend(other.violations[: max(0, 50 - len(self.violations))])
        self.slowloris += other.slowloris
        self.slowloris_cut += other.slowloris_cut

    def violation(self, text: str) -> None:
        self.violation_count += 1
        if len(self.violations) < 50:
            self.violations.append(text)


def run_session(port: int, session: Session, rng: random.Random, stats: TCPStats, tag: str) -> None:
    """Send one session and judge what comes back."""
    matcher = Matcher([item.expect for item in session.inputs])
    payload = session.payload()
    pieces = chunks(rng, payload, session.chunking)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    decoder = FrameDecoder()
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    piece_index, offset = 0, 0
    sent_all = False
    closed = False
    reset_by_peer = False
    deadline = None
    try:
        while not closed:
            if sent_all and deadline is None:
                deadline = time.monotonic() + VERDICT_DEADLINE
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                stats.violation(f"{tag}: hung: no close {VERDICT_DEADLINE}s after the last byte")
                break
            for _key, mask in selector.select(timeout):
                if mask & selectors.EVENT_READ:
                    try:
                        data = sock.recv(262144)
                    except BlockingIOError:
                        data = None
                    except ConnectionResetError:
                        data, reset_by_peer = b"", True
                    if data == b"":
                        closed = True
                        break
                    if data:
                        try:
                            frames = decoder.receive_data(data)
                        except ProtocolError as error:
                            stats.violation(f"{tag}: bad frame from nsqd: {error}")
                            closed = True
                            break
                        for frame in frames:
                            if frame.frame_type == FRAME_TYPE_MESSAGE:
                                stats.messages_received += 1
                            elif (
                                frame.frame_type == FRAME_TYPE_RESPONSE
                                and frame.data == b"_heartbeat_"
                            ):
                                continue
                            else:
                                matcher.reply(frame.frame_type, frame.data)
                if mask & selectors.EVENT_WRITE and not sent_all:
                    piece = pieces[piece_index]
                    try:
                        written = sock.send(piece[offset:]) if piece else 0
                    except BlockingIOError:
                        written = 0
                    except (BrokenPipeError, ConnectionResetError):
                        # nsqd closed on a fatal error while we were still sending.
                        sent_all = True
                        selector.modify(sock, selectors.EVENT_READ)
                        continue
                    offset += written
                    stats.bytes_sent += written
                    if offset >= len(piece):
                        piece_index, offset = piece_index + 1, 0
                        if piece_index == len(pieces):
                            sent_all = True
                            selector.modify(sock, selectors.EVENT_READ)
                            if session.ending == "reset":
                                sock.setsockopt(
                                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                                )
                                closed = True
                                break
                            try:
                                sock.shutdown(socket.SHUT_WR)
                            except OSError:
                                pass
                        elif session.chunking != "whole":
                            break  # one piece per round: nsqd sees them as separate reads
    finally:
        selector.close()
        sock.close()
    complete = sent_all and session.ending != "reset" and not reset_by_peer
    if closed:
        matcher.closed(complete=complete)
    stats.sessions += 1
    stats.endings[session.ending if complete or session.ending == "reset" else "cut-off"] += 1
    stats.inputs_sent += len(session.inputs) if session.magic_ok else 1
    if matcher.fatal_seen is not None or not complete:
        stats.inputs_parsed += min(len(session.inputs), matcher.position + 1)
    else:
        stats.inputs_parsed += len(session.inputs)
    stats.replies += matcher.replies
    stats.errors_by_code.update(matcher.errors)
    for violation in matcher.violations:
        stats.violation(f"{tag}: {violation}; payload head {payload[:200]!r}")


def slowloris_session(port: int, stats: TCPStats, gap: float, heartbeat_ms: int = 1000) -> None:
    """IDENTIFY a short heartbeat, then dribble one PUB a byte at a time. nsqd must close the
    connection once the command has taken longer than its read deadline (2 heartbeats), however
    steadily the bytes come; the command must never complete."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = b'{"heartbeat_interval":%d}' % heartbeat_ms
    sock.sendall(MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    command = b"PUB fuzz_slowloris\n" + struct.pack(">i", 4000) + b"s" * 4000
    stats.slowloris += 1
    decoder = FrameDecoder()
    replies: list[bytes] = []
    cut = False
    sock.settimeout(gap)
    # Safety net: five read deadlines' worth of bytes; past that the cut never came.
    limit = min(len(command), int(5 * 2 * heartbeat_ms / 1000 / gap) + 1)
    try:
        for index in range(limit):
            try:
                sock.send(command[index : index + 1])
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                cut = True
                break
            if not data:
                cut = True
                break
            replies.extend(f.data for f in decoder.receive_data(data) if f.data != b"_heartbeat_")
    finally:
        sock.close()
    if cut:
        stats.slowloris_cut += 1
    else:
        stats.violation(f"slowloris: {limit} bytes of one command dribbled in, never cut off")
    if replies[1:]:
        stats.violation(f"slowloris: unexpected replies {replies[:3]!r}")


class TCPFuzzer:
    """Runs `total_inputs` worth of sessions on `workers` concurrent connections."""

    def __init__(
        self,
        port: int,
        seed: int,
        total_inputs: int,
        workers: int = 8,
        progress=None,
    ) -> None:
        self.port = port
        self.seed = seed
        self.total_inputs = total_inputs
        self.workers = workers
        self.progress = progress
        self.stats = TCPStats()
        self._lock = threading.Lock()
        # Inputs nsqd parsed (not those a fatal error left unread): the target counts these.
        self._parsed = 0
        self.stop = threading.Event()

    def _worker(self, number: int) -> None:
        rng = random.Random(f"{self.seed}-{number}")
        grammar = Grammar(rng)
        local = TCPStats()
        index = 0
        try:
            while not self.stop.is_set():
                with self._lock:
                    if self._parsed >= self.total_inputs:
                        break
                session = grammar.session()
                parsed = local.inputs_parsed
                run_session(self.port, session, rng, local, f"seed {self.seed} w{number}#{index}")
                with self._lock:
                    self._parsed += local.inputs_parsed - parsed
                index += 1
                if index % 200 == 0:
                    with self._lock:
                        self.stats.merge(local)
                    local = TCPStats()
                    if self.progress is not None:
                        self.progress(self.stats)
        except Exception as error:  # a client-side failure: report it, never hide it
            local.violation(f"w{number}: fuzzer error {error!r}")
        finally:
            with self._lock:
                self.stats.merge(local)

    def run(self) -> TCPStats:
        run_workers(self._worker, self.workers)
        return self.stats
