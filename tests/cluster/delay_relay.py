"""A TCP relay that adds latency, for the network fault tests (`tests/cluster/netns.py`: this
kernel has no netem). Run in a host's namespace as
`python -m tests.cluster.delay_relay LISTEN_HOST:PORT TARGET_HOST:PORT CONTROL_FILE`: it
forwards every connection to the target, each chunk both ways held for the milliseconds
CONTROL_FILE says (0, or no file: none), in order, as a slow link would."""

import queue
import socket
import sys
import threading
import time
from pathlib import Path


class Delay:
    def __init__(self, control: Path) -> None:
        self.control = control
        self.seconds = 0.0
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        while True:
            try:
                self.seconds = int(self.control.read_text().strip() or 0) / 1000
            except (OSError, ValueError):
                self.seconds = 0.0
            time.sleep(0.05)


def pipe(source: socket.socket, sink: socket.socket, delay: Delay) -> None:
    """Copy `source` to `sink`, each chunk sent once it is `delay` old (read at once, so a
    chunk's delay does not add to the next one's)."""
    chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
    threading.Thread(target=_send_when_due, args=(chunks, sink), daemon=True).start()
    try:
        while True:
            data = source.recv(65536)
            chunks.put((time.monotonic() + delay.seconds, data))
            if not data:
                break
    except OSError:
        chunks.put((time.monotonic(), b""))


def _send_when_due(chunks: "queue.Queue[tuple[float, bytes]]", sink: socket.socket) -> None:
    try:
        while True:
            due, data = chunks.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def main() -> None:
    listen, target, control = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    host, port = listen.rsplit(":", 1)
    target_host, target_port = target.rsplit(":", 1)
    delay = Delay(control)
    server = socket.create_server((host, int(port)))
    print(f"RELAY: listening on {listen}", file=sys.stderr, flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((target_host, int(target_port)), timeout=5)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(source, sink, delay), daemon=True).start()


if __name__ == "__main__":
    main()
