"""A TCP proxy that can black-hole its links, for the chaos tests: a network cut that neither
closes nor refuses connections (the hardest kind to notice), then heals.

It listens on an ephemeral port of 127.0.0.1 and forwards each connection to `target`, one
thread per direction. `blackhole()` stops it moving any byte either way while the
connections stay open, as a dead switch would; new connections are accepted and stall too.
`heal()` forwards again, starting with what waited: as TCP retransmits what a dead link
dropped once the link is back, nothing sent on a connection is lost, only late.

`blackhole_from(pid)` stalls only the connections a given process opened (found through
/proc, as `ss -p` finds them): one node's links to a peer cut while the other nodes' links to
the same peer go on.
"""

import os
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
        # Per connection: the client's port, and an event set while its bytes may flow.
        self._links: list[tuple[int, threading.Event]] = []
        self._cut_pids: set[int] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        self._healed.clear()

    def heal(self) -> None:
        self._healed.set()
        with self._lock:
            self._cut_pids.clear()
            for _port, flowing in self._links:
                flowing.set()

    def blackhole_from(self, pid: int) -> None:
        """Stall the connections process `pid` opened to this proxy, now and from now on
        until `heal()`."""
        with self._lock:
            self._cut_pids.add(pid)
            links = list(self._links)
        for port, flowing in links:
            if socket_owner(port, self.port, pid):
                flowing.clear()

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
                client, peer = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            flowing = threading.Event()
            client_port = peer[1]
            with self._lock:
                cut = set(self._cut_pids)
            if not any(socket_owner(client_port, self.port, pid) for pid in cut):
                flowing.set()
            with self._lock:
                self._sockets.extend((client, upstream))
                self._links.append((client_port, flowing))
            for ends in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(*ends, flowing), daemon=True).start()

    def _pipe(
        self, source: socket.socket, destination: socket.socket, flowing: threading.Event
    ) -> None:
        try:
            while True:
                self._healed.wait()
                flowing.wait()
                data = source.recv(65536)
                if not data:
                    break
                self._healed.wait()
                flowing.wait()
                destination.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, destination):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def socket_owner(local_port: int, remote_port: int, pid: int) -> bool:
    """Whether process `pid` holds the TCP socket 127.0.0.1:`local_port` → :`remote_port`."""
    wanted = f":{local_port:04X}", f":{remote_port:04X}"
    inode = None
    try:
        with open("/proc/net/tcp") as table:
            for line in table:
                fields = line.split()
                if (
                    len(fields) > 9
                    and fields[1].endswith(wanted[0])
                    and fields[2].endswith(wanted[1])
                ):
                    inode = fields[9]
                    break
    except OSError:
        return False
    if inode is None:
        return False
    target = f"socket:[{inode}]"
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False
