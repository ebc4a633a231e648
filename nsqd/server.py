"""The nsqd daemon: topics, clients, listeners and the background loops, on one trio nursery.

`NSQD.serve()` is the whole life of the daemon (docs/design.md §2): load the metadata
and diskqueues, bind the listeners and log their real addresses, run the TCP listener, the
queue-scan loop, the metadata writer and the diskqueue sync timer in one nursery, and on
shutdown stop accepting, close clients, write every message to disk, sync, write the
metadata last.
"""

import fnmatch
import logging
import math
import os
import random
import socket
import time
from collections.abc import Iterable
from functools import partial

import trio

from nsqpy.common.names import is_ephemeral, is_valid_name
from nsqpy.common.version import VERSION
from nsqpy.daemon.http_server import serve_http
from nsqpy.daemon.log import keep_printable
from nsqpy.daemon.net import accept_forever, format_address, open_listener
from nsqpy.diskqueue import DiskQueue
from nsqpy.nsqd.backend import BackendWriteError, open_backend, write_error
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.client import Client
from nsqpy.nsqd.cluster import UNKNOWN_REPLICA, ClusterNode
from nsqpy.nsqd.data_path import prepare_data_path
from nsqpy.nsqd.heartbeats import HeartbeatClock
from nsqpy.nsqd.http_api import HTTPAPI, TLSRequiredRouter
from nsqpy.nsqd.log_writer import LogWriter, WriteGroup
from nsqpy.nsqd.lookup import LookupChannelsError, LookupPeers, topic_channels
from nsqpy.nsqd.metadata import (
    ChannelMetadata,
    MetadataError,
    TopicMetadata,
    encode_metadata,
    read_metadata,
    scan_log_names,
    scan_queue_names,
    set_aside,
    topics_from_queue_names,
    write_metadata,
)
from nsqpy.nsqd.options import Options, build_flags
from nsqpy.nsqd.protocol_v2 import ProtocolV2
from nsqpy.nsqd.queue_scan import QueueScanner
from nsqpy.nsqd.stats import gc_pauses
from nsqpy.nsqd.statsd import StatsdPusher
from nsqpy.nsqd.tls import server_context
from nsqpy.nsqd.topic import Topic
from nsqpy.nsqd.topic_registry import TopicRegistry
from nsqpy.nsqd.wakeup import Wakeup
from nsqpy.partition_log import log_exists


class NSQD:
    def __init__(self, options: Options, log: logging.Logger | None = None) -> None:
        self.options = options
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
        self.health = "OK"
        # Why health is not OK: the last diskqueue write failed, or the last sync did.
        self._write_error: str | None = None
        self._sync_error: str | None = None
        # Youzan's POST /disable/write: None, "all" or "ordered" (docs/protocol.md §5.6).
        self.write_disabled: str | None = None
        self.queue_scanner = QueueScanner(self)
        self.heartbeats = HeartbeatClock()
        self.lookup_peers = LookupPeers(self)
        self.cluster = ClusterNode(self)
        self.tls_context = server_context(options)
        self.auth_enabled = bool(options.auth_http_address)
        self.https_address: str | None = None
        gc_pauses.install()
        self._connections: set[ProtocolV2] = set()
        self._written_backends: set[DiskQueue] = set()
        # Diskqueue fsyncs under way: a commit that finds its queues taken by another task's
        # commit waits for them (its writes may be in them).
        self._queue_syncs: set[trio.Event] = set()
        # Partition logs appended to since the last commit: each writes its group then.
        self._written_logs: set[LogWriter] = set()
        self._metadata_wakeup = Wakeup()
        self._metadata_lock = trio.Lock()
        self._metadata_loading = False
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
        replica=None,
    ) -> Topic:
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
            replica=replica,
        )
        self.registry.add(topic)
        if partitioned:
            self.log.info("TOPIC(%s): created partition %d", name, partition)
        else:
            self.log.info("TOPIC(%s): created", name)
        if self._nursery is not None:
            self._nursery.start_soon(topic.pump)
            if not partitioned and not self._metadata_loading:
                self._precreate_channels(topic)
        self.topology_changed()
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
        topic.started = False
        self._nursery.start_soon(self._create_lookupd_channels, topic, addresses)

    async def _create_lookupd_channels(self, topic: Topic, addresses: list[str]) -> None:
        timeout = (
            self.options.http_client_connect_timeout + self.options.http_client_request_timeout
        )
        try:
            channels = await topic_channels(addresses, topic.name, timeout)
        except LookupChannelsError as error:
            self.log.warning(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s",
                topic.name,
                error,
            )
            channels = error.channels
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

    def publish_refusal(self, topic: Topic) -> str | None:
        """Why a partition takes no publish here now: `/disable/write` (Youzan answers it as
        it answers a node that is not the leader, docs/protocol.md §3.3), or the cluster
        (`cluster_refusal`); None when it takes one."""
        if self.write_disabled_for(topic):
            return "E_FAILED_ON_NOT_LEADER"
        return self.cluster_refusal(topic)

    def cluster_refusal(self, topic: Topic) -> str | None:
        """Why a cluster partition takes no publish here: `E_FAILED_ON_NOT_LEADER` on a
        node that does not lead it, `E_FAILED_ON_NOT_WRITABLE` while its leader cannot
        replicate; None when it does (and alone)."""
        if topic.replica is None:
            return None
        if topic.is_cluster_follower or topic.handing_over:
            return "E_FAILED_ON_NOT_LEADER"
        if not topic.cluster_writable:
            return "E_FAILED_ON_NOT_WRITABLE"
        return None

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
            self.lookup_peers.notify("UNREGISTER", name, None, number)
        self.topology_changed()

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

    def open_backend(self, name: str, *, ephemeral: bool):
        return open_backend(name, self.options, ephemeral=ephemeral)

    def stores_as_log(self, name: str, partition: int) -> bool:
        """Whether an unpartitioned topic is a log topic: `--log-topic` matches its name, or
        its log is on disk already (a log is never hidden by a changed flag)."""
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.options.log_topic):
            return True
        return log_exists(self.data_path, name, partition)

    def open_legacy_queue(self, name: str):
        """The diskqueue an earlier nsqpy kept a partitioned topic's or channel's messages in,
        before partitioned topics were logs; None when there is none."""
        if not os.path.exists(os.path.join(self.data_path, f"{name}.diskqueue.meta.dat")):
            return None
        return open_backend(name, self.options, ephemeral=False)

    def topology_changed(self) -> None:
        """A topic or channel came, went, paused or unpaused: persist and rescan."""
        self.queue_scanner.refresh_needed = True
        if not self._metadata_loading:
            self._metadata_wakeup.set()

    # -- options and health -------------------------------------------------------------------

    @property
    def tcp_port(self) -> int:
        return self.options.broadcast_tcp_port or _port_of(self.tcp_address)

    @property
    def http_port(self) -> int:
        return self.options.broadcast_http_port or _port_of(self.http_address)

    def set_health(self, error: Exception | str | None) -> None:
        """Go's SetHealth, called after every diskqueue write: `/ping` answers 500
        `NOK - <err>` from a failed write until a later write succeeds."""
        if error is None and self._write_error is None:
            return
        self._write_error = None if error is None else str(error)
        self._update_health()

    def set_sync_health(self, error: str | None) -> None:
        """A failed fsync or metadata write makes health NOK until the next one succeeds."""
        if error == self._sync_error:
            return
        self._sync_error = error
        self._update_health()

    def _update_health(self) -> None:
        error = self._write_error or self._sync_error
        health = "OK" if error is None else f"NOK - {error}"
        if health == self.health:
            return
        if error is None:
            self.log.info("NSQ: health OK again, the disk accepts writes")
        else:
            self.log.error("NSQ: health %s", health)
        self.health = health

    def set_options(self, **changes) -> None:
        """PUT /config: swap in new options (Go's swapOpts)."""
        self.options = self.options.replace(**changes)
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

    def write_to_backend(self, backend, messages, failure: str, *failure_args) -> None:
        """Append `messages` to a diskqueue, to be synced by the next commit (before the
        publish is acknowledged); health is OK again after it. A failed write (a full disk) is
        logged as `failure % failure_args` and ` - <error>`, turns health NOK and raises
        BackendWriteError."""
        try:
            backend.put_many([message.to_record() for message in messages])
        except OSError as os_error:
            self._write_failed(write_error(backend, os_error), failure, *failure_args)
        self.set_health(None)
        self._written_backends.add(backend)

    def append_to_log(self, writer: LogWriter, messages, topic: str) -> WriteGroup:
        """Append a publish to a partition log's open group, to be written by the next commit
        (before the publish is acknowledged; `WriteGroup.error` then says whether it was).
        BackendWriteError if the log is closed."""
        try:
            group = writer.append(messages)
        except OSError as os_error:
            self._write_failed(
                write_error(writer.log, os_error, writer.log.active_segment_path),
                "TOPIC(%s) ERROR: failed to write message to log",
                topic,
            )
        self._written_logs.add(writer)
        return group

    def _write_failed(self, error: BackendWriteError, failure: str, *failure_args) -> None:
        """A failed write: logged as `failure % failure_args - <error>`, health NOK, raised."""
        self.log.error(failure + " - %s", *failure_args, error)
        self.set_health(error)
        raise error from None

    def commit_due(self) -> bool:
        """Whether a publish has anything to wait for: a partition log's group to write, or a
        diskqueue written since the last commit that reached its `--sync-every` count."""
        return bool(self._written_logs) or any(
            backend.sync_due for backend in self._written_backends
        )

    async def commit_backend_writes(self, groups: Iterable[WriteGroup] = ()) -> None:
        """Before publishes are acknowledged: write every partition log's open group, wait
        until `groups` (the log publishes being answered) are done (`nsqd/log_writer.py`),
        and fsync every diskqueue whose `--sync-every` count is reached. fsyncs run in worker
        threads so the event loop never waits on the disk."""
        if self._written_logs:
            writers, self._written_logs = self._written_logs, set()
            for writer in writers:
                writer.write_now()
        waits: list = [
            partial(group.writer.wait, group) for group in {g for g in groups if not g.done}
        ]
        if self._queue_syncs:
            # Another task's commit took the written queues and is syncing them: what this
            # task wrote may be among them, and is answered only once they are synced.
            waits.extend(event.wait for event in self._queue_syncs)
        if self._written_backends:
            backends, self._written_backends = self._written_backends, set()
            for backend in backends:
                if backend.sync_due:
                    waits.append(partial(self._commit_sync, backend))
        if len(waits) == 1:
            await waits[0]()
        elif waits:
            # Side by side: one slow disk flush does not queue the rest.
            async with trio.open_nursery() as syncs:
                for wait in waits:
                    syncs.start_soon(wait)

    def clean_logs(self, partitions: list[Topic] | None = None, *, greedy: bool = False) -> int:
        """Retention of log topics (docs/design.md §13): remove segments every channel has
        confirmed past that are older than `--retention-days` or beyond
        `--retention-size-per-day` × days of consumed data; `greedy` (`/topic/greedyclean`)
        removes every consumed segment. A partition without channels is never cleaned. How
        many segments went."""
        options = self.options
        removed = 0
        for topic in partitions if partitions is not None else self.all_partitions():
            log = topic.log
            if log is None or not topic.channels:
                continue
            floor = min(channel.cursor.confirmed.offset for channel in topic.channels.values())
            if greedy:
                keep, older_than = -1.0, math.inf
            else:
                # A cluster topic's own retention (`/topic/meta/update?retention=`) wins.
                days = topic.retention_days or options.retention_days
                keep = float(options.retention_size_per_day * max(days, 1))
                older_than = time.time() - days * 86400
            removed += log.clean(floor, keep_bytes=keep, older_than=older_than)
        return removed

    async def _retention_timer(self) -> None:
        """Youzan checks retention every 10 minutes."""
        while True:
            await trio.sleep(RETENTION_INTERVAL)
            self.clean_logs()

    async def _sync_timer(self) -> None:
        """Go's diskqueue syncs dirty queues every `--sync-timeout` even when writes stop."""
        while True:
            await trio.sleep(self.options.sync_timeout)
            for backend in self._all_backends():
                if not backend.dirty:
                    continue
                if isinstance(backend, LogWriter):
                    await backend.sync()
                else:
                    await self.sync_backend(backend)

    async def _commit_sync(self, backend) -> None:
        """A diskqueue fsync publishes wait for: the commits of other tasks wait for it too."""
        done = trio.Event()
        self._queue_syncs.add(done)
        try:
            await self.sync_backend(backend)
        finally:
            self._queue_syncs.discard(done)
            done.set()

    async def sync_backend(self, backend) -> None:
        """Run one sync job off the loop; a failure (the job logs it) makes health NOK."""
        ok = await trio.to_thread.run_sync(backend.prepare_sync())
        if not ok:
            self.set_sync_health(f"DISKQUEUE({backend.name}) failed to sync")
        elif self._sync_error is not None:
            self.set_sync_health(None)

    def _all_backends(self) -> list[DiskQueue]:
        backends = []
        for topic in self.all_partitions():
            backends.extend(topic.sync_targets())
        return backends

    def metadata(self) -> bytes:
        topics = []
        for topic in self.all_partitions():
            if topic.ephemeral:
                continue
            channels = [
                ChannelMetadata(c.name, c.paused)
                for c in topic.channels.values()
                if not c.ephemeral
            ]
            entry = TopicMetadata(topic.name, topic.paused, channels)
            if topic.partitioned:
                entry.partition = topic.partition
                entry.ordered = topic.ordered
                entry.sync_every = topic.sync_every
                entry.ext = topic.ext
                entry.next_offset = topic.next_offset
            topics.append(entry)
        return encode_metadata(topics, VERSION)

    async def persist_metadata(self) -> None:
        """Write `nsqd.dat` now (HTTP pause/unpause do, as Go's handlers do). One writer at a
        time, snapshot taken inside the lock, so an older snapshot never lands last (Go holds
        the nsqd lock around PersistMetadata)."""
        async with self._metadata_lock:
            encoded = self.metadata()
            await trio.to_thread.run_sync(write_metadata, self.data_path, encoded)

    async def _metadata_writer(self) -> None:
        while True:
            await self._metadata_wakeup.wait()
            try:
                await self.persist_metadata()
            except OSError as error:
                # A full disk: keep the old nsqd.dat, say so, and try again shortly.
                self.log.error("NSQ: failed to persist metadata - %s", error)
                self.set_sync_health(f"failed to persist metadata - {error}")
                await trio.sleep(self.options.sync_timeout)
                self._metadata_wakeup.set()
            else:
                if self._sync_error is not None:
                    self.set_sync_health(None)

    def load_metadata(self) -> None:
        """Recreate the topics and channels of `nsqd.dat`; their diskqueues reopen with them.

        An unreadable or corrupt `nsqd.dat` never stops nsqd (Go nsqd refuses to start): it
        is set aside as `nsqd.dat.corrupt`, the topics and channels are found again from
        their diskqueue files (unpaused: the pause flags were only in the lost file), and a
        fresh `nsqd.dat` is written once nsqd runs.
        """
        try:
            topics = read_metadata(self.data_path)
        except MetadataError as error:
            topics = self._recover_metadata(error)
        self._metadata_loading = True
        try:
            for topic_meta in topics:
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
                    if topic.log is None:
                        topic.next_offset = topic_meta.next_offset
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
        finally:
            self._metadata_loading = False

    def _recover_metadata(self, error: MetadataError) -> list[TopicMetadata]:
        """The topic list rebuilt from the diskqueue files, after one ERROR line."""
        try:
            moved_to = set_aside(self.data_path)
        except OSError as rename_error:
            moved_to = f"nowhere ({rename_error})"
        names = scan_queue_names(self.data_path) + scan_log_names(self.data_path)
        topics = topics_from_queue_names(names)
        self.log.error(
            "%s; moved it to %s and recovered %d topics and %d channels from the diskqueue"
            " files in %s",
            error,
            moved_to,
            len(topics),
            sum(len(topic.channels) for topic in topics),
            self.data_path,
        )
        # The metadata writer puts a fresh nsqd.dat in its place as soon as nsqd runs.
        self._metadata_wakeup.set()
        return topics

    # -- life -------------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        options = self.options
        log = self.log
        prepare_data_path(self.data_path)
        self.load_metadata()
        tcp_listener = await open_listener(options.tcp_address)
        self.tcp_address = format_address(tcp_listener.socket.getsockname())
        self.log.info("TCP: listening on %s", self.tcp_address)
        http_listener = await open_listener(options.http_address)
        self.http_address = format_address(http_listener.socket.getsockname())
        self.log.info("HTTP: listening on %s", self.http_address)
        http_api = HTTPAPI(self)
        https_listener = None
        if self.tls_context is not None:
            https_listener = await open_listener(options.https_address)
            self.https_address = format_address(https_listener.socket.getsockname())
            self.log.info("HTTPS: listening on %s", self.https_address)
        # --tls-required=true (or a client auth policy): the plain HTTP port only points to
        # the HTTPS one; `tcp-https` means TLS for TCP only (Go's TLSRequiredExceptHTTP).
        plain_router = (
            TLSRequiredRouter(self)
            if options.tls_required == "true" and self.tls_context is not None
            else None
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for topic in self.all_partitions():
                    nursery.start_soon(topic.pump)
                async with trio.open_nursery() as listener_nursery:
                    listener_nursery.start_soon(
                        accept_forever, tcp_listener, self._handle_connection, nursery, log, "TCP"
                    )
                    max_body = max(options.max_body_size, options.max_msg_size)
                    listener_nursery.start_soon(
                        partial(
                            serve_http,
                            http_listener,
                            plain_router or http_api.router,
                            listener_nursery,
                            log,
                            max_body_size=max_body,
                        )
                    )
                    if https_listener is not None:
                        listener_nursery.start_soon(
                            partial(
                                serve_http,
                                https_listener,
                                http_api.router,
                                listener_nursery,
                                log,
                                max_body_size=max_body,
                                tls_context=self.tls_context,
                            )
                        )
                    nursery.start_soon(self.queue_scanner.run)
                    nursery.start_soon(self.heartbeats.run)
                    nursery.start_soon(self._metadata_writer)
                    nursery.start_soon(self._sync_timer)
                    nursery.start_soon(self._retention_timer)
                    if self.cluster.enabled:
                        # Partitions found on disk wait for the cluster to say who leads them.
                        for topic in self.all_partitions():
                            if topic.partitioned and topic.replica is None:
                                topic.replica = UNKNOWN_REPLICA
                        await nursery.start(self.cluster.serve)
                    nursery.start_soon(self.lookup_peers.run, options.lookupd_tcp_address)
                    if options.statsd_address:
                        nursery.start_soon(StatsdPusher(self).run)
                    task_status.started(self)
                    await self._shutdown.wait()
                    listener_nursery.cancel_scope.cancel()
                await self._close_connections()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await tcp_listener.aclose()
                await http_listener.aclose()
                if https_listener is not None:
                    await https_listener.aclose()
                await self._persist_on_exit()

    def shutdown(self) -> None:
        """Begin a clean exit (SIGTERM, SIGINT, or an embedding program)."""
        self.exiting = True
        self._shutdown.set()

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        try:
            peer = format_address(stream.socket.getpeername())
        except OSError:
            peer = "unknown"
        self.log.info("TCP: new client(%s)", peer)
        connection = ProtocolV2(self, stream, peer)
        self._connections.add(connection)
        try:
            await connection.run()
        except Exception:
            # A bug must cost one connection, never the daemon and everyone else on it.
            self.log.exception("PROTOCOL(V2): [%s] internal error, closing the connection", peer)
        finally:
            self._connections.discard(connection)
            self.log.info("PROTOCOL(V2): [%s] exiting ioloop", peer)

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

        def close_all() -> None:
            for topic in self.all_partitions():
                topic.close()

        await trio.to_thread.run_sync(close_all)
        self.log.info("NSQ: persisting topic/channel metadata to %s", self.data_path)
        try:
            await self.persist_metadata()
        except OSError as error:
            # The previous nsqd.dat stays; a full disk must not turn a clean exit into a crash.
            self.log.error("NSQ: failed to persist metadata - %s", error)


_FLAGS = build_flags()
# How often retention looks at the log topics (Youzan's interval).
RETENTION_INTERVAL = 600.0
# lg.LogLevel's numbers, which is how Go's /config/log_level marshals the level.
_GO_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


def _port_of(address: str | None) -> int:
    if not address or ":" not in address:
        return 0
    return int(address.rsplit(":", 1)[1])
