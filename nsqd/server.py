"""The nsqd daemon: topics, clients, listeners and the background loops, on one trio nursery.

`NSQD.serve()` is the whole life of the daemon (docs/design.md §2): load the metadata
and diskqueues, bind the listeners and log their real addresses, run the TCP listener, the
queue-scan loop, the metadata writer and the diskqueue sync timer in one nursery, and on
shutdown stop accepting, close clients, write every message to disk, sync, write the
metadata last.
"""

import logging
import math
import random
import socket
import time
from collections.abc import Callable
from functools import partial

import trio

from nsqpy import network
from nsqpy.common.frame import FRAME_TYPE_ERROR, encode_frame
from nsqpy.common.names import is_ephemeral, is_valid_name
from nsqpy.daemon.free_memory import scavenge_forever
from nsqpy.daemon.http_server import RequestRouter, serve_http
from nsqpy.daemon.log import first_error, keep_printable
from nsqpy.daemon.net import accept_forever, format_address, open_listener, peer_address
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.client import Client, number_client_ids
from nsqpy.nsqd.cluster import ClusterNode
from nsqpy.nsqd.cluster_partition import NotLedHere
from nsqpy.nsqd.connection import Resume, V2Connection
from nsqpy.nsqd.connection_poller import ConnectionPoller, polls_connections
from nsqpy.nsqd.data_path import mark_clean_stop, prepare_data_path
from nsqpy.nsqd.handoff import Handoff
from nsqpy.nsqd.heartbeats import HeartbeatClock
from nsqpy.nsqd.http_api import HTTPAPI, TLSRequiredRouter
from nsqpy.nsqd.idle_reads import IdleReads, polls_idle_reads
from nsqpy.nsqd.lookup import LookupChannelsError, LookupPeers, topic_channels
from nsqpy.nsqd.options import Options, build_flags
from nsqpy.nsqd.placement import placement_for
from nsqpy.nsqd.queue_scan import QueueScanner
from nsqpy.nsqd.replication import Replication
from nsqpy.nsqd.stats import gc_pauses
from nsqpy.nsqd.statsd import StatsdPusher
from nsqpy.nsqd.storage import Storage
from nsqpy.nsqd.tls import server_context
from nsqpy.nsqd.topic import Topic
from nsqpy.nsqd.topic_registry import TopicRegistry
from nsqpy.nsqd.topology_store import TopologyStore
from nsqpy.nsqd.worker import Worker, WorkerLookup
from nsqpy.nsqd.worker_http import WorkerRouter


class NSQD:
    def __init__(
        self, options: Options, log: logging.Logger | None = None, worker: Worker | None = None
    ) -> None:
        self.options = options
        # One of `--workers` (`nsqd/worker.py`), or None: the whole nsqd in this process.
        self.worker = worker
        self.log = keep_printable(log or logging.getLogger("nsqd"))
        self.data_path = options.effective_data_path()
        self.registry = TopicRegistry()
        # name -> the topic's default (lowest) local partition, which classic commands use
        self.topics = self.registry.defaults
        self.clients: dict[int, Client] = {}
        self.exiting = False
        self.random = random.Random()
        self.start_time_precise = time.time()
        self.start_time = int(self.start_time_precise)
        self.tcp_address: str | None = None
        self.http_address: str | None = None
        self.hostname = socket.gethostname()
        # The storage engines, and the writes a publish waits for (`nsqd/storage.py`).
        self.storage = Storage(options, self.log)
        # Youzan's POST /disable/write: None, "all" or "ordered" (docs/protocol.md §5.6).
        self.write_disabled: str | None = None
        self.queue_scanner = QueueScanner(self)
        self.heartbeats = HeartbeatClock()
        # Idle plain connections' reads, polled together (`nsqd/idle_reads.py`).
        self.idle_reads = IdleReads() if polls_idle_reads() else None
        self.lookup_peers = LookupPeers(self) if worker is None else WorkerLookup(self, worker)
        if worker is not None:
            number_client_ids(first=worker.index + 1, step=worker.count)
            self.storage.health.on_change = lambda text: worker.tell({"health": text})
        self.cluster = ClusterNode(self)
        # Where a topic is served: here, by another worker, or refused (`nsqd/placement.py`).
        self.placement = placement_for(self)
        self.tls_context = server_context(options)
        self.auth_enabled = bool(options.auth_http_address)
        self.https_address: str | None = None
        gc_pauses.install()
        self._connections: set[V2Connection] = set()
        # Accepts and serves the plain V2 connections (`nsqd/connection_poller.py`).
        self.connection_poller: ConnectionPoller | None = None
        # nsqd.dat and its journal (`nsqd/topology_store.py`).
        self.topology = TopologyStore(self)
        self._shutdown = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- topics -----------------------------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic a classic command means: its lowest local partition, created as the
        classic partition 0 on first use (docs/protocol.md §8 #2, #3)."""
        topic = self.registry.default(name)
        if topic is None:
            topic = self.create_partition(name, 0)
        return topic

    def topic_for_client(self, name: str) -> Topic:
        """`get_topic` for a client's classic command; NotLedHere when this is a cluster node
        that may not create it (`Placement.refuses_to_create`)."""
        topic = self.registry.default(name)
        if topic is None and self.placement.refuses_to_create(name):
            raise NotLedHere(name)
        return topic if topic is not None else self.get_topic(name)

    def get_partition(self, name: str, partition: int) -> Topic | None:
        """An explicit partition, never created on the fly; -1 means the default one."""
        if partition == -1:
            return self.registry.default(name)
        return self.registry.get(name, partition)

    def create_partition(
        self,
        name: str,
        partition: int,
        *,
        partitioned: bool = False,
        ordered: bool = False,
        ext: bool = False,
        sync_every: int = 0,
        replication: Callable[[Topic], Replication] | None = None,
    ) -> Topic:
        """A partition, created unless it exists; `replication` makes the new one's (a
        cluster's), before nsqlookupd hears of it."""
        existing = self.registry.get(name, partition)
        if existing is not None:
            return existing
        topic = Topic(
            self,
            name,
            partition,
            partitioned=partitioned,
            ordered=ordered,
            ext=ext,
            sync_every=sync_every,
        )
        if replication is not None:
            topic.replication = replication(topic)
        self.registry.add(topic)
        if partitioned:
            self.log.info("TOPIC(%s): created partition %d", name, partition)
        else:
            self.log.info("TOPIC(%s): created", name)
        if self._nursery is not None:
            self._nursery.start_soon(topic.pump)
            if not partitioned and not self.topology.loading:
                self._precreate_channels(topic)
        self.topology_changed(topic)
        if not topic.is_cluster_follower:
            self.lookup_peers.notify("REGISTER", name, None, partition)
        return topic

    def register_partition(self, topic: Topic) -> None:
        """nsqlookupd learns the partition and its channels (a cluster node that became its
        leader)."""
        self.lookup_peers.notify("REGISTER", topic.name, None, topic.partition)
        for channel in topic.channels:
            self.lookup_peers.notify("REGISTER", topic.name, channel, topic.partition)

    def unregister_partition(self, topic: Topic) -> None:
        """nsqlookupd forgets the partition (a cluster node that no longer leads it)."""
        for channel in topic.channels:
            self.lookup_peers.notify("UNREGISTER", topic.name, channel, topic.partition)
        self.lookup_peers.notify("UNREGISTER", topic.name, None, topic.partition)

    def _precreate_channels(self, topic: Topic) -> None:
        """Go's GetTopic: a new topic first gets the channels the cluster's nsqlookupds know
        for it, so a channel consumed on another nsqd receives what is published here too.
        The topic holds its messages until then (the publish that created it is answered at
        once, without waiting on the network)."""
        addresses = self.lookup_peers.http_addresses()
        if not addresses:
            if self.options.lookupd_tcp_address:
                self.log.error(
                    "no available nsqlookupd to query for channels to pre-create for topic %s",
                    topic.name,
                )
            return
        nursery = self._nursery
        assert nursery is not None  # create_partition asks only while serving
        topic.started = False
        nursery.start_soon(self._create_lookupd_channels, topic, addresses)

    async def _create_lookupd_channels(self, topic: Topic, addresses: list[str]) -> None:
        timeout = (
            self.options.http_client_connect_timeout + self.options.http_client_request_timeout
        )
        channels: list[str] = []
        # `except*`: the lookupds are asked side by side, in a nursery.
        try:
            channels = await topic_channels(addresses, topic.name, timeout)
        except* LookupChannelsError as group:
            error = first_error(group)
            self.log.warning(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s",
                topic.name,
                error,
            )
            channels = getattr(error, "channels", [])
        try:
            if not topic.deleted:
                for name in channels:
                    if is_valid_name(name) and not is_ephemeral(name):
                        topic.get_channel(name)
        finally:
            topic.start()

    def write_disabled_for(self, topic: Topic) -> bool:
        mode = self.write_disabled
        return mode == "all" or (mode == "ordered" and topic.ordered)

    def all_partitions(self) -> list[Topic]:
        """Every partition of every topic, by name then partition."""
        return list(self.registry)

    def delete_topic(self, name: str, partition: int | None = None) -> None:
        """Delete one partition, or (None) the whole topic, files and all."""
        doomed = (
            [topic.partition for topic in self.registry.partitions(name)]
            if partition is None
            else [partition]
        )
        for number in doomed:
            topic = self.registry.remove(name, number)
            if topic is None:
                continue
            self.log.info("TOPIC(%s): deleting", name)
            topic.delete()
            self.topology_changed(topic)
            self.lookup_peers.notify("UNREGISTER", name, None, number)

    def registrations(self) -> list[tuple[str, str | None, int]]:
        """What nsqlookupd must know: each channel, or the partition alone when it has none."""
        entries: list[tuple[str, str | None, int]] = []
        for topic in self.all_partitions():
            if topic.is_cluster_follower:
                continue  # in a cluster, writers and readers go to the leader only
            if topic.channels:
                entries.extend((topic.name, channel, topic.partition) for channel in topic.channels)
            else:
                entries.append((topic.name, None, topic.partition))
        return entries

    def all_channels(self) -> list[Channel]:
        return [c for topic in self.all_partitions() for c in topic.channels.values()]

    def topology_changed(self, topic: Topic, *, stored: bool = True) -> None:
        """A topic partition or one of its channels came, went, paused or unpaused: rescan,
        and keep it unless it changed nothing `nsqd.dat` holds (`stored` False: an ephemeral
        channel; an ephemeral topic is never held)."""
        self.queue_scanner.refresh_needed = True
        if stored and not topic.ephemeral:
            self.topology.changed(topic)

    # -- options and health -------------------------------------------------------------------

    @property
    def tcp_port(self) -> int:
        return self.options.broadcast_tcp_port or _port_of(self.tcp_address)

    @property
    def http_port(self) -> int:
        return self.options.broadcast_http_port or _port_of(self.http_address)

    @property
    def health(self) -> str:
        """`OK`, or `NOK - <why>` while the disk refuses writes (`nsqd/health.py`); with
        `--workers`, the node's: a worker's NOK is every worker's."""
        text = self.storage.health.text
        if text != "OK" or self.worker is None:
            return text
        return self.worker.peers_health()

    def set_options(self, **changes) -> None:
        """PUT /config: swap in new options (Go's swapOpts)."""
        self.options = self.options.replace(**changes)
        self.storage.options = self.options
        if "lookupd_tcp_address" in changes:
            self.lookup_peers.set_addresses(self.options.lookupd_tcp_address)
        if "log_level" in changes:
            from nsqpy.daemon.log import LOG_LEVELS

            self.log.setLevel(LOG_LEVELS[self.options.log_level])

    def option_by_config_name(self, name: str):
        """GET /config/<cfg name>: the value as Go marshals it (durations in ns, the log
        level as lg's number). KeyError for an unknown name."""
        for flag in _FLAGS.flags.values():
            if flag.config_key == name:
                break
        else:
            raise KeyError(name)
        value = getattr(self.options, flag.dest)
        if flag.dest == "log_level":
            return _GO_LOG_LEVELS[value]
        if flag.kind.value == "duration":
            return int(round(value * 1e9))
        return value

    # -- clients ----------------------------------------------------------------------------

    def add_client(self, client: Client) -> None:
        self.clients[client.id] = client

    def remove_client(self, client: Client) -> None:
        self.clients.pop(client.id, None)

    # -- durability -------------------------------------------------------------------------

    async def clean_logs(
        self, partitions: list[Topic] | None = None, *, greedy: bool = False
    ) -> int:
        """Retention of log topics (docs/design.md §13): remove segments every channel has
        confirmed past that are older than `--retention-days` or beyond
        `--retention-size-per-day` × days of consumed data; `greedy` (`/topic/greedyclean`)
        removes every consumed segment. A partition without channels is never cleaned. How
        many segments went."""
        options = self.options
        removed = 0
        failed: OSError | None = None
        for topic in partitions if partitions is not None else self.all_partitions():
            if topic.deleted:
                continue
            if greedy:
                keep, older_than = -1.0, math.inf
            else:
                # A cluster topic's own retention (`/topic/meta/update?retention=`) wins.
                days = topic.retention_days or options.retention_days
                keep = float(options.retention_size_per_day * max(days, 1))
                older_than = time.time() - days * 86400
            try:
                removed += await topic.queue.clean(
                    keep_bytes=keep,
                    older_than=older_than,
                    move_delayed=not topic.is_cluster_follower,
                )
            except Exception as error:
                if topic.deleted:
                    # `/topic/delete` closed and removed it while it was being cleaned (its
                    # index, its files): nothing is left to clean.
                    continue
                if not isinstance(error, OSError):
                    raise
                # Its new start could not be written (a full disk): nothing of it was
                # removed, the next run tries again, the other partitions go on.
                self.log.error(
                    "TOPIC(%s) partition %d: retention failed - %s",
                    topic.name,
                    topic.partition,
                    error,
                )
                failed = error
        if failed is not None and partitions is not None:
            raise failed
        return removed

    async def _retention_timer(self) -> None:
        """Youzan checks retention every 10 minutes."""
        while True:
            await trio.sleep(RETENTION_INTERVAL)
            await self.clean_logs()

    async def _hour_timer(self) -> None:
        """Closes each hour of the partitions' hourly published bytes at its end."""
        while True:
            await trio.sleep(3600 - time.time() % 3600 + 0.5)
            hour = time.localtime().tm_hour
            for topic in self.all_partitions():
                topic.hourly_bytes.close_hours(hour, topic.message_bytes)

    async def _sync_timer(self) -> None:
        """Go's diskqueue syncs dirty queues every `--sync-timeout` even when writes stop."""
        while True:
            await trio.sleep(self.options.sync_timeout)
            for topic in self.all_partitions():
                try:
                    await topic.sync_dirty()
                except OSError as error:
                    # Each sync job says why it failed and makes health NOK; a disk that
                    # fails one it did not foresee must not end nsqd either.
                    self.log.error("TOPIC(%s): failed to sync - %s", topic.name, error)
                    self.storage.health.sync_done(f"TOPIC({topic.name}) failed to sync - {error}")

    async def persist_metadata(self) -> None:
        """Write `nsqd.dat` now (HTTP pause and unpause do, as Go's handlers do)."""
        await self.topology.persist()

    def load_metadata(self) -> None:
        """Recreate the topics and channels of `nsqd.dat` and of its journal; their queues
        reopen with them.

        An unreadable or corrupt `nsqd.dat` never stops nsqd (Go nsqd refuses to start): it
        is set aside as `nsqd.dat.corrupt`, the topics and channels are found again from
        their diskqueue files (unpaused: the pause flags were only in the lost file), and a
        fresh `nsqd.dat` is written once nsqd runs.
        """
        topics = self.topology.read()
        self.topology.loading = True
        try:
            for topic_meta in topics:
                if self.worker is not None and not self.worker.owns(
                    topic_meta.name, topic_meta.partition or 0
                ):
                    continue
                if not is_valid_name(topic_meta.name):
                    self.log.warning("skipping creation of invalid topic %s", topic_meta.name)
                    continue
                if topic_meta.partition is None:
                    topic = self.get_topic(topic_meta.name)
                else:
                    topic = self.create_partition(
                        topic_meta.name,
                        topic_meta.partition,
                        partitioned=True,
                        ordered=topic_meta.ordered,
                        ext=topic_meta.ext,
                        sync_every=topic_meta.sync_every,
                    )
                    topic.queue.continue_offsets(topic_meta.next_offset)
                if topic_meta.paused:
                    topic.paused = True
                for channel_meta in topic_meta.channels:
                    if not is_valid_name(channel_meta.name):
                        self.log.warning(
                            "skipping creation of invalid channel %s", channel_meta.name
                        )
                        continue
                    channel = topic.get_channel(channel_meta.name)
                    if channel_meta.paused:
                        channel.paused = True
                    channel.max_attempts = channel_meta.max_attempts
                    channel.dead_letter_topic = channel_meta.dead_letter_topic
                    channel.skipped = channel_meta.skipped
                    if channel_meta.in_order:
                        channel.deliver_in_order()
                    if channel_meta.rate_limit_kb is not None:
                        channel.set_rate_limit(channel_meta.rate_limit_kb)
                    channel.client_limits = dict(channel_meta.client_limits)
        finally:
            self.topology.loading = False

    # -- life -------------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        options = self.options
        log = self.log
        prepare_data_path(self.data_path)
        self.load_metadata()
        worker = self.worker
        # A worker serves the listeners its supervisor bound (and logged).
        listening = log.info if worker is None else log.debug
        tcp_listener = await self._network_listener("TCP", options.tcp_address)
        self.tcp_address = network.listening_on(tcp_listener)
        listening("TCP: listening on %s", self.tcp_address)
        http_listener = await self._network_listener("HTTP", options.http_address)
        self.http_address = network.listening_on(http_listener)
        listening("HTTP: listening on %s", self.http_address)
        http_api = HTTPAPI(self)
        https_listener = None
        if self.tls_context is not None:
            https_listener = await self._listener("HTTPS", options.https_address)
            self.https_address = format_address(https_listener.socket.getsockname())
            listening("HTTPS: listening on %s", self.https_address)
        private_listener = None
        api_router: RequestRouter = http_api.router
        worker_http: dict = {}
        if worker is not None:
            # The other workers send this one the requests for its topics here.
            private_listener = await open_listener("127.0.0.1:0")
            api_router = worker_router = WorkerRouter(self, http_api)
            worker_http = {"mover": worker_router.mover, "on_poller": worker.take_http_poller}
        # --tls-required=true (or a client auth policy): the plain HTTP port only points to
        # the HTTPS one; `tcp-https` means TLS for TCP only (Go's TLSRequiredExceptHTTP).
        plain_router: RequestRouter = (
            TLSRequiredRouter(self)
            if options.tls_required == "true" and self.tls_context is not None
            else api_router
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for topic in self.all_partitions():
                    nursery.start_soon(topic.pump)
                async with trio.open_nursery() as listener_nursery:
                    max_body = max(options.max_body_size, options.max_msg_size)
                    if worker is not None and private_listener is not None:
                        # The other workers' requests and connections first: this worker
                        # takes none from the shared listeners before it knows its peers.
                        listener_nursery.start_soon(
                            partial(
                                serve_http,
                                private_listener,
                                http_api.router,
                                listener_nursery,
                                log,
                                max_body_size=max_body,
                            )
                        )
                        private = format_address(private_listener.socket.getsockname())
                        await nursery.start(worker.run, self, self._handle_handed, private)
                    if polls_connections() and isinstance(tcp_listener, trio.SocketListener):
                        poller = ConnectionPoller(self, tcp_listener.socket, nursery)
                        self.connection_poller = poller
                        listener_nursery.start_soon(poller.run)
                        nursery.start_soon(poller.run_pumps)
                    else:
                        listener_nursery.start_soon(
                            accept_forever, tcp_listener, self._accept_stream, nursery, log, "TCP"
                        )
                    listener_nursery.start_soon(
                        partial(
                            serve_http,
                            http_listener,
                            plain_router,
                            listener_nursery,
                            log,
                            max_body_size=max_body,
                            **(worker_http if plain_router is api_router else {}),
                        )
                    )
                    if https_listener is not None:
                        listener_nursery.start_soon(
                            partial(
                                serve_http,
                                https_listener,
                                api_router,
                                listener_nursery,
                                log,
                                max_body_size=max_body,
                                tls_context=self.tls_context,
                            )
                        )
                    nursery.start_soon(self.queue_scanner.run)
                    nursery.start_soon(self.heartbeats.run)
                    if self.idle_reads is not None:
                        nursery.start_soon(self.idle_reads.run)
                    nursery.start_soon(self.topology.run)
                    nursery.start_soon(scavenge_forever)
                    nursery.start_soon(self._sync_timer)
                    nursery.start_soon(self._retention_timer)
                    nursery.start_soon(self._hour_timer)
                    if self.cluster.enabled:
                        await nursery.start(self.cluster.serve)
                    nursery.start_soon(self.lookup_peers.run, options.lookupd_tcp_address)
                    if options.statsd_address:
                        memory_name = "mem" if worker is None else f"worker_{worker.index}.mem"
                        nursery.start_soon(StatsdPusher(self, memory_name).run)
                    task_status.started(self)
                    await self._shutdown.wait()
                    if self.cluster.enabled:
                        # Still serving: what it leads goes to its followers first, and it
                        # leaves the ISRs it is in, so no partition waits for it to stop.
                        await self.cluster.leave()
                    listener_nursery.cancel_scope.cancel()
                await self._close_connections()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await tcp_listener.aclose()
                await http_listener.aclose()
                if https_listener is not None:
                    await https_listener.aclose()
                if private_listener is not None:
                    await private_listener.aclose()
                await self._persist_on_exit()

    def shutdown(self) -> None:
        """Begin a clean exit (SIGTERM, SIGINT, or an embedding program)."""
        self.exiting = True
        self._shutdown.set()

    def accept_connection(self, sock: socket.socket | int, peer: str) -> V2Connection | None:
        """A V2 connection accepted (`sock` non-blocking, or its descriptor): served by the
        connection poller (and returned), or where there is none by tasks of its own."""
        self.log.info("TCP: new client(%s)", peer)
        nursery = self._nursery
        assert nursery is not None  # accepting starts once nsqd runs
        if len(self._connections) >= self.options.max_conn_for_client:
            nursery.start_soon(self._refuse_connection, sock, peer)
            return None
        connection = V2Connection(self, sock, peer)
        self._connections.add(connection)
        poller = self.connection_poller
        if poller is None:
            nursery.start_soon(self._serve_connection, connection)
            return None
        connection.start_polled(poller)
        return connection

    async def _accept_stream(self, stream: trio.abc.Stream) -> None:
        """Where there is no connection poller: trio's accepted stream, its socket served."""
        peer = peer_address(stream)
        if not isinstance(stream, trio.SocketStream):
            # A stream with no socket under it (the cluster simulator's network).
            assert isinstance(stream, trio.abc.HalfCloseableStream)
            self.log.info("TCP: new client(%s)", peer)
            await self._serve_connection(V2Connection.over_stream(self, stream, peer))
            return
        raw = stream.socket
        sock = socket.socket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        sock.setblocking(False)
        self.accept_connection(sock, peer)

    def serve_promoted(self, connection: V2Connection, resume: Resume) -> None:
        """A polled connection that must wait for something: its own tasks from now on."""
        assert self._nursery is not None
        self._nursery.start_soon(self._serve_connection, connection, resume)

    def connection_ended(self, connection: V2Connection) -> None:
        self._connections.discard(connection)
        if connection.handoff is None:
            self.log.info("PROTOCOL(V2): [%s] exiting ioloop", connection.client.remote_address)

    async def _refuse_connection(self, sock: socket.socket | int, peer: str) -> None:
        """Youzan's --max-conn-for-client: after the client's magic, an error frame, closed.
        (Closing before reading what the client sent could reset the connection and lose
        the frame.)"""
        self.log.warning("PROTOCOL(V2) too much clients: %s", peer)
        if isinstance(sock, int):
            sock = socket.socket(fileno=sock)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        with trio.move_on_after(5):
            try:
                await stream.receive_some(4)
                await stream.send_all(
                    encode_frame(FRAME_TYPE_ERROR, b"too much client connections")
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await stream.aclose()

    async def _handle_handed(self, sock: socket.socket, handoff: Handoff) -> None:
        """A connection another worker handed over (`nsqd/handoff.py`)."""
        if handoff.rpc:
            await self.cluster.peers.serve_handed(sock, handoff)
            return
        sock.setblocking(False)
        await self._serve_connection(V2Connection(self, sock, handoff.remote_address, handoff))

    async def _serve_connection(
        self, connection: V2Connection, resume: Resume | None = None
    ) -> None:
        self._connections.add(connection)
        try:
            await connection.run(resume)
        except Exception:
            # A bug must cost one connection, never the daemon and everyone else on it.
            self.log.exception(
                "PROTOCOL(V2): [%s] internal error, closing the connection",
                connection.client.remote_address,
            )
        finally:
            self.connection_ended(connection)

    async def _listener(self, kind: str, address: str) -> trio.SocketListener:
        inherited = self.worker.listener_socket(kind) if self.worker is not None else None
        if inherited is None:
            return await open_listener(address)
        return trio.SocketListener(trio.socket.from_stdlib_socket(inherited))

    async def _network_listener(self, kind: str, address: str) -> trio.abc.Listener:
        """The TCP or HTTP listener on the daemon's network (`nsqpy/network.py`): sockets,
        or a cluster simulator's, whose node IDs carry its ports."""
        through = network.current()
        if through is network.SOCKETS:
            return await self._listener(kind, address)
        return await through.listen(address)

    async def _close_connections(self) -> None:
        for connection in list(self._connections):
            connection.close()
        # Each connection's own task finishes its cleanup at the next scheduling point.
        while self._connections:
            await trio.lowlevel.checkpoint()

    async def _persist_on_exit(self) -> None:
        """Go's NSQD.Exit: every topic and channel flushes its messages to disk and closes
        its diskqueue (which syncs), then the metadata is written."""
        self.exiting = True
        flushed = 0
        for topic in self.all_partitions():
            flushed += topic.flush()
        if flushed:
            self.log.info("NSQ: flushed %d messages to disk", flushed)

        def close_all() -> bool:
            closed = True
            for topic in self.all_partitions():
                try:
                    topic.close()
                except OSError as error:
                    # A disk that refuses the last writes: the rest still close, and the
                    # exit stays clean (what was acknowledged was written before).
                    self.log.error("TOPIC(%s): failed to close - %s", topic.name, error)
                    closed = False
            # A log that failed a sync in this run may hold writes never made durable.
            return closed and not (self.cluster.enabled and self.cluster.unsynced_logs())

        durable = await network.current().run_sync(close_all)
        self.log.info("NSQ: persisting topic/channel metadata to %s", self.data_path)
        try:
            await self.persist_metadata()
        except OSError as error:
            # The previous nsqd.dat and the journal stay; a full disk must not turn a clean
            # exit into a crash.
            self.log.error("NSQ: failed to persist metadata - %s", error)
            durable = False
        self.topology.close()
        if durable and self.cluster.enabled and self.worker is None:
            # A supervisor marks its node's stop once every worker's ended.
            try:
                mark_clean_stop(self.data_path)
            except OSError as error:
                self.log.error("NSQ: failed to mark the stop clean - %s", error)


_FLAGS = build_flags()
# How often retention looks at the log topics (Youzan's interval).
RETENTION_INTERVAL = 600.0
# lg.LogLevel's numbers, which is how Go's /config/log_level marshals the level.
_GO_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


def _port_of(address: str | None) -> int:
    if not address or ":" not in address:
        return 0
    return int(address.rsplit(":", 1)[1])
