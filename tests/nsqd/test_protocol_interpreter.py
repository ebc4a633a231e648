"""The V2 command interpreter without a connection (`nsqd/protocol_v2.py`): bytes in, replies
and effects out.

Each test feeds the interpreter what a client would send and drives its batch by hand, as the
connection (`nsqd/connection.py`) does: an effect's outcome is sent back in, its error thrown
in. The nsqd is built and never served, so no socket is involved anywhere.
"""

import dataclasses
import json
import time

import trio

from nsqpy.common.command import (
    MAGIC_V2,
    encode_auth,
    encode_identify,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FrameDecoder
from nsqpy.daemon.auth import AuthError, Authorization, AuthState
from nsqpy.nsqd.effects import BatchDone, Commit, QueryAuth, Upgrade
from nsqpy.nsqd.protocol_v2 import ProtocolV2
from nsqpy.nsqd.server import NSQD


class Driven:
    """An interpreter and its batches, driven as its connection drives them."""

    def __init__(self, nsqd: NSQD) -> None:
        self.protocol = ProtocolV2(nsqd, "127.0.0.1:1", trio.current_time)
        self.client = self.protocol.client
        self.batches = self.protocol.batches()

    def run(self, data: bytes, answer=lambda effect: None):
        """Feed `data` and run one batch: `answer(effect)` is each effect's outcome (an
        exception it returns is thrown in). Returns (the effects, whether to stay open, the
        replies)."""
        self.protocol.receive_data(data)
        effects = []
        outcome = None
        while True:
            if isinstance(outcome, Exception):
                effect = self.batches.throw(outcome)
            else:
                effect = self.batches.send(outcome)
            effects.append(effect)
            if isinstance(effect, BatchDone):
                return effects, effect.keep_open, frames_of(self.protocol.replies())
            outcome = answer(effect)


def frames_of(data: bytes) -> list[tuple[int, bytes]]:
    return [(frame.frame_type, frame.data) for frame in FrameDecoder().receive_data(data)]


async def test_a_batch_of_publishes_is_answered_after_one_commit(standalone):
    driven = Driven(standalone)
    data = MAGIC_V2 + encode_pub("t", b"one") + encode_pub("t", b"two")
    effects, keep_open, replies = driven.run(data)
    assert effects == [BatchDone(keep_open=True, commit=True)]
    assert replies == [(0, b"OK"), (0, b"OK")]
    assert keep_open
    assert standalone.topics["t"].depth == 2


async def test_a_fatal_error_ends_the_batch_and_the_connection(standalone):
    driven = Driven(standalone)
    effects, keep_open, replies = driven.run(MAGIC_V2 + b"WHAT\n" + encode_pub("t", b"never run"))
    assert replies == [(1, b"E_INVALID invalid command WHAT")]
    assert not keep_open and driven.protocol.refused
    assert "t" not in standalone.topics


async def test_a_command_split_across_reads_runs_once_whole(standalone):
    driven = Driven(standalone)
    publish = encode_pub("t", b"body")
    _, _, replies = driven.run(MAGIC_V2 + publish[:7])
    assert replies == []
    _, _, replies = driven.run(publish[7:])
    assert replies == [(0, b"OK")]
    assert driven.protocol.commands_run == 1


async def test_auth_asks_the_connection_to_query_the_auth_server(nsqd_options):
    server = NSQD(dataclasses.replace(nsqd_options, auth_http_address=["127.0.0.1:9"]))
    driven = Driven(server)

    def authorize(effect):
        if not isinstance(effect, QueryAuth):
            return None
        assert driven.client.auth_secret == "s3cret"
        driven.client.auth_state = AuthState(
            identity="me",
            expires=time.monotonic() + 60,
            authorizations=[Authorization("t", [".*"], ["publish"])],
        )

    effects, keep_open, replies = driven.run(
        MAGIC_V2 + encode_auth("s3cret") + encode_pub("t", b"x"), authorize
    )
    assert [type(effect) for effect in effects] == [QueryAuth, BatchDone]
    assert json.loads(replies[0][1]) == {
        "identity": "me",
        "identity_url": "",
        "permission_count": 1,
    }
    assert replies[1] == (0, b"OK")
    assert keep_open


async def test_an_auth_server_that_fails_is_e_auth_failed(nsqd_options):
    server = NSQD(dataclasses.replace(nsqd_options, auth_http_address=["127.0.0.1:9"]))
    driven = Driven(server)
    effects, keep_open, replies = driven.run(
        MAGIC_V2 + encode_auth("s3cret"),
        lambda effect: AuthError("refused") if isinstance(effect, QueryAuth) else None,
    )
    assert replies == [(1, b"E_AUTH_FAILED AUTH failed")]
    assert not keep_open


async def test_expired_authorizations_are_queried_again_before_a_publish(nsqd_options):
    server = NSQD(dataclasses.replace(nsqd_options, auth_http_address=["127.0.0.1:9"]))
    driven = Driven(server)
    driven.client.auth_state = AuthState(
        expires=time.monotonic() - 1,
        authorizations=[Authorization("^t$", [".*"], ["publish"])],
    )
    effects, _, replies = driven.run(MAGIC_V2 + encode_pub("other", b"x"))
    assert [type(effect) for effect in effects] == [QueryAuth, BatchDone]
    assert replies == [(1, b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""')]


async def test_identify_with_compression_is_an_upgrade_after_the_replies_before_it(standalone):
    driven = Driven(standalone)
    identify = encode_identify({"feature_negotiation": True, "snappy": True})
    effects, keep_open, _ = driven.run(MAGIC_V2 + encode_pub("t", b"x") + identify)
    upgrade = effects[0]
    assert isinstance(upgrade, Upgrade)
    assert upgrade.negotiated.snappy
    assert frames_of(upgrade.before) == [(0, b"OK")]
    assert json.loads(upgrade.negotiated.reply)["snappy"] is True
    assert keep_open


async def test_deliveries_are_the_frames_rdy_lets_out(standalone):
    driven = Driven(standalone)
    _, _, replies = driven.run(MAGIC_V2 + encode_sub("t", "c") + encode_rdy(1))
    assert replies == [(0, b"OK")]
    standalone.topics["t"].publish([b"first", b"second"])
    pieces, held_for = driven.protocol.deliveries()
    assert pieces is not None and held_for == 0.0
    [(frame_type, message)] = frames_of(b"".join(pieces))
    assert frame_type == 2 and message.endswith(b"first")
    assert driven.protocol.deliveries() == (None, 0.0)  # RDY 1, one in flight


async def test_a_log_publish_is_answered_by_its_groups_write(nsqd_options):
    server = NSQD(dataclasses.replace(nsqd_options, log_topic=["lt"]))
    driven = Driven(server)
    data = MAGIC_V2 + encode_pub("lt", b"kept") + encode_pub("lt", b"lost")

    def disk_full(effect):
        if isinstance(effect, Commit):
            # What the connection's commit leaves on a group whose write failed.
            for group in effect.groups:
                group.error = OSError("no space left on device")
                group.done = True

    effects, keep_open, replies = driven.run(data, disk_full)
    commit, done = effects
    assert isinstance(commit, Commit) and len(commit.groups) == 2
    assert done == BatchDone(keep_open=False)
    # The first refusal is fatal for a classic client: nothing after it is answered.
    assert replies == [(1, b"E_PUB_FAILED PUB failed no space left on device")]
    assert not keep_open and driven.protocol.refused
    for topic in server.topics.values():
        topic.close()
