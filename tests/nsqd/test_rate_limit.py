"""A channel's rate limit (nsqd/rate_limit.py) on explicit times: Youzan's bucket of KiB, four
seconds of the limit, bodies over 1 KiB costing their whole KiB, paid after a batch."""

from nsqpy.nsqd.message import Message
from nsqpy.nsqd.rate_limit import RateLimit


def messages(count: int, size: int) -> list[Message]:
    return [Message(bytes(16), b"x" * size, 0) for _ in range(count)]


def test_the_bucket_holds_four_seconds_then_refills_at_the_limit():
    limit = RateLimit(10, now=0.0)
    limit.spend(messages(4, 10 * 1024), now=0.0)  # 40 KiB: the whole bucket
    assert limit.wait(0.0) == 0.0
    limit.spend(messages(1, 10 * 1024), now=0.0)
    assert limit.wait(0.0) == 1.0  # 10 KiB of debt at 10 KiB/s
    assert limit.wait(0.5) == 0.5
    assert limit.wait(1.0) == 0.0
    assert limit.limited_count == 2


def test_small_bodies_cost_nothing_and_a_large_one_its_whole_kib():
    limit = RateLimit(1, now=0.0)
    limit.spend(messages(1000, 1024), now=0.0)
    assert limit.wait(0.0) == 0.0
    limit.spend(messages(1, 4 * 1024 + 1023), now=0.0)  # 4 KiB: the bucket
    assert limit.wait(0.0) == 0.0
    limit.spend(messages(1, 2048), now=0.0)
    assert limit.wait(0.0) == 2.0


def test_a_batch_is_what_the_bucket_pays_for_at_the_last_cost():
    limit = RateLimit(100, now=0.0)
    assert limit.affordable(500) == 500  # nothing measured yet
    limit.spend(messages(10, 10 * 1024), now=0.0)  # 100 of 400 KiB
    assert limit.affordable(500) == 30
    limit.spend(messages(30, 10 * 1024), now=0.0)
    assert limit.affordable(500) == 1  # one at least, paid after
    assert limit.wait(0.0) == 0.0


def test_a_new_rate_keeps_what_the_bucket_holds_up_to_its_size():
    limit = RateLimit(100, now=0.0)
    limit.change(10, now=0.0)
    limit.spend(messages(5, 10 * 1024), now=0.0)  # 50 KiB against a 40 KiB bucket
    assert limit.wait(0.0) == 1.0
