"""The client's sans-IO core (`nsqpy.client.core`): what a consumer decides, given what
happened and when, with no I/O: each adapter (blocking, asyncio, trio) only carries it out."""

import pytest

from nsqpy.client.core import (
    ProducerSequences,
    PublishAttempts,
    PublishRouter,
    SequencedPublish,
    SubscriptionError,
    SubscriptionPlan,
    SubscriptionReader,
    Target,
    Targets,
    backoff_delay,
    consume_starts,
    decode_delivery,
    partition_for_key,
    ready_counts,
)
from nsqpy.client.smart import TopicLayout
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqpy.common.message import encode_message

A, B = "10.0.0.1:4150", "10.0.0.2:4150"


def frame(frame_type: int, data: bytes) -> bytes:
    return (len(data) + 4).to_bytes(4, "big") + frame_type.to_bytes(4, "big") + data


def message_frame(body: bytes, message_id: bytes = b"0123456789abcdef") -> bytes:
    return frame(FRAME_TYPE_MESSAGE, encode_message(1_700_000_000_000_000_000, 1, message_id, body))


def test_rdy_spreads_max_in_flight_with_at_least_one_each_and_the_server_cap():
    assert ready_counts(6, [2500] * 4) == [2, 2, 1, 1]
    assert ready_counts(2, [2500] * 3) == [1, 1, 1]
    assert ready_counts(5000, [2500, 100]) == [2500, 100]
    assert ready_counts(10, []) == []


def test_backoff_doubles_up_to_its_maximum():
    assert [backoff_delay(n, 0.1, 1.0) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0]


def test_a_lookup_makes_every_partition_due_once():
    plan = SubscriptionPlan(lookup_interval=60)
    plan.looked_up(Targets((Target(A, 0), Target(B, 1))), now=0)
    assert plan.due(0) == [Target(A, 0), Target(B, 1)]
    assert plan.due(0) == []  # they are being connected
    assert plan.subscribed(Target(A, 0)) and plan.subscribed(Target(B, 1))
    assert not plan.lookup_due(30) and plan.lookup_due(60)
    assert plan.next_wakeup(1) == 60


def test_a_moved_leader_is_left_and_the_new_one_subscribed():
    plan = SubscriptionPlan()
    plan.looked_up(Targets((Target(A, 0),)), now=0)
    plan.due(0)
    plan.subscribed(Target(A, 0))
    assert plan.looked_up(Targets((Target(B, 0),)), now=5) == [Target(A, 0)]
    assert plan.lost(Target(A, 0), now=5, retired=True)
    assert plan.due(5) == [Target(B, 0)]  # at once: a planned move is no failure


def test_a_lost_subscription_is_looked_up_then_retried_after_a_backoff():
    plan = SubscriptionPlan(backoff_initial=0.5, backoff_max=4)
    plan.looked_up(Targets((Target(A, 0),)), now=0)
    plan.due(0)
    plan.subscribed(Target(A, 0))
    assert plan.lost(Target(A, 0), now=10)
    assert plan.lookup_due(10)  # the leader may have moved
    plan.looked_up(Targets((Target(A, 0),)), now=10)
    assert plan.due(10) == [] and plan.due(10.5) == [Target(A, 0)]
    assert plan.subscribe_failed(Target(A, 0), now=10.5) == 1.0
    assert plan.due(11) == [] and plan.due(11.5) == [Target(A, 0)]


def test_a_subscription_that_arrives_after_its_partition_moved_is_not_kept():
    plan = SubscriptionPlan()
    plan.looked_up(Targets((Target(A, 0),)), now=0)
    plan.due(0)
    plan.looked_up(Targets((Target(B, 0),)), now=1)
    assert not plan.subscribed(Target(A, 0))


def test_a_lost_partition_no_lookup_lists_is_looked_for_again_after_a_backoff():
    plan = SubscriptionPlan(backoff_initial=1, backoff_max=8)
    plan.looked_up(Targets((Target(A, 0),)), now=0)
    plan.due(0)
    plan.subscribed(Target(A, 0))
    plan.lost(Target(A, 0), now=0)
    plan.looked_up(Targets(()), now=2)  # a failover under way
    assert not plan.lookup_due(3) and plan.lookup_due(4)
    plan.lookup_failed(4)  # and no lookupd answers: not a busy loop
    assert not plan.lookup_due(5)


def test_refusals_teach_ordered_and_ext_topics_once():
    plan = SubscriptionPlan()
    assert plan.sub_command(Target(A, 3), "t", "c") == ("SUB", ["t", "c", 3], False)
    assert plan.refused("E_SUB_ORDER_IS_MUST") and not plan.refused("E_SUB_ORDER_IS_MUST")
    assert plan.sub_command(Target(A, 3), "t", "c") == ("SUB_ORDERED", ["t", "c", 3], True)
    assert plan.refused("E_SUB_EXTEND_NEED")
    assert plan.identify({"client_id": "x"}) == {"extend_support": True, "client_id": "x"}
    assert not plan.refused("E_BAD_TOPIC")
    assert not SubscriptionPlan(ordered=False).refused("E_SUB_ORDER_IS_MUST")


def test_while_nothing_is_subscribed_the_idle_interval_paces_lookups():
    plan = SubscriptionPlan(lookup_interval=60, idle_lookup_interval=1)
    plan.looked_up(Targets(()), now=0)
    assert plan.lookup_due(1) and plan.next_wakeup(0.5) == 1


def test_a_delivery_splits_the_ext_header_then_the_ordered_detail():
    body = b"\x01\x00\x0b" + b'{"k":"v"}xx' + (7).to_bytes(8, "big") + (42).to_bytes(4, "big")
    delivery = decode_delivery(
        encode_message(5, 2, b"0123456789abcdef", body + b"data"), detail=True, extend=True
    )
    assert (delivery.ext_header, delivery.offset, delivery.record_size, delivery.body) == (
        b'{"k":"v"}xx',
        7,
        42,
        b"data",
    )
    assert (delivery.attempts, delivery.timestamp) == (2, 5)


def test_the_reader_answers_heartbeats_keeps_warnings_and_ends_on_fatal_errors():
    reader = SubscriptionReader(detail=False, extend=False)
    data = frame(FRAME_TYPE_RESPONSE, b"_heartbeat_") + message_frame(b"one")
    events = reader.receive_data(data[:7])
    assert events.deliveries == [] and events.reply == b""
    events = reader.receive_data(data[7:] + frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED late"))
    assert events.reply == b"NOP\n"
    assert [d.body for d in events.deliveries] == [b"one"]
    assert events.warnings == ["E_FIN_FAILED late"]
    assert reader.receive_data(frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")).closed
    with pytest.raises(SubscriptionError, match="E_BAD_TOPIC"):
        reader.receive_data(frame(FRAME_TYPE_ERROR, b"E_BAD_TOPIC nope"))


class Layout:
    """A lookup of writable partitions, as `nsqpy.client.smart.TopicLayout` has it."""

    def __init__(self, partitions: dict[int, str], partition_num: int = 0, ordered=False):
        self.topic = "t"
        self.partitions = partitions
        self.partition_num = partition_num or len(partitions)
        self.ordered = ordered
        self.extend_support = False
        self.classic_nodes = ()

    @property
    def complete(self) -> bool:
        return len(self.partitions) >= self.partition_num


def test_publishes_go_round_robin_and_around_a_partition_that_refused():
    router = PublishRouter(partition_cooldown=5)
    layout = Layout({0: A, 1: B})
    chosen = [router.choose(layout, None, None, set(), now=0) for _ in range(3)]
    assert chosen == [Target(A, 0), Target(B, 1), Target(A, 0)]
    router.refused("t", Target(B, 1), now=0)
    assert [router.choose(layout, None, None, set(), now=1).partition for _ in range(2)] == [0, 0]
    assert router.choose(layout, None, None, set(), now=6) == Target(B, 1)  # cooled down


def test_a_key_keeps_its_partition_and_an_ordered_topic_needs_one():
    router = PublishRouter()
    layout = Layout({0: A, 1: B, 2: A, 3: B})
    assert {router.choose(layout, "k7", None, set(), 0).partition for _ in range(4)} == {
        partition_for_key("k7", 4)
    }
    with pytest.raises(ValueError, match="ordered"):
        router.choose(Layout({0: A}, ordered=True), None, None, set(), 0)
    with pytest.raises(ValueError, match="partitions 0..3, not 9"):
        router.choose(layout, None, 9, set(), 0)


def test_lookups_never_lower_the_partition_count_nor_forget_ordering():
    router = PublishRouter(lookup_interval=60, backoff_max=1)
    router.looked_up("t", TopicLayout("t", "w", {0: A, 1: B}, 2, ordered=True), now=0)
    kept = router.looked_up("t", TopicLayout("t", "w", {0: A}, 1), now=10)
    assert (kept.partition_num, kept.ordered) == (2, True)
    assert router.cached("t", 10.5) is kept and router.cached("t", 11) is None  # incomplete


def test_a_publish_retries_elsewhere_then_pauses_then_gives_up():
    router = PublishRouter()
    layout = Layout({0: A, 1: B})
    attempts = PublishAttempts(router, "t", None, None, 10, backoff=0.5, backoff_max=2)
    first = attempts.next(layout, now=0)
    assert attempts.failed(first, OSError("reset"), now=0)
    second = attempts.next(layout, now=0)
    assert second != first and attempts.failed(second, OSError("reset"), now=0)
    assert attempts.next(layout, now=0) == 0.5 and attempts.refresh  # both tried: look up
    assert isinstance(attempts.next(layout, now=1), Target)
    assert attempts.next(None, now=10) is None  # no lookupd, deadline passed
    assert attempts.attempts == 3 and str(attempts.last_error) == "reset"


def test_a_claimed_publish_moves_only_after_a_refusal_that_says_it_was_not_stored():
    """An idempotent publish sent to a partition keeps its partition, producer and sequences
    after a refusal that says it may be stored (`MAYBE_STORED`: its leader sent it to
    followers before giving up) or after an attempt that went unanswered: moved under a new
    claim, it could be stored twice. A plain refusal (nothing written) lets it move."""
    router = PublishRouter()
    layout = Layout({0: A, 1: B})
    for answer, moves in [
        ("E_FAILED_ON_NOT_LEADER ", True),
        ("E_FAILED_ON_NOT_LEADER MAYBE_STORED sent to followers before the leader gave up", False),
        (None, False),  # no answer at all: a broken connection
    ]:
        sequences = ProducerSequences("p")
        attempts = PublishAttempts(router, "t", None, None, 10, backoff=0.5, backoff_max=2)
        sequenced = SequencedPublish(sequences, "t", [b"x"], attempts, False)
        target = attempts.next(layout, now=0)
        sequenced.command(target.partition, {"idempotent_publish": True})
        claim = sequenced.claim
        if answer is None:
            sequenced.answer_lost()
        else:
            assert sequenced.refused(answer.split(" ")[0], answer) is False
        if moves:
            assert sequenced.claim is None and attempts.partition is None
        else:
            assert sequenced.claim == claim and attempts.partition == target.partition
            sequenced.refused("E_FAILED_ON_NOT_WRITABLE", "E_FAILED_ON_NOT_WRITABLE ")
            assert sequenced.claim == claim


def test_a_consume_start_goes_with_each_partitions_first_subscription_only():
    """Youzan's SUB_ADVANCED: a partition's own start, else the one for every partition; a
    reconnect goes on where the channel is."""
    plan = SubscriptionPlan(start_from=consume_starts({1: "msgcount:5"}) | {None: "special:-1"})
    plan.looked_up(Targets((Target(A, 0), Target(A, 1))), now=0)
    assert plan.sub_command(Target(A, 1), "t", "c") == (
        "SUB_ADVANCED",
        ["t", "c", 1, "msgcount:5"],
        True,
    )
    assert plan.sub_command(Target(A, 0), "t", "c")[1] == ["t", "c", 0, "special:-1"]
    plan.due(0)
    assert plan.subscribed(Target(A, 1))
    assert plan.sub_command(Target(A, 1), "t", "c") == ("SUB", ["t", "c", 1], False)
    for bad in ("msgcount", "offset:3", "timestamp:soon", ""):
        with pytest.raises(ValueError, match="a consume start is <type>:<integer>"):
            consume_starts(bad)
