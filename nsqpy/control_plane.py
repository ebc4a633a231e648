"""What a daemon of a cluster knows of its control plane, and how it keeps at it.

nsqd and nsqlookupd coordinate through etcd (docs/design.md §14): etcd may stop answering, the
master nsqlookupd may go, a lease may be lost. None of that is a reason to exit. Each daemon
keeps a `ControlPlaneHealth`, which

* logs one line when such a state begins and one when it ends (never a line per retry), and
* says while it lasts what is wrong and since when, for `/stats`, `/cluster/stats` and
  nsqadmin ("etcd unreachable since ...", "no master nsqlookupd since ...", "lease lost
  since ...").

`keep_running` runs a coordination loop for as long as the daemon runs: whatever escapes it,
grouped by a nursery or not, is logged and the loop starts again after a pause.
"""

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from nsqpy.etcd import EtcdHealth, iso_time

# How long a coordination loop that failed waits before it starts again, doubling to the max.
RESTART_DELAY = 0.2
RESTART_MAX_DELAY = 5.0


class Condition:
    """A state that begins and ends (etcd unreachable, no master, the lease lost): logged once
    at each change, with how long it lasted when it ends."""

    __slots__ = ("what", "log", "since", "since_wall", "detail")

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self.since: float | None = None  # trio's clock
        self.since_wall = 0.0
        self.detail = ""

    @property
    def holds(self) -> bool:
        return self.since is not None

    def begin(self, detail: str = "") -> None:
        if self.since is None:
            self.since = _now()
            self.since_wall = time.time()
            self.detail = detail
            self.log.error("CLUSTER: %s%s", self.what, f" - {detail}" if detail else "")
        else:
            self.detail = detail or self.detail

    def end(self, how: str = "") -> None:
        if self.since is not None:
            lasted = _now() - self.since
            self.since = None
            self.detail = ""
            self.log.info(
                "CLUSTER: %s no more, after %.1f s%s", self.what, lasted, f" ({how})" if how else ""
            )

    def describe(self) -> str | None:
        """ "<what> since <time> (<n> s): <detail>" while it holds."""
        if self.since is None:
            return None
        lasted = _now() - self.since
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.what} since {iso_time(self.since_wall)} ({lasted:.0f} s){detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "since": iso_time(self.since_wall) if self.since is not None else None,
            "detail": self.detail,
        }


class ControlPlaneHealth:
    """A daemon's view of its control plane: etcd's answers (the client's `EtcdHealth`), the
    master nsqlookupd, and the daemon's own lease."""

    def __init__(self, etcd: EtcdHealth, log: logging.Logger, *, lease_holder: str) -> None:
        self.etcd = etcd
        self.log = log
        self.etcd_down = Condition("etcd unreachable", log)
        self.no_master = Condition("no master nsqlookupd", log)
        self.lease_lost = Condition(f"{lease_holder}'s etcd lease lost", log)
        etcd.on_change = self._etcd_changed
        self.master: dict | None = None

    def _etcd_changed(self, health: EtcdHealth) -> None:
        if health.reachable:
            self.etcd_down.end("it answers again")
        else:
            self.etcd_down.begin(health.error)

    def master_changed(self, master: dict | None) -> None:
        previous = self.master
        self.master = master
        if master is None:
            self.no_master.begin()
            return
        if self.no_master.holds:
            self.no_master.end(f"{_master_name(master)} is the master")
        elif previous is not None and _master_name(previous) != _master_name(master):
            self.log.info("CLUSTER: %s is the master now", _master_name(master))

    def problems(self) -> list[str]:
        """What is wrong now, one sentence each."""
        found = [
            condition.describe()
            for condition in (self.etcd_down, self.no_master, self.lease_lost)
            if condition.holds
        ]
        for url, (since, error) in sorted(self.etcd.failing.items()):
            if self.etcd.reachable:
                found.append(f"etcd member {url} not answering since {iso_time(since)}: {error}")
        return [problem for problem in found if problem]

    def to_json(self) -> dict[str, Any]:
        """The `control_plane` object of `/stats` and `/cluster/stats`."""
        return {
            "healthy": not self.problems(),
            "problems": self.problems(),
            "etcd": self.etcd.to_json(),
            "master": self.master,
            "no_master_since": self.no_master.to_json()["since"],
            "lease_lost_since": self.lease_lost.to_json()["since"],
        }


def _master_name(master: dict) -> str:
    return f"{master.get('NodeIP')}:{master.get('HttpPort')}"


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside a trio run
        return time.monotonic()


async def keep_running(name: str, loop: Callable[[], Awaitable[None]], log: logging.Logger) -> None:
    """Run `loop` until cancelled; when anything escapes it (an error its own handlers did
    not take, alone or grouped by a nursery), log it (with its traceback the first time) and
    start it again after a pause that doubles to RESTART_MAX_DELAY while it keeps failing."""
    delay = RESTART_DELAY
    seen: set[str] = set()
    while True:
        started = trio.current_time()
        try:
            await loop()
        except* Exception as group:
            leaves = [str(error) or type(error).__name__ for error in _leaves(group)]
            text = "; ".join(leaves)
            first = text not in seen
            seen.add(text)
            log.error(
                "CLUSTER: %s failed - %s; starting it again",
                name,
                text,
                exc_info=group if first else None,
            )
        if trio.current_time() - started > RESTART_MAX_DELAY:
            delay = RESTART_DELAY  # it ran well for a while
        await trio.sleep(delay)
        delay = min(delay * 2, RESTART_MAX_DELAY)


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for member in group.exceptions for leaf in _leaves(member)]
    return [group]
