"""What the V2 command interpreter (`nsqd/protocol_v2.py`) asks of its connection
(`nsqd/connection.py`): the steps of a batch that need I/O.

The interpreter runs each batch of commands in a generator (`ProtocolV2.batches`): each effect
it yields is done by the connection, which sends the outcome back in (`AnswerForwarded`'s) or
throws its error in (`ProtocolError`, `AuthError`), where the interpreter answers it as Go
does. Every batch ends with `Commit` (its writes) and `BatchDone` (send the replies), or with
a `BatchDone` that commits.
"""

import dataclasses
from typing import Any

from nsqpy.nsqd.identify import Negotiated


@dataclasses.dataclass(slots=True)
class QueryAuth:
    """Ask the auth server for the client's authorizations (its secret is set): AUTH, or a
    command whose authorizations ran out. Raises `AuthError` into the interpreter."""


@dataclasses.dataclass(slots=True)
class Upgrade:
    """Send `before` (the batch's replies so far) and the IDENTIFY reply, then wrap the stream
    in TLS and compression as negotiated. Raises `ProtocolError` (E_IDENTIFY_FAILED) into the
    interpreter."""

    negotiated: Negotiated
    before: bytes


@dataclasses.dataclass(slots=True)
class MoveTo:
    """Hand the connection to the worker `owner` once the batch is answered: `command` is the
    first it runs there."""

    owner: int
    command: Any


@dataclasses.dataclass(slots=True)
class Forward:
    """Send `command` (a publish) to the worker `owner`; its answer goes in the batch's
    replies at `index` (`AnswerForwarded`). Raises `ProtocolError` when the owner is gone."""

    owner: int
    command: Any
    index: int


@dataclasses.dataclass(slots=True, frozen=True)
class AnswerForwarded:
    """Wait for the owners' answers to the batch's forwarded publishes. The outcome: (reply
    index, command, (frame type, data) or the ProtocolError of an owner that is gone) each,
    which the interpreter puts in the batch's replies."""


@dataclasses.dataclass(slots=True)
class Commit:
    """Wait until the batch's publishes reached their files (`groups`: the log groups its
    replies wait for; the classic queues' writes are synced too)."""

    groups: list


@dataclasses.dataclass(slots=True)
class ReplicateChannels:
    """Give cluster partitions' followers the channels this batch created, before the OK."""

    topics: list


@dataclasses.dataclass(slots=True, frozen=True)
class BatchDone:
    """The batch ran every complete command: send its replies, then close unless
    `keep_open`. With `commit`, first wait for its writes as `Commit(())` would (a batch of
    no log publishes and no new channel: one step where it would take two)."""

    keep_open: bool
    commit: bool = False


ANSWER_FORWARDED = AnswerForwarded()
KEEP_OPEN = BatchDone(True)
CLOSE = BatchDone(False)
COMMIT_KEEP_OPEN = BatchDone(True, commit=True)
COMMIT_CLOSE = BatchDone(False, commit=True)

Effect = (
    QueryAuth
    | Upgrade
    | MoveTo
    | Forward
    | AnswerForwarded
    | Commit
    | ReplicateChannels
    | BatchDone
)
