"""`nsqd --workers=N` (N > 1): the process that binds the listeners and keeps N workers
running (docs/design.md §15).

Each worker is a whole nsqd in a process of its own (`nsqd/worker.py`), serving the listeners
this process bound and owning the topics whose name hashes to it. This process holds what the
node has once: the listeners, the one registration with each nsqlookupd (the union of what
its workers report over their control sockets), and the table of the workers' private HTTP
ports. A worker that dies is started again; it reopens its topics from `nsqd.dat` and their
files, so what it acknowledged to disk is kept.
"""

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys

import trio

from nsqpy.common.version import VERSION
from nsqpy.daemon.net import format_address, open_listener
from nsqpy.nsqd.cluster import open_rpc_listeners
from nsqpy.nsqd.data_path import (
    DataPathError,
    data_incarnation,
    mark_clean_stop,
    prepare_data_path,
)
from nsqpy.nsqd.lookup import LookupPeers
from nsqpy.nsqd.metadata import (
    MetadataError,
    encode_metadata,
    read_metadata,
    recover_metadata,
    write_metadata,
)
from nsqpy.nsqd.options import Options, worker_count
from nsqpy.nsqd.topology_store import fold_journals
from nsqpy.nsqd.worker import (
    WORKER_ENVIRONMENT,
    WorkerSetup,
    control_messages,
    encode_control,
)

# A worker that keeps dying is started again at most this often.
RESTART_DELAY = 1.0
# How often the workers hear which nsqlookupds answer (for a new topic's channels).
LOOKUPD_REFRESH = 1.0
# How often a cluster node's supervisor looks for a worker whose event loop stood still.
WATCH_INTERVAL = 0.25

Registration = tuple[str, str | None, int]


class Supervisor:
    def __init__(self, options: Options, log: logging.Logger, argv: list[str]) -> None:
        self.options = options
        self.log = log
        self.count = worker_count(options.workers)
        self.argv = argv
        self.hostname = socket.gethostname()
        self.data_path = options.effective_data_path()
        self.token = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.secret = secrets.token_urlsafe(24)
        self.tcp_address = ""
        self.http_address = ""
        self.rpc_fds: list[int] = []
        # Each worker's health, as it last said (`nsqd/health.py`): `/ping` is the node's.
        self._health: dict[int, str] = {}
        self.lookup_peers = LookupPeers(self)
        self.peers_http: dict[int, str] = {}
        self._registrations: dict[int, set[Registration]] = {}
        self._controls: dict[int, trio.SocketStream] = {}
        self._processes: dict[int, subprocess.Popen] = {}
        self._telling = trio.Lock()
        self._all_ready = trio.Event()
        self._shutdown = trio.Event()
        self._exiting = False
        # The workers sent SIGTERM since the stop began.
        self._stopped: set[int] = set()
        # The workers that exited with status 0 once the stop began.
        self._clean_exits = 0
        # When each worker last said anything (it beats every `BEAT_INTERVAL`).
        self._heard: dict[int, float] = {}

    # -- what nsqlookupd is told (`nsqd/lookup.py` LookupHost) --------------------------------

    @property
    def tcp_port(self) -> int:
        return self.options.broadcast_tcp_port or int(self.tcp_address.rsplit(":", 1)[1])

    @property
    def http_port(self) -> int:
        return self.options.broadcast_http_port or int(self.http_address.rsplit(":", 1)[1])

    def registrations(self) -> list[Registration]:
        return sorted(
            {entry for entries in self._registrations.values() for entry in entries},
            key=lambda entry: (entry[0], entry[2], entry[1] or ""),
        )

    # -- life ------------------------------------------------------------------------------------

    async def serve(self) -> None:
        options = self.options
        prepare_data_path(self.data_path)
        try:
            topics = read_metadata(self.data_path)
        except MetadataError as error:
            # Recovered once, here, before any worker reads it.
            topics = recover_metadata(self.data_path, error, self.log)
            write_metadata(self.data_path, encode_metadata(topics, VERSION))
        # The journals of a run that ended without writing nsqd.dat (a kill -9), folded in
        # before any worker starts one of its own: each worker's then names only its topics.
        fold_journals(self.data_path, topics, self.log)
        if options.cluster_leadership_addresses:
            # The node's run begins here, once, for every worker (`data_incarnation`): a
            # worker that read an incarnation this could not renew would prove what it holds.
            try:
                data_incarnation(self.data_path, starting=True, log=self.log)
            except OSError as error:
                raise DataPathError(
                    f"--data-path {self.data_path}: cannot record its incarnation: {error}"
                ) from None
        tcp = await open_listener(options.tcp_address)
        http = await open_listener(options.http_address)
        https = None
        if options.tls_cert:
            https = await open_listener(options.https_address)
        # A cluster node's replication port: its peers' connections are handed to the worker
        # that owns the partition they are about (`nsqd/peer_server.py`).
        rpc = await open_rpc_listeners(options) if options.cluster_leadership_addresses else []
        self.tcp_address = format_address(tcp.socket.getsockname())
        self.http_address = format_address(http.socket.getsockname())
        fds = (tcp.socket.fileno(), http.socket.fileno(), https.socket.fileno() if https else -1)
        self.rpc_fds = [listener.socket.fileno() for listener in rpc]
        try:
            async with trio.open_nursery() as workers:
                for index in range(self.count):
                    workers.start_soon(self._keep_worker, index, fds)
                await self._all_ready.wait()
                if self._exiting:
                    return  # stopped while starting
                # Only now: a client that connects on seeing these lines finds every worker.
                self.log.info("TCP: listening on %s", self.tcp_address)
                self.log.info("HTTP: listening on %s", self.http_address)
                if https is not None:
                    address = format_address(https.socket.getsockname())
                    self.log.info("HTTPS: listening on %s", address)
                if rpc:
                    address = format_address(rpc[0].socket.getsockname())
                    self.log.info("RPC: listening on %s", address)
                self.log.info("WORKERS: %d processes share the topics", self.count)
                async with trio.open_nursery() as services:
                    services.start_soon(self.lookup_peers.run, options.lookupd_tcp_address)
                    services.start_soon(self._tell_lookupd_addresses)
                    if options.cluster_leadership_addresses:
                        services.start_soon(self._watch_workers, options.cluster_node_ttl)
                    await self._shutdown.wait()
                    services.cancel_scope.cancel()
                self._stop_workers()
            if options.cluster_leadership_addresses and self._clean_exits == self.count:
                # Every worker stopped cleanly, its writes made durable.
                mark_clean_stop(self.data_path)
        finally:
            for listener in (tcp, http, https, *rpc):
                if listener is not None:
                    with trio.CancelScope(shield=True):
                        await listener.aclose()

    def shutdown(self) -> None:
        self._shutdown.set()
        if not self._all_ready.is_set():
            self._stop_workers()
            self._all_ready.set()

    def _stop_workers(self) -> None:
        """Each worker writes its messages and its share of nsqd.dat, then exits; its task
        ends with it. In a cluster, worker 0 holds the node's lease and stops last
        (`_stop_lease_holder`), so the master moves no worker's partitions for a lease
        released before that worker's hand-overs end."""
        self._exiting = True
        holder = 0 if self.options.cluster_leadership_addresses else None
        for index, process in list(self._processes.items()):
            if index != holder or len(self._processes) == 1:
                self._stopped.add(index)
                process.send_signal(signal.SIGTERM)

    def _stop_lease_holder(self) -> None:
        """Once the other workers are gone, the last one left stops too."""
        if self._exiting and len(self._processes) == 1:
            ((index, process),) = self._processes.items()
            if index not in self._stopped:
                self._stopped.add(index)
                process.send_signal(signal.SIGTERM)

    async def _keep_worker(self, index: int, fds: tuple[int, int, int]) -> None:
        while not self._exiting:
            started = trio.current_time()
            status = await self._run_worker(index, fds)
            if self._exiting:
                self._clean_exits += status == 0
                return
            if not self._all_ready.is_set():
                # It said why (a corrupt file, a data path it cannot write): nsqd cannot start.
                raise OSError(f"worker {index} exited with status {status} while starting")
            self.log.error("WORKER(%d): exited with status %s; starting it again", index, status)
            await trio.sleep(max(0.0, RESTART_DELAY - (trio.current_time() - started)))

    async def _run_worker(self, index: int, fds: tuple[int, int, int]) -> int:
        ours, theirs = socket.socketpair()
        setup = WorkerSetup.encode(
            index, self.count, self.token, (theirs.fileno(), *fds), self.secret, self.rpc_fds
        )
        environment = {**os.environ, WORKER_ENVIRONMENT: setup}
        keep = [theirs.fileno(), *(fd for fd in fds if fd >= 0), *self.rpc_fds]
        with theirs:
            # Started from this thread, not trio's thread pool: a worker asks to die with
            # the thread that started it (`die_with_parent`), and pool threads come and go.
            process = subprocess.Popen(
                [sys.executable, "-m", "nsqpy.nsqd", *self.argv],
                env=environment,
                pass_fds=keep,
                stdin=subprocess.DEVNULL,
                # A terminal's Ctrl-C reaches the supervisor alone, which stops the workers
                # in order; they would otherwise stop by themselves and be started again.
                start_new_session=True,
            )
        self._processes[index] = process
        control = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        self._controls[index] = control
        exited = os.pidfd_open(process.pid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_control, index, control)
                await trio.lowlevel.wait_readable(exited)
                status = process.wait()
                nursery.cancel_scope.cancel()
        finally:
            os.close(exited)
            self._controls.pop(index, None)
            self._processes.pop(index, None)
            self._heard.pop(index, None)
            self._stop_lease_holder()
            self.peers_http.pop(index, None)
            with trio.CancelScope(shield=True):
                await control.aclose()
                if self._health.pop(index, "OK") != "OK":
                    await self._tell_health()
        return status

    async def _read_control(self, index: int, control: trio.SocketStream) -> None:
        async for message in control_messages(control):
            self._heard[index] = trio.current_time()
            await self._apply(index, message)

    async def _watch_workers(self, limit: float) -> None:
        """In a cluster, a worker whose event loop stands still for longer than the node's
        TTL is killed, and started again as a dead one is: the node's lease says that of a
        process that freezes, and only worker 0's event loop keeps the lease alive."""
        checked = trio.current_time()
        while True:
            await trio.sleep(WATCH_INTERVAL)
            now = trio.current_time()
            if now - checked > limit / 2:
                # This process stood still too (the whole node was frozen): the workers'
                # silence says nothing of them.
                self._heard = dict.fromkeys(self._heard, now)
            checked = now
            for index, heard in list(self._heard.items()):
                process = self._processes.get(index)
                if process is not None and now - heard > limit:
                    self.log.error(
                        "WORKER(%d): its event loop stood still for %.1f s; killing it",
                        index,
                        now - heard,
                    )
                    self._heard.pop(index, None)
                    process.kill()

    async def _apply(self, index: int, message: dict) -> None:
        if "registrations" in message:
            entries = {(t, c, p) for t, c, p in message["registrations"]}
            self._registrations[index] = entries
            for topic, channel, partition in sorted(entries, key=str):
                self.lookup_peers.notify("REGISTER", topic, channel, partition)
        if "notify" in message:
            action, topic, channel, partition = message["notify"]
            entries = self._registrations.setdefault(index, set())
            if action == "REGISTER":
                entries.add((topic, channel, partition))
            elif channel is not None:
                entries.discard((topic, channel, partition))
            else:
                entries.difference_update(
                    {entry for entry in entries if entry[0] == topic and entry[2] == partition}
                )
            self.lookup_peers.notify(action, topic, channel, partition)
        if "lookupd" in message:
            addresses = list(message["lookupd"])
            self.options = self.options.replace(lookupd_tcp_address=addresses)
            self.lookup_peers.set_addresses(addresses)
        if "health" in message:
            self._health[index] = message["health"]
            await self._tell_health()
        if "http" in message:
            self.peers_http[index] = message["http"]
            if len(self.peers_http) == self.count:
                self._all_ready.set()
                await self._tell_all(
                    {
                        "peers": {str(i): a for i, a in self.peers_http.items()},
                        "lookupd_http": self.lookup_peers.http_addresses(),
                    }
                )

    async def _tell_health(self) -> None:
        """Every worker's health, as each last said it, to every worker (`NSQD.health`)."""
        await self._tell_all({"health": {str(i): text for i, text in self._health.items()}})

    async def _tell_all(self, message: dict) -> None:
        line = encode_control(message)
        async with self._telling:
            for control in list(self._controls.values()):
                try:
                    await control.send_all(line)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def _tell_lookupd_addresses(self) -> None:
        told: list[str] | None = None
        while True:
            addresses = self.lookup_peers.http_addresses()
            if addresses != told:
                await self._tell_all({"lookupd_http": addresses})
                told = addresses
            await trio.sleep(LOOKUPD_REFRESH)
