"""A swarm of idle V2 consumers in one process and one thread: a `selectors` (epoll) loop.

Run as `python -m tests.reliability.load_clients PORT COUNT HEARTBEAT_MS` by the load test.
Every connection sends the magic, `IDENTIFY` with `heartbeat_interval=HEARTBEAT_MS` and
`SUB idle idle` (RDY stays 0, so it never gets a message), then answers every `_heartbeat_`
with `NOP`. A connection nsqd closes after that is a drop: it answered all its heartbeats.

The parent talks to the swarm through lines: the swarm prints one JSON line when every
connection is subscribed (or failed to), and another with its counters for each `stats` line
it reads on stdin; it exits when stdin closes.
"""

import errno
import json
import resource
import selectors
import socket
import sys
import time

from nsqpy.common.command import MAGIC_V2, NOP, encode_identify, encode_sub
from nsqpy.common.frame import FRAME_TYPE_RESPONSE, FrameDecoder

HEARTBEAT = b"_heartbeat_"
# Connections being opened at once; keeps the listen backlog of nsqd from overflowing.
CONNECTING_AT_ONCE = 256
CONNECT_PHASE_LIMIT = 300.0


class _Conn:
    __slots__ = ("sock", "decoder", "responses", "heartbeats", "state", "error")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = FrameDecoder()
        self.responses = 0  # OK frames before the heartbeats start (IDENTIFY, SUB)
        self.heartbeats = 0
        self.state = "connecting"  # -> "subscribing" -> "idle" -> "closed"/"failed"
        self.error = ""


class Swarm:
    def __init__(self, port: int, count: int, heartbeat_ms: int) -> None:
        self.port = port
        self.count = count
        self.handshake = (
            MAGIC_V2
            + encode_identify({"heartbeat_interval": heartbeat_ms, "client_id": "idle"})
            + encode_sub("idle", "idle")
        )
        self.selector = selectors.DefaultSelector()
        self.conns: list[_Conn] = []
        self.ready = 0
        self.settled = 0  # connections past the handshake: subscribed or failed
        self.errors: list[str] = []

    # -- connections -----------------------------------------------------------------------

    def _open(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        self.conns.append(conn)
        code = sock.connect_ex(("127.0.0.1", self.port))
        if code not in (0, errno.EINPROGRESS):
            self._fail(conn, f"connect: {errno.errorcode.get(code, code)}")
            return
        self.selector.register(sock, selectors.EVENT_WRITE, conn)

    def _fail(self, conn: _Conn, error: str) -> None:
        was_idle = conn.state == "idle"
        if not was_idle:
            self.settled += 1
        conn.state = "closed" if was_idle else "failed"
        conn.error = error
        if len(self.errors) < 20:
            self.errors.append(f"{conn.state} after {conn.heartbeats} heartbeats: {error}")
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _writable(self, conn: _Conn) -> None:
        code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._fail(conn, f"connect: {errno.errorcode.get(code, code)}")
            return
        conn.sock.send(self.handshake)  # a few dozen bytes into an empty send buffer
        conn.state = "subscribing"
        self.selector.modify(conn.sock, selectors.EVENT_READ, conn)

    def _readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as error:
            self._fail(conn, f"recv: {error}")
            return
        if not data:
            self._fail(conn, "closed by nsqd")
            return
        nops = 0
        for frame in conn.decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == HEARTBEAT:
                conn.heartbeats += 1
                nops += 1
            elif frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                conn.responses += 1
                if conn.responses == 2 and conn.state == "subscribing":
                    conn.state = "idle"
                    self.ready += 1
                    self.settled += 1
            else:
                self._fail(conn, f"unexpected frame {frame.frame_type} {frame.data[:80]!r}")
                return
        if nops:
            try:
                sent = conn.sock.send(NOP * nops)
            except OSError as error:
                self._fail(conn, f"send: {error}")
                return
            if sent != len(NOP) * nops:
                self._fail(conn, "send buffer full")

    # -- loop ------------------------------------------------------------------------------

    def _poll(self, timeout: float) -> list[str]:
        commands = []
        for key, events in self.selector.select(timeout):
            conn = key.data
            if conn is None:
                line = sys.stdin.readline()
                commands.append(line.strip() if line else "eof")
            elif events & selectors.EVENT_WRITE and conn.state == "connecting":
                self._writable(conn)
            else:
                self._readable(conn)
        return commands

    def connect_all(self) -> None:
        deadline = time.monotonic() + CONNECT_PHASE_LIMIT
        while self.settled < self.count and time.monotonic() < deadline:
            pending = len(self.conns) - self.settled
            while len(self.conns) < self.count and pending < CONNECTING_AT_ONCE:
                self._open()
                pending += 1
            self._poll(0.05)

    def report(self) -> dict:
        states: dict[str, int] = {}
        for conn in self.conns:
            states[conn.state] = states.get(conn.state, 0) + 1
        idle_heartbeats = [conn.heartbeats for conn in self.conns if conn.state == "idle"]
        return {
            "connections": self.count,
            "subscribed": self.ready,
            "alive": states.get("idle", 0),
            "dropped": states.get("closed", 0),
            # never subscribed: a connect error, an error frame, or still in the handshake
            "failed": self.count - states.get("idle", 0) - states.get("closed", 0),
            "heartbeats": sum(conn.heartbeats for conn in self.conns),
            "min_heartbeats": min(idle_heartbeats, default=0),
            "errors": self.errors,
        }

    def run(self) -> None:
        self.connect_all()
        print(json.dumps(self.report()), flush=True)
        self.selector.register(sys.stdin, selectors.EVENT_READ, None)
        while True:
            for command in self._poll(1.0):
                if command == "eof":
                    return
                print(json.dumps(self.report()), flush=True)


def main() -> None:
    port, count, heartbeat_ms = (int(arg) for arg in sys.argv[1:4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1000), hard))
    Swarm(port, count, heartbeat_ms).run()


if __name__ == "__main__":
    main()
