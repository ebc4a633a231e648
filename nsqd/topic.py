"""A topic: where publishers put messages, fanned out to every channel.

When the topic has channels and is not paused, a publish goes straight to the channels in the
same call (docs/design.md §3.2: a loop over channels, not over awaits). Otherwise messages
wait in the topic's queue (`nsqd/message_queue.py`: memory up to `--mem-queue-size`, then its
diskqueue) until the topic's pump moves them on: Go keeps a topic's messages until its first
channel appears, and holds them while it is paused.
"""

import logging
import random
import time
from typing import TYPE_CHECKING, Protocol

import trio

from nsqpy.common.names import is_ephemeral
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.hourly_bytes import HourlyBytes
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.nsqd.message_queue import LogTopicQueue, TopicQueue
from nsqpy.nsqd.replication import SINGLE_NODE, Replication
from nsqpy.nsqd.wakeup import Wakeup
from nsqpy.partition_log import ProducerMark

if TYPE_CHECKING:
    from nsqpy.nsqd.options import Options
    from nsqpy.nsqd.storage import Storage
    from nsqpy.nsqd.topic_registry import TopicRegistry

# How many backlog messages the pump moves before letting other tasks run, and how many
# copies of them at most (fewer messages a turn with many channels; an MPUB's batch goes whole).
_PUMP_BATCH = 1024
_PUMP_COPIES = 4096
# From this many channels a plain publish is answered once the topic holds it, and the pump
# copies it to the channels after (Go's way for any number): the publisher pays one write,
# not one a channel. Below it the channels take it before the answer, with no extra hop.
FAN_OUT_AFTER_ANSWER_FROM = 16
# Such a pump goes when nsqd has nothing else to do, so that publishers are answered first,
# but waits for that at most this long (seconds) under a load that never pauses.
_PUMP_LONGEST_WAIT = 0.01
# After a turn that failed (a bug), the pump tries again this much later (seconds).
_PUMP_PAUSE_AFTER_ERROR = 1.0
# How many passes of the scheduler in a row with nothing else to run make nsqd idle for such
# a pump (some tens of µs: fewer let a pump in between a pipelining publisher's MPUBs; with
# 100 channels MPUB ran at 216k msgs/s with 2, 310k with 4, 405k with 8).
_QUIET_PASSES = 8
# How many pumps of this trio run are letting the rest go first (`Topic._next_turn`).
_YIELDING_PUMPS: trio.lowlevel.RunVar[int] = trio.lowlevel.RunVar("yielding_pumps", default=0)


class Registrar(Protocol):
    """Who tells nsqlookupd of the topics and channels (`LookupPeers`)."""

    def notify(
        self, action: str, topic: str, channel: str | None = None, partition: int = 0
    ) -> None: ...


class TopicHost(Protocol):
    """What a topic and its channels use of nsqd (`NSQD`)."""

    @property
    def options(self) -> "Options": ...

    @property
    def log(self) -> logging.Logger: ...

    @property
    def random(self) -> random.Random: ...

    @property
    def storage(self) -> "Storage": ...

    @property
    def lookup_peers(self) -> Registrar: ...

    def topology_changed(self, topic: "Topic", *, stored: bool = True) -> None:
        """A topic partition or one of its channels came, went, paused or unpaused (`stored`:
        a change `nsqd.dat` holds)."""

    def delete_topic(self, name: str, partition: int | None = None) -> None: ...

    # Dead letters (`nsqd/dead_letters.py`) publish to a topic of their own.
    @property
    def exiting(self) -> bool: ...

    @property
    def registry(self) -> "TopicRegistry": ...

    def get_topic(self, name: str) -> "Topic": ...

    def all_partitions(self) -> "list[Topic]": ...


class Topic:
    """One partition of a topic. A classic topic is partition 0 and nothing else; Youzan
    topics (docs/protocol.md §3.2) have partitions created explicitly, `partitioned` marks them."""

    def __init__(
        self,
        nsqd: TopicHost,
        name: str,
        partition: int = 0,
        *,
        partitioned: bool = False,
        ordered: bool = False,
        ext: bool = False,
        sync_every: int = 0,
    ) -> None:
        self.nsqd = nsqd
        # In a cluster (docs/design.md §14), the partition's replication; alone, a no-op.
        self.replication: Replication = SINGLE_NODE
        # The cluster's topic settings (Youzan's topic meta): retention in days (0: nsqd's
        # --retention-days), and whether SUB may create a channel.
        self.retention_days = 0
        self.channel_auto_create = True
        self.name = name
        self.partition = partition
        self.partitioned = partitioned
        self.ordered = ordered
        self.ext = ext
        # A log topic's own `--sync-every` (Youzan's `syncdisk`); 0: nsqd's.
        self.sync_every = sync_every
        self.ephemeral = is_ephemeral(name)
        self.channels: dict[str, Channel] = {}
        # Grows with every channel created or deleted: a cluster leader sends its channels to
        # the followers with the next group when it changed (`nsqd/cluster.py`).
        self.channels_version = 0
        self.replicated_channels = 0
        self.paused = False
        self.deleted = False
        self.message_count = 0
        self.message_bytes = 0
        # Youzan's hourly published bytes (`/message/historystats`), closed by nsqd's clock.
        self.hourly_bytes = HourlyBytes(time.localtime().tm_hour, 0)
        # Partitioned topics are log topics (docs/design.md §13): every message in the
        # partition's log, channels as cursors into it. Classic topics keep go-diskqueue,
        # unless `--log-topic` names them or their log is on disk already.
        # Wakes the pump: messages to fan out, or (a log topic) moves to its delay queue.
        self._pump_wakeup = Wakeup()
        self.queue: TopicQueue = nsqd.storage.open_topic_queue(
            name,
            partition,
            backend_name=self.backend_name,
            partitioned=partitioned,
            ephemeral=self.ephemeral,
            ext=ext,
            sync_every=sync_every,
            paused=lambda: self.paused,
            on_written=self.log_written,
            wake_pump=self._pump_wakeup.set,
        )
        # False while nsqd asks nsqlookupd which channels the topic has elsewhere in the
        # cluster: its messages wait, as in Go, where the pump starts only after those
        # channels exist, so each of them gets the topic's first message too.
        self.started = True

    @property
    def backend_name(self) -> str:
        """Partition 0 keeps Go's queue name; others add `#<n>` (`#` is not allowed in topic
        names, so no classic topic can collide with it)."""
        return self.name if self.partition == 0 else f"{self.name}#{self.partition}"

    @property
    def full_name(self) -> str:
        """Youzan's `topic_full_name`: `<topic>-<partition>`."""
        return f"{self.name}-{self.partition}"

    # -- publishing -------------------------------------------------------------------------

    def publish(
        self,
        bodies: list[bytes],
        defer: float = 0.0,
        trace_ids: list[int] | None = None,
        ext_headers: list[bytes] | None = None,
        producer: tuple[bytes, int] | None = None,
        body_bytes: int | None = None,
    ) -> "list[Message] | MessageBatch":
        """PUB, MPUB, DPUB and HTTP /pub: new messages with fresh IDs, all or nothing. A plain
        MPUB into a queue that `keeps_batches` stays one MessageBatch until the channels hand
        its messages out. `producer` (PUB_SEQ, MPUB_SEQ into a log topic): the producer and
        the first message's sequence, stored with the last message.

        BackendWriteError if a diskqueue write failed (health is NOK then): the publish is
        not acknowledged, and nothing of it is kept, except copies that other channels of
        the topic already took (a retry then repeats it there: at-least-once).
        """
        timestamp = time.time_ns()
        queue = self.queue
        messages: list[Message] | MessageBatch
        plain = not (defer or trace_ids or ext_headers)
        if plain and len(bodies) == 1:
            # PUB and HTTP /pub: one message, no batch machinery.
            messages = [Message(queue.next_id(), bodies[0], timestamp)]
        elif plain and len(bodies) > 1 and queue.keeps_batches:
            messages = MessageBatch(queue.next_ids(len(bodies)), bodies, timestamp)
        else:
            messages = self._new_messages(bodies, timestamp, defer, trace_ids, ext_headers)
        if body_bytes is None:  # the publish path has counted them already
            body_bytes = len(bodies[0]) if len(bodies) == 1 else sum(map(len, bodies))
        if producer is not None:
            # The command checked the topic is a log (which keeps no MessageBatch).
            assert isinstance(queue, LogTopicQueue) and isinstance(messages, list)
            producer_id, first = producer
            mark = ProducerMark(producer_id, first + len(bodies) - 1)
            queue.accept_sequenced(messages, body_bytes, mark, first)
            return messages
        if queue.accept(messages, body_bytes):
            # Kept for the channels by the queue (a log's open group): counted once written.
            return messages
        if (
            self.channels
            and not self.paused
            and self.started
            and not self.has_backlog()
            and (len(self.channels) < FAN_OUT_AFTER_ANSWER_FROM or not plain)
        ):
            self._fan_out(messages, strict=True)
        else:
            self._store(messages)
        self.message_count += len(bodies)
        self.message_bytes += body_bytes
        return messages

    def _new_messages(
        self,
        bodies: list[bytes],
        timestamp: int,
        defer: float,
        trace_ids: list[int] | None,
        ext_headers: list[bytes] | None,
    ) -> list[Message]:
        """A publish as one `Message` per body, with its delay, trace ids and ext headers."""
        ids = self.queue.next_ids(len(bodies))
        messages = [Message(mid, body, timestamp) for mid, body in zip(ids, bodies, strict=True)]
        if trace_ids is not None:
            for message, trace_id in zip(messages, trace_ids, strict=True):
                message.trace_id = trace_id
        if ext_headers is not None and self.ext:
            for message, header in zip(messages, ext_headers, strict=True):
                message.ext_header = header
        if defer:
            for message in messages:
                message.defer = defer
        return messages

    def log_written(self, count: int, body_bytes: int) -> None:
        """A group of the log was written (and replicated): its messages count, and the
        channels read them."""
        self.message_count += count
        self.message_bytes += body_bytes
        for channel in list(self.channels.values()):
            channel.message_count += count
            channel.notify()

    def replicated(self, count: int, size: int) -> None:
        """A follower wrote `count` messages its leader sent: counted as published here."""
        self.message_count += count
        self.message_bytes += size
        for channel in self.channels.values():
            channel.message_count += count

    @property
    def is_cluster_follower(self) -> bool:
        """In a cluster, and not the partition's leader here."""
        return self.replication.is_follower

    def _fan_out(self, messages: "list[Message] | MessageBatch", *, strict: bool = False) -> None:
        """Every channel gets the messages. `strict` (a publish): if the first channel cannot
        store them nothing is stored and the error is raised; if a later one cannot, it keeps
        them in memory and the error is raised too, so the publisher is not told OK about
        a copy that is not on disk. Otherwise (the pump) a channel that cannot write keeps
        them in memory (Channel._put)."""
        now = trio.current_time()
        first = True
        failure = None
        for channel in list(self.channels.values()):
            if first:
                channel.put_messages(messages, now, strict=strict)
                first = False
            else:
                copies = (
                    messages.view()
                    if isinstance(messages, MessageBatch)
                    else [message.copy() for message in messages]
                )
                error = channel.put_messages(copies, now)
                failure = failure or error
        if failure is not None and strict:
            raise failure

    def _store(self, messages: "list[Message] | MessageBatch") -> None:
        """Keep a publish until the topic has channels; a failed write keeps nothing of it."""
        self.queue.append(messages, strict=True)
        if self.channels:
            # Without a channel the pump has nowhere to move it: the first channel wakes it.
            self._pump_wakeup.set()

    def has_backlog(self) -> bool:
        return self.queue.has_messages()

    @property
    def depth(self) -> int:
        return self.queue.depth

    @property
    def backend_depth(self) -> int:
        return self.queue.backend_depth

    async def sync_dirty(self) -> None:
        """The periodic sync of the topic's and its channels' files."""
        await self.queue.sync_dirty()
        for channel in list(self.channels.values()):
            await channel.queue.sync_dirty()

    async def pump(self) -> None:
        """Move the topic's backlog into its channels whenever it has channels and runs, and
        write what its channels move to the end of their delay (a log topic's)."""
        while not self.deleted:
            try:
                await self._pump_turn()
            except Exception:
                # A bug costs this topic the turn's messages (those channels that had not
                # taken them yet), never the daemon and every other topic's messages with it.
                self.nsqd.log.exception("TOPIC(%s): internal error in its pump", self.name)
                await trio.sleep(_PUMP_PAUSE_AFTER_ERROR)

    async def _pump_turn(self) -> None:
        if self.queue.moves_pending:
            await self.queue.write_moves()
        elif self.channels and not self.paused and self.started and self.has_backlog():
            count = min(_PUMP_BATCH, max(1, _PUMP_COPIES // len(self.channels)))
            for run in self.queue.take_runs(count):
                self._fan_out(run)
            await self.queue.runs_moved()
            await self._next_turn()
        else:
            await self._pump_wakeup.wait()

    async def _next_turn(self) -> None:
        """Between two batches of the pump: the others run first; with many channels, the
        pump waits until nothing but such pumps is ready to run (publishers answered, their
        next publish read), for at most `_PUMP_LONGEST_WAIT`."""
        await trio.lowlevel.checkpoint()
        if len(self.channels) < FAN_OUT_AFTER_ANSWER_FROM:
            return
        deadline = trio.current_time() + _PUMP_LONGEST_WAIT
        _YIELDING_PUMPS.set(_YIELDING_PUMPS.get() + 1)
        try:
            # A checkpoint lets every ready task run a step and polls the sockets. What is
            # counted ready is what runs after this pass (the rest of this pass runs before
            # the next checkpoint returns): quiet counts in a row mean nothing but the
            # yielding pumps is left to run, and no socket has brought more.
            quiet = 0
            while quiet < _QUIET_PASSES and trio.current_time() < deadline:
                await trio.lowlevel.checkpoint()
                others = trio.lowlevel.current_statistics().tasks_runnable
                quiet = quiet + 1 if others < _YIELDING_PUMPS.get() else 0
        finally:
            _YIELDING_PUMPS.set(_YIELDING_PUMPS.get() - 1)

    def start(self) -> None:
        """Let the messages flow to the channels (Go's topic.Start)."""
        self.started = True
        self._pump_wakeup.set()

    # -- channels ---------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel, created on first use (SUB, HTTP /channel/create, metadata load)."""
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name)
            self.channels[name] = channel
            self.channels_version += 1
            self.nsqd.log.info("TOPIC(%s): new channel(%s)", self.name, name)
            self.nsqd.topology_changed(self, stored=not channel.ephemeral)
            if not self.is_cluster_follower:
                self.nsqd.lookup_peers.notify("REGISTER", self.name, name, self.partition)
            self._pump_wakeup.set()
        return channel

    def delete_channel(self, name: str) -> None:
        channel = self.channels.pop(name, None)
        if channel is None:
            return
        self.channels_version += 1
        self.nsqd.log.info("TOPIC(%s): deleting channel %s", self.name, name)
        channel.delete()
        self.nsqd.topology_changed(self, stored=not channel.ephemeral)
        if not self.is_cluster_follower:
            self.nsqd.lookup_peers.notify("UNREGISTER", self.name, name, self.partition)
        # Go deletes an ephemeral topic when its last channel goes.
        if self.ephemeral and not self.channels and not self.deleted:
            self.nsqd.delete_topic(self.name, self.partition)

    # -- pause, empty, shutdown -------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self.nsqd.topology_changed(self)

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.topology_changed(self)
        self._pump_wakeup.set()
        # Channels reading a log themselves stopped while the topic was paused.
        for channel in self.channels.values():
            channel.notify()

    def empty(self) -> None:
        self.queue.empty()

    def flush(self) -> int:
        """On shutdown: the topic's backlog and every channel's messages are kept."""
        count = self.queue.flush([])
        for channel in self.channels.values():
            count += channel.flush()
        return count

    def close(self) -> None:
        self.deleted = True
        self._pump_wakeup.set()
        for channel in self.channels.values():
            channel.close()
        self.queue.close()

    def delete(self) -> None:
        self.deleted = True
        self._pump_wakeup.set()
        for channel in list(self.channels.values()):
            channel.delete()
        self.channels.clear()
        self.queue.delete()

    def __repr__(self) -> str:
        return f"Topic({self.name}, partition {self.partition})"
