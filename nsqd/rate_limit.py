"""A channel's delivery rate limit, Youzan's `/channel/ratelimit` and `--channel-ratelimit-kb`.

Youzan limits the network bandwidth a channel's large messages take: a message whose body is
over 1 KiB costs its size in whole KiB from a token bucket refilled at the limit each second
and holding four seconds' worth; smaller messages are free. nsqpy keeps that bucket, and
lets its consumers' message pumps take messages whenever the bucket is not in debt, as many
as it pays for at what messages cost lately (one at least): what a batch costs is paid after
it is sent, so no message is held back once taken (a consumer that goes away meanwhile loses
none), and the channel delivers its limit smoothly (bench/RESULTS.md).

Youzan waits at most a second for one message and lets one costing more than the bucket
holds through at once: accidents of Go's `rate.Limiter`, so the limit here stays exact.
"""

from collections.abc import Sequence

from nsqpy.nsqd.message import Message

# Bodies up to this size cost nothing; a larger one costs its size in whole KiB.
SMALL_MESSAGE_BYTES = 1024
# The bucket holds this many seconds of the rate (Youzan's burst).
BURST_SECONDS = 4


class RateLimit:
    """A token bucket of KiB: `kilobytes` a second, holding `BURST_SECONDS` of them."""

    __slots__ = ("kilobytes", "_tokens", "_at", "_cost", "limited_count")

    def __init__(self, kilobytes: int, now: float) -> None:
        self.kilobytes = kilobytes
        self._tokens = float(kilobytes * BURST_SECONDS)
        self._at = now
        # What a message cost lately (KiB), to take no more than the bucket pays for.
        self._cost = 0.0
        # How many times a consumer waited for the bucket (Youzan's ChannelRateLimitCnt).
        self.limited_count = 0

    def _refill(self, now: float) -> None:
        burst = self.kilobytes * BURST_SECONDS
        self._tokens = min(burst, self._tokens + (now - self._at) * self.kilobytes)
        self._at = now

    def wait(self, now: float) -> float:
        """Seconds until the channel may send again: 0 unless the bucket is in debt."""
        self._refill(now)
        if self._tokens >= 0:
            return 0.0
        self.limited_count += 1
        return -self._tokens / self.kilobytes

    def affordable(self, wanted: int) -> int:
        """Of `wanted` messages, how many the bucket pays for now at what messages cost
        lately (one at least): so a consumer's batch is smooth, not a second's worth."""
        if self._cost <= 0:
            return wanted
        return max(1, min(wanted, int(self._tokens / self._cost)))

    def spend(self, messages: Sequence[Message], now: float) -> None:
        """What `messages` cost, taken from the bucket (into debt if need be)."""
        cost = sum(
            len(message.body) // SMALL_MESSAGE_BYTES
            for message in messages
            if len(message.body) > SMALL_MESSAGE_BYTES
        )
        if messages:
            self._cost = cost / len(messages)
        if cost:
            self._refill(now)
            self._tokens -= cost

    def change(self, kilobytes: int, now: float) -> None:
        """A new rate from `now`; the bucket keeps what it holds, up to its new size."""
        self._refill(now)
        self.kilobytes = kilobytes
        self._tokens = min(self._tokens, float(kilobytes * BURST_SECONDS))
