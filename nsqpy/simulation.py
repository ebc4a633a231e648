"""The cluster in one trio run on a virtual clock: the production nsqlookupd (its coordinator)
and nsqd nodes (their cluster side), their etcd client on the etcd model, and a simulated
network between them (`nsqpy/simulated_network.py`), driven by a seeded fault schedule.

What runs is the daemons' own code; only what is under it differs (`nsqpy/network.py`): the
links, etcd and the worker threads. A seed decides everything random: the faults, the
producers' timing, trio's scheduling order, each data directory's identity, the daemons'
random choices; a run's trace (`Simulation.trace`: what the schedule did and saw, on the
virtual clock) is the same for the same seed.

    trace, failures = run_schedule(seed, schedule)

Each node writes real files under `root` through a disk of its own
(`nsqpy/simulated_disk.py`): a crash stops its writes at the instant it happens (what a
cancelled task's shutdown code writes never arrives), a power loss takes back what was not
fsynced, and a disk can fill. What it does not simulate yet: more than one etcd member.
"""

import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from nsqpy import disk, network
from nsqpy.etcd_model import EtcdModel
from nsqpy.etcd_model_network import ModelNetwork
from nsqpy.nsqd.data_path import CLEAN_STOP_FILE, INCARNATION_FILE
from nsqpy.nsqd.options import Options as NSQDOptions
from nsqpy.nsqd.server import NSQD
from nsqpy.nsqlookupd.options import Options as LookupdOptions
from nsqpy.nsqlookupd.server import NSQLookupd
from nsqpy.simulated_disk import SimulatedDisk
from nsqpy.simulated_network import FIRST_PORT, SimulatedNetwork

__all__ = ["Simulation", "run_schedule", "ScheduleFailure"]

ETCD_URL = "http://etcd:2379"
CLIENT_HOST = "10.0.1.1"
TTL = 2.0
# The most simulated time a schedule may take (one takes 8-15 s; its waits are bounded by
# less than half of this).
SCHEDULE_LIMIT = 300.0


class ScheduleFailure(AssertionError):
    """A check after a schedule failed: what it found, and the seed that replays it."""


@dataclass
class SimulatedDaemon:
    """One daemon of the simulated cluster: its host, and its process while it runs."""

    index: int
    host: str
    daemon: Any = None
    scope: trio.CancelScope | None = None
    stopped: trio.Event = field(default_factory=trio.Event)
    # Set while a crash is taking the daemon down (its shutdown code still running).
    stopping: bool = False

    @property
    def running(self) -> bool:
        return self.daemon is not None and not self.stopping


@dataclass
class SimulatedNode(SimulatedDaemon):
    """An nsqd of the simulated cluster, with its disk."""

    data_path: Path = Path()
    disk: SimulatedDisk = field(init=False)
    # Whether the node lost its disk, or its unsynced writes, once in this run
    # (`Simulation.lose_disk`, `Simulation.crash(power_loss=True)`).
    disk_lost: bool = False

    def __post_init__(self) -> None:
        self.disk = SimulatedDisk(self.data_path)

    @property
    def nsqd(self) -> NSQD | None:
        return self.daemon


@dataclass
class SimulatedLookupd(SimulatedDaemon):
    """An nsqlookupd of the simulated cluster (each campaigns to be the master)."""

    @property
    def lookupd(self) -> NSQLookupd | None:
        return self.daemon


class _TraceHandler(logging.Handler):
    """The daemons' log lines, each with the virtual time and the host that wrote it."""

    def __init__(self, simulation: "Simulation") -> None:
        super().__init__(logging.INFO)
        self.simulation = simulation

    def emit(self, record: logging.LogRecord) -> None:
        host = getattr(network.current(), "address", "-")
        self.simulation.note(host, record.getMessage())


class Simulation:
    """A cluster of `nodes` nsqds and `lookupds` nsqlookupds under `root`, in `nursery`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        root: Path,
        rng: random.Random,
        *,
        nodes: int = 3,
        lookupds: int = 2,
    ) -> None:
        self.nursery = nursery
        self.root = root
        self.rng = rng
        self.trace: list[str] = []
        # What the faults touched: (from, until, the hosts), for checks that excuse a loss
        # only where a fault could cause it.
        self.disturbed: list[tuple[float, float, frozenset[str]]] = []
        lease_ids = iter(range(0x7000, 0x7FFFFFFF))
        self.model = EtcdModel(lease_ids=lambda: next(lease_ids))
        self.etcd = ModelNetwork(self.model, nursery)
        self.network = SimulatedNetwork(self.etcd, random.Random(rng.getrandbits(64)))
        self.client = self.network.host(CLIENT_HOST)
        self.lookupds = [
            SimulatedLookupd(index, f"10.0.0.{100 + index}") for index in range(lookupds)
        ]
        self.nodes = [
            SimulatedNode(
                index,
                f"10.0.0.{index + 1}",
                data_path=root / f"nsqd{index}",
            )
            for index in range(nodes)
        ]

    # -- the trace -----------------------------------------------------------------------

    def note(self, host: str, text: str) -> None:
        # The directory the run was given is no part of what happened.
        text = text.replace(str(self.root), "<root>")
        self.trace.append(f"{trio.current_time():11.6f} {host} {text}")

    # -- the daemons ---------------------------------------------------------------------

    async def start(self) -> None:
        await self.nursery.start(self.etcd.run)
        for lookupd in self.lookupds:
            await self.start_lookupd(lookupd)
        for node in self.nodes:
            await self.start_node(node)
        await self.until(
            lambda: self.master() is not None and len(self.master().nodes) == len(self.nodes),
            "a master, every node registered",
            30,
        )

    def master_member(self) -> SimulatedLookupd | None:
        """The nsqlookupd that is the master now, or None."""
        for member in self.lookupds:
            lookupd = member.lookupd
            if lookupd is not None and lookupd.coordinator is not None:
                if lookupd.coordinator.is_master:
                    return member
        return None

    def master(self) -> Any:
        """The master's coordinator, or None."""
        member = self.master_member()
        return member.lookupd.coordinator if member is not None and member.lookupd else None

    def master_http(self) -> tuple[str, int] | None:
        member = self.master_member()
        if member is None or member.lookupd is None:
            return None
        return member.host, member.lookupd.http_port

    async def start_lookupd(self, member: SimulatedLookupd) -> None:
        options = LookupdOptions(
            tcp_address=f"{member.host}:0",
            http_address=f"{member.host}:0",
            broadcast_address=member.host,
            cluster_leadership_addresses=ETCD_URL,
            cluster_id="sim",
            cluster_node_ttl=TTL,
        )
        member.stopped = trio.Event()

        def make() -> NSQLookupd:
            return NSQLookupd(options, logging.getLogger(f"sim.nsqlookupd{member.index}"))

        member.daemon = await self.nursery.start(self._run_daemon, member, make)
        self.note(member.host, "STARTED")

    async def start_node(self, node: SimulatedNode) -> None:
        node.data_path.mkdir(parents=True, exist_ok=True)
        identity = node.data_path / INCARNATION_FILE
        if not identity.exists():
            # The identity nsqd would make at random, made from the seed.
            identity.write_text(f"{self.rng.getrandbits(128):032x}\n")
            # A new directory: its first start follows no crash.
            (node.data_path / CLEAN_STOP_FILE).touch()
        node.disk.start()
        options = NSQDOptions(
            tcp_address=f"{node.host}:0",
            http_address=f"{node.host}:0",
            https_address="",
            rpc_port=f"{node.host}:0",
            broadcast_address=node.host,
            data_path=str(node.data_path),
            node_id=node.index,
            # Each nsqlookupd takes the same ports each time it starts (the first ones).
            lookupd_tcp_address=[f"{member.host}:{FIRST_PORT}" for member in self.lookupds],
            cluster_leadership_addresses=ETCD_URL,
            cluster_id="sim",
            cluster_node_ttl=TTL,
            sync_timeout=1.0,
        )
        node.stopped = trio.Event()
        seed = self.rng.getrandbits(64)

        def make() -> NSQD:
            nsqd = NSQD(options, logging.getLogger(f"sim.nsqd{node.index}"))
            nsqd.random.seed(seed)
            return nsqd

        node.daemon = await self.nursery.start(self._run_daemon, node, make)
        self.note(node.host, "STARTED")

    async def _run_daemon(
        self, member: SimulatedDaemon, make: Callable[[], Any], task_status
    ) -> None:
        """Run the daemon `make` makes on `member`'s host (and disk) until it stops or
        crashes."""
        own_disk = member.disk if isinstance(member, SimulatedNode) else disk.SYSTEM
        with network.using(self.network.host(member.host)), disk.using(own_disk):
            daemon = make()
            try:
                with trio.CancelScope() as member.scope:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(daemon.serve)
                        task_status.started(daemon)
            except* Exception as group:
                # What a crashed process's shutdown code raised (its disk and its links are
                # gone) is no one's to see: a killed process ends with nothing.
                if not member.stopping:
                    raise
                self.note(member.host, f"ENDED WITH {group!r}")
            finally:
                member.daemon = None
                member.stopped.set()

    async def crash(self, member: SimulatedDaemon, *, power_loss: bool = False) -> bool:
        """The daemon's process ends at once: its connections reset, its tasks cancelled,
        its disk taking nothing more. With `power_loss` (a node's) its machine ends too:
        what its disk had not made durable is gone. False when it was not running (or
        another crash is taking it down)."""
        if member.scope is None or not member.running:
            return False
        self.note(member.host, "POWER LOSS" if power_loss else "CRASH")
        member.stopping = True
        if isinstance(member, SimulatedNode):
            member.disk.crash()
            # Damaged from this instant (a schedule counts its damaged disks).
            member.disk_lost = member.disk_lost or power_loss
        # Cancelled first: a task parked on the network sees its cancellation, not the
        # network's end, as a killed process sees nothing.
        member.scope.cancel()
        self.network.crash(member.host)
        await member.stopped.wait()
        if power_loss and isinstance(member, SimulatedNode):
            for cut in member.disk.lose_unsynced():
                self.note(member.host, f"UNSYNCED LOST {cut}")
        self.network.revive(member.host)
        member.stopping = False
        return True

    async def stop(self, member: SimulatedDaemon) -> None:
        """A clean stop (SIGTERM): the daemon's own shutdown, to its end."""
        if member.daemon is not None:
            member.daemon.shutdown()
            await member.stopped.wait()
            self.note(member.host, "STOPPED")

    async def lose_disk(self, node: SimulatedNode) -> bool:
        """The node crashes and its data directory is gone: it starts again on an empty one
        (a new incarnation). False when it was not running."""
        node.disk_lost = True
        if not await self.crash(node):
            return False
        self.note(node.host, "DISK LOST")
        shutil.rmtree(node.data_path)
        return True

    # -- asking the daemons --------------------------------------------------------------

    async def http(
        self, host: str, port: int, method: str, target: str, body: bytes = b""
    ) -> tuple[int, bytes]:
        """A client's request; (0, b"") when no answer came within 5 s."""
        try:
            answer = await self.client.exchange(host, port, method, target, body, timeout=5)
        except OSError:
            return 0, b""
        return answer.status, answer.body

    async def until(self, condition: Callable[[], bool], what: str, seconds: float) -> None:
        """Poll `condition` on the virtual clock; ScheduleFailure after `seconds`."""
        with trio.move_on_after(seconds):
            while not condition():
                await trio.sleep(0.05)
            return
        raise ScheduleFailure(f"not within {seconds:g} s: {what}")


async def _main(seed: int, root: Path, schedule: Callable, result: dict) -> None:
    rng = random.Random(seed)
    # The daemons' loggers, and the one the partition logs' worker-thread jobs write to.
    loggers = [logging.getLogger(name) for name in ("sim", "nsqpy.partition_log")]
    async with trio.open_nursery() as nursery:
        simulation = Simulation(nursery, root, rng)
        handler = _TraceHandler(simulation)
        kept = [(logger.level, logger.propagate) for logger in loggers]
        for logger in loggers:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        try:
            # A schedule waiting on something that never comes would spin for ever on the
            # virtual clock (nothing due, nothing to run): this deadline ends it.
            with trio.move_on_after(SCHEDULE_LIMIT) as limit:
                await simulation.start()
                result["failures"] = await schedule(simulation)
            if limit.cancelled_caught:
                raise ScheduleFailure(
                    f"no end within {SCHEDULE_LIMIT:g} simulated s: a task waits for ever"
                )
        except ScheduleFailure as failure:
            simulation.note("schedule", f"FAILED {failure}")
            result["failures"] = [str(failure)]
        finally:
            for logger, (level, propagate) in zip(loggers, kept, strict=True):
                logger.removeHandler(handler)
                logger.setLevel(level)
                logger.propagate = propagate
            result["trace"] = simulation.trace
            nursery.cancel_scope.cancel()


def run_schedule(
    seed: int, schedule: Callable, root: Path | None = None
) -> tuple[list[str], list[str]]:
    """Run `schedule(simulation)` (a coroutine function returning what it found wrong) on a
    fresh cluster seeded by `seed`: its trace and its failures. The nodes' files go under
    `root`, or a temporary directory on tmpfs where there is one (fsyncs on a real disk
    would be most of a schedule's time), removed afterwards."""
    if root is None:
        shm = "/dev/shm"
        with tempfile.TemporaryDirectory(
            prefix="nsqpy-simulation-", dir=shm if os.path.isdir(shm) else None
        ) as directory:
            return run_schedule(seed, schedule, Path(directory))
    random.seed(seed)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    result: dict = {"trace": [], "failures": []}
    # trio runs each batch of runnable tasks in an order of its choosing: at random, and
    # where the batch came from timers due together, by the timers' memory addresses. Its
    # deterministic mode (what its Hypothesis plugin turns on) sorts a batch by the tasks'
    # creation, then shuffles it with its generator, seeded here.
    trio_run = trio._core._run
    deterministic = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)
    try:
        trio.run(
            _main,
            seed,
            root,
            schedule,
            result,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = deterministic  # type: ignore[misc]
    return result["trace"], result["failures"]
