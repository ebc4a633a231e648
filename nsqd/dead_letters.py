"""Poison messages: a channel's attempt limit and its dead-letter topic (docs/design.md §13).

A channel with an attempt limit (`--max-attempts`, or its own through
`/channel/setmaxattempts`; 0 is none, as Go) does not deliver a message that was delivered
that many times: the message goes to the channel's dead-letter topic, `<topic>.<channel>.dead`,
a classic topic of the same nsqd, and is finished in the channel. The dead-letter topic holds
them in its channel `replay` (any other channel a user adds sees them too), and
`/channel/replaydeadletters` puts what `replay` holds back into the channel, as new messages
(new IDs, attempts from 0): into its queue on a classic topic, into the log for that channel
alone on a log topic (a record like a requeue's move, due now). A dead-letter message is
finished in `replay` only once it is back in the channel; one that cannot be written there
stays in `replay`.
"""

import hashlib
import time
from typing import TYPE_CHECKING

from nsqpy.common.names import MAX_NAME_LENGTH
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.publish import PublishError, publish

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.topic import Topic

REPLAY_CHANNEL = "replay"
_SUFFIX = ".dead"
# Dead-letter messages put back into their channel per batch.
_REPLAY_BATCH = 1000


def attempt_limit(channel: "Channel") -> int:
    """The channel's attempt limit, 0 for none. An ephemeral channel has none, and the flag's
    does not reach the channels of a dead-letter topic (`*.dead`)."""
    if channel.ephemeral:
        return 0
    own = channel.max_attempts
    if own is not None:
        return own
    return 0 if channel.topic_name.endswith(_SUFFIX) else channel.nsqd.options.max_attempts


def topic_name(channel: "Channel") -> str:
    """The channel's dead-letter topic: chosen once and kept in nsqd.dat with the channel.
    `<topic>.<channel>.dead`, shortened with a digest past 64 characters, and numbered when
    another channel's has that name already (`a.b` + `c` and `a` + `b.c`)."""
    if channel.dead_letter_topic:
        return channel.dead_letter_topic
    stem = f"{channel.topic_name}.{channel.name}"
    if len(stem) + len(_SUFFIX) > MAX_NAME_LENGTH:
        digest = hashlib.sha1(stem.encode()).hexdigest()[:12]
        stem = f"{stem[: MAX_NAME_LENGTH - len(_SUFFIX) - 13]}.{digest}"
    taken = {
        other.dead_letter_topic
        for topic in channel.nsqd.all_partitions()
        for other in topic.channels.values()
        if other is not channel
    }
    name, number = stem + _SUFFIX, 2
    while name in taken:
        tail = f"-{number}{_SUFFIX}"
        name, number = stem[: MAX_NAME_LENGTH - len(tail)] + tail, number + 1
    channel.dead_letter_topic = name
    channel.nsqd.topology_changed(channel.topic)
    return name


def _dead_letter_topic(channel: "Channel") -> "Topic":
    topic = channel.nsqd.get_topic(topic_name(channel))
    topic.get_channel(REPLAY_CHANNEL)
    return topic


def send(channel: "Channel", messages: list[Message], limit: int) -> bool:
    """Messages past the channel's attempt limit (`limit`) go to its dead-letter topic and are
    finished in the channel; False (nothing done) when the dead-letter topic refuses them, so
    that they are delivered rather than lost."""
    topic = _dead_letter_topic(channel)
    try:
        publish(channel.nsqd, topic, [message.body for message in messages])
    except PublishError as error:
        channel.nsqd.log.error(
            "TOPIC(%s) channel %s: %d messages past %d attempts could not go to %s - %s",
            channel.topic_name,
            channel.name,
            len(messages),
            limit,
            topic.name,
            error,
        )
        return False
    for message in messages:
        channel.queue.acknowledge(message)
    channel.dead_letter_count += len(messages)
    channel.nsqd.log.warning(
        "TOPIC(%s) channel %s: %d messages delivered %d times went to %s",
        channel.topic_name,
        channel.name,
        len(messages),
        limit,
        topic.name,
    )
    channel.topic.replication.cursor_moved()
    return True


def waiting(channel: "Channel") -> int:
    """How many dead-letter messages wait to be put back: in `replay`, or in the dead-letter
    topic still, on their way to its channels."""
    replay = _replay_channel(channel)
    return replay.depth + replay.topic.depth if replay is not None else 0


def _replay_channel(channel: "Channel") -> "Channel | None":
    if not channel.dead_letter_topic:
        return None
    topic = channel.nsqd.registry.default(channel.dead_letter_topic)
    return topic.channels.get(REPLAY_CHANNEL) if topic is not None else None


def replay(channel: "Channel") -> int:
    """Put what the dead-letter topic's `replay` holds back into the channel; how many."""
    replay_channel = _replay_channel(channel)
    if replay_channel is None:
        return 0
    total = 0
    cursor = channel.cursor
    while True:
        dead = replay_channel.queue.take(_REPLAY_BATCH)
        if not dead:
            break
        total += len(dead)
        origin = channel.topic.queue
        now = time.time_ns()
        fresh = [Message(origin.next_id(), message.body, now, offset=-1) for message in dead]
        if cursor is None:
            channel.put_replayed(fresh)
            for message in dead:
                replay_channel.queue.acknowledge(message)
            continue
        for copy, message in zip(fresh, dead, strict=True):
            channel.replaying[copy.id] = (replay_channel, message)
            if not cursor.move_to_end(copy, 0.0):
                replayed(channel, copy, written=False)  # no move here: it stays in `replay`
    return total


def replayed(channel: "Channel", message: Message, written: bool) -> None:
    """A replayed message's record was written for the channel (or could not be): its
    dead-letter original is finished (or waits in `replay` again)."""
    replay_channel, original = channel.replaying.pop(message.id)
    if written:
        replay_channel.queue.acknowledge(original)
    else:
        replay_channel.queue.put_back([original])
        replay_channel.notify()
