"""Running real nsqd processes and talking to them, for the tests.

`DaemonProcess` starts a console script from this virtualenv the way client harnesses do
(single-dash flags, port 0), reads the real ports from its `... listening on` log lines and
keeps every log line for assertions. `V2Connection` is a tiny blocking V2 client over a real
socket and our codec, for wire-level tests.
"""

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

from nsqpy.common.command import MAGIC_V2
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, Frame, FrameDecoder
from nsqpy.common.message import DecodedMessage, decode_message
from tests.support.polling import poll
from tests.support.ports import port_offset

BIN = Path(sys.executable).parent
_LISTENING = re.compile(r"(TCP|HTTP|HTTPS|RPC): listening on (\S+)")


class DaemonProcess:
    def __init__(
        self,
        name: str,
        args: list[str],
        cwd: str | os.PathLike | None = None,
        *,
        new_session: bool = False,
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.args = args
        self.cwd = cwd
        # What runs the console script (`ip netns exec <namespace>` for the network tests);
        # it must exec it, so that signals reach the daemon.
        self.prefix = prefix
        # A process group of its own, to be signalled as a terminal signals its foreground job.
        self.new_session = new_session
        self.addresses: dict[str, str] = {}
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.process: subprocess.Popen | None = None

    def start(self, wait_for: tuple[str, ...] = ("TCP",), timeout: float = 20.0) -> "DaemonProcess":
        self.launch()
        return self.wait_listening(wait_for, timeout)

    def launch(self) -> "DaemonProcess":
        """Start the process without waiting for it (`wait_listening`): several daemons then
        start side by side."""
        self.addresses.clear()
        self.process = subprocess.Popen(
            [*self.prefix, str(BIN / self.name), *self.args],
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=self.new_session,
        )
        # A queue of this process's own: the previous one's end (a restart) is not this one's.
        self._lines = queue.Queue()
        self._pump = threading.Thread(
            target=self._pump_stderr, args=(self.process, self._lines), daemon=True
        )
        self._pump.start()
        return self

    def wait_listening(
        self, wait_for: tuple[str, ...] = ("TCP",), timeout: float = 20.0
    ) -> "DaemonProcess":
        """Until the launched process logged the addresses of `wait_for`."""
        deadline = time.monotonic() + timeout
        while not all(kind in self.addresses for kind in wait_for):
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                raise RuntimeError(f"{self.name} exited: {self.process.wait()}\n" + self.log)
        return self

    def next_line(self, timeout: float) -> str | None:
        """The next log line, None when the process ended; TimeoutError after `timeout`."""
        try:
            line = self._lines.get(timeout=max(timeout, 0))
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no log line in time\n{self.log}") from None
        if line is not None:
            match = _LISTENING.search(line)
            if match:
                self.addresses[match.group(1)] = match.group(2)
        return line

    def wait_for_log(self, pattern: str, timeout: float = 10.0) -> str:
        regex = re.compile(pattern)
        for line in self.lines:
            if regex.search(line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                raise RuntimeError(f"{self.name} exited before logging {pattern!r}\n{self.log}")
            if regex.search(line):
                return line

    def _pump_stderr(self, process: subprocess.Popen, lines: "queue.Queue[str | None]") -> None:
        for line in process.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            lines.put(line)
        lines.put(None)

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def port(self, kind: str = "TCP") -> int:
        return int(self.addresses[kind].rsplit(":", 1)[1])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        code = self.process.wait(timeout)
        # Its last lines (what it logged while stopping) are in `log` once this returns; a
        # child that outlives it (a worker) may hold the pipe open: not waited for long.
        self._pump.join(1.0)
        return code

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


def start_nsqlookupd(
    *extra: str,
    tcp_port: int = 0,
    http_port: int = 0,
    cwd: str | os.PathLike | None = None,
) -> DaemonProcess:
    """nsqlookupd on 127.0.0.1 (ephemeral ports unless given); returns once it listens."""
    args = [f"-tcp-address=127.0.0.1:{tcp_port}", f"-http-address=127.0.0.1:{http_port}", *extra]
    return DaemonProcess("nsqlookupd", args, cwd=cwd).start(wait_for=("TCP", "HTTP"))


def start_nsqd(
    data_path: str | os.PathLike, *extra: str, wait_for: tuple[str, ...] = ("TCP", "HTTP")
) -> DaemonProcess:
    """nsqd on ephemeral ports; returns once it logged the listeners in `wait_for` (add
    "HTTPS" when it is started with a TLS certificate and `-https-address=127.0.0.1:0`)."""
    args = [
        "-tcp-address=127.0.0.1:0",
        "-http-address=127.0.0.1:0",
        f"-data-path={data_path}",
        *extra,
    ]
    return DaemonProcess("nsqd", args, cwd=data_path).start(wait_for=wait_for)


def create_partitioned_topic(
    lookupd_http: str,
    nsqd_http: str,
    topic: str,
    partitions: int,
    channel: str | None,
    *,
    timeout: float = 30.0,
    **flags: str,
) -> None:
    """Create a partitioned topic through a standalone nsqlookupd, which places it on its one
    registered nsqd (`nsqd_http`), with `channel` on every partition; return once nsqlookupd
    lists every partition to writers (it lists one only once it has a channel). With no
    `channel`, return once the nsqd holds the partitions."""
    from nsqpy.client.blocking import http_json
    from nsqpy.client.blocking import http_request as request

    request(
        lookupd_http,
        "/topic/create",
        method="POST",
        topic=topic,
        partition_num=str(partitions),
        replicator="1",
        **flags,
    )

    def placed() -> bool:
        stats = http_json(nsqd_http, "/stats", format="json", topic=topic)
        found = [t for t in stats.get("topics") or [] if "topic_partition" in t]
        return len(found) == partitions

    poll(placed, f"the nsqd to hold {partitions} partitions of {topic}", timeout=timeout)
    if channel is None:
        return
    for partition in range(partitions):
        request(
            nsqd_http,
            "/channel/create",
            method="POST",
            topic=topic,
            channel=channel,
            partition=str(partition),
        )

    def writable() -> bool:
        try:
            document = http_json(lookupd_http, "/lookup", topic=topic, access="w")
        except OSError:
            return False
        return len(document.get("partitions") or {}) == partitions

    poll(writable, f"nsqlookupd to list every partition of {topic} to writers", timeout=timeout)


def http_request(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    """A blocking HTTP request to a daemon on 127.0.0.1; the body of its 2xx answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body if method != "GET" else None, method=method
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


class V2Connection:
    """A blocking V2 client over a real socket, for wire-level tests."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.decoder = FrameDecoder()
        self._frames: list[Frame] = []
        self.sock.sendall(MAGIC_V2)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> Frame:
        while not self._frames:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection closed by nsqd")
            self._frames.extend(self.decoder.receive_data(data))
        return self._frames.pop(0)

    def read_response(self) -> Frame:
        """The next non-message, non-heartbeat frame."""
        while True:
            frame = self.read_frame()
            if frame.frame_type != FRAME_TYPE_MESSAGE and frame.data != b"_heartbeat_":
                return frame

    def read_messages(self, count: int) -> list[DecodedMessage]:
        messages = []
        while len(messages) < count:
            frame = self.read_frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                messages.append(decode_message(frame.data))
        return messages

    def is_closed_by_peer(self) -> bool:
        """True once nsqd has closed the connection (reads EOF), after any pending frames."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self._frames.extend(self.decoder.receive_data(data))
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def free_cluster_port_offset() -> int:
    """A port offset at which every port of `make run-cluster` is free on 127.0.0.1."""
    from nsqpy.tools.local_cluster import replicated_daemons

    base = [(name, args, url) for name, args, url in replicated_daemons(Path("/x"), "/e")]
    ports = {
        int(part.split(":")[1].rstrip("/").split("/")[0])
        for _name, args, url in base
        for text in (*args, url)
        for part in text.replace("http://", "").split()
        if part.count(":") == 1 and "127.0.0.1:" in part
    }
    # Below the ephemeral range: nsqd 2 of the README's demo restarts on its ports.
    return port_offset(ports)


def start_cluster_runner(
    data: Path, offset: int, *extra: str, stdout: int | IO[str] = subprocess.PIPE
) -> subprocess.Popen:
    """`make run-cluster`'s runner (`python -m nsqpy.tools.local_cluster --replicated`), its
    documented ports moved by `offset` and its data in `data`, in a session of its own (so a
    SIGINT to its group stops it as Ctrl-C would); commands go to its standard input."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsqpy.tools.local_cluster",
            "--replicated",
            f"--port-offset={offset}",
            *extra,
        ],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "NSQPY_DATA": str(data)},
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def cluster_stats(lookupd: str) -> dict:
    """nsqlookupd's `/cluster/stats` at `lookupd` (host:port), or {} while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{lookupd}/cluster/stats", timeout=2) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return {}


def pid_listening(port: int) -> int:
    """The process with a listening TCP socket on 127.0.0.1:`port` (through /proc)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            inode = fields[9]
    assert inode is not None, f"nothing listens on {port}"
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == f"socket:[{inode}]":
                return int(fd.parent.parent.name)
        except OSError:
            continue
    raise AssertionError(f"no process owns port {port}")
