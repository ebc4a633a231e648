"""A TCP proxy that can black-hole its links, for the chaos tests: a network cut that neither
closes nor refuses connections (the hardest kind to notice), then heals.

It listens on an ephemeral port of 127.0.0.1 and forwards each connection to `target`, one
thread per direction. `blackhole()` stops it moving any byte either way while the
connections stay open, as a dead switch would; new connections are accepted and stall too.
`heal()` forwards again, starting with what waited: as TCP retransmits what a dead link
dropped once the link is back, nothing sent on a connection is lost, only late.
"""

import socket
import threading


class BlackholeProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        # Set while bytes flow; cleared by `blackhole()`.
        self._healed = threading.Event()
        self._healed.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        self._healed.clear()

    def heal(self) -> None:
        self._healed.set()

    def close(self) -> None:
        self._closed.set()
        self._healed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _address = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.extend((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, destination: socket.socket) -> None:
        try:
            while True:
                self._healed.wait()
                data = source.recv(65536)
                if not data:
                    break
                self._healed.wait()
                destination.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, destination):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
