"""The master's writes of partitions' replica infos, batched and fenced.

Every change the master makes to a partition (an election, an ISR change, a move) is a
compare-and-swap of its `ReplicaInfo` on the revision it read (docs/design.md §14). Made one
at a time, a dead node's hundred partitions took a hundred etcd round trips, each waiting for
etcd's fsync, one after another (~15 ms a partition). Kafka's controller sends one
LeaderAndIsr for many partitions; here every write asked while a transaction is under way
goes into the next one: one transaction, up to etcd's 128 operations, for as many
partitions as were waiting.

Each transaction is also **fenced**: it holds only while the master key
(`LookupdLeaderSession`) is still the one this nsqlookupd created (its create revision), so
a master that lost its lease (paused, cut off) and has not noticed yet cannot change a
partition after another master has taken over. Two masters never both write.

A transaction whose compares fail is not a failed batch: its failure branch reads every key,
and each write is then decided alone: a key still at the revision it was asked on goes into
the next transaction (another key's compare failed), a key holding exactly the value asked
for was written by an earlier try whose answer was lost (it is done), any other has changed
(the write fails, as one compare-and-swap would).
"""

from dataclasses import dataclass, field

import trio

from nsqpy.etcd import (
    MAX_TXN_OPS,
    Compare,
    EtcdAuthError,
    EtcdClient,
    EtcdError,
    put_op,
    range_op,
)

# One transaction stays well inside etcd's request size limit (--max-request-bytes, 1.5 MiB).
MAX_BATCH_BYTES = 512 * 1024


class NotMaster(Exception):
    """The master key is no longer this nsqlookupd's: it wrote nothing, and is no master."""


@dataclass(eq=False)
class _Write:
    key: str
    value: bytes
    previous: int
    done: trio.Event = field(default_factory=trio.Event)
    revision: int = 0
    error: BaseException | None = None

    def finish(self, revision: int = 0, error: BaseException | None = None) -> None:
        self.revision, self.error = revision, error
        self.done.set()


class ReplicaInfoWrites:
    """Compare-and-swap writes of keys, batched into fenced transactions (the module
    docstring). `fence` is the master key's create revision while this nsqlookupd is the
    master, 0 otherwise; `run` carries the writes out, in the master's nursery."""

    def __init__(self, client: EtcdClient, fence_key: str) -> None:
        self.client = client
        self.fence_key = fence_key
        self.fence = 0
        self._pending: list[_Write] = []
        self._wakeup = trio.Event()
        # Transactions made, and writes they carried (for the stats and the bench).
        self.transactions = 0
        self.writes = 0

    async def write(self, key: str, value: bytes, previous: int) -> int:
        """Put `value` at `key` if its mod revision is still `previous`: the revision of the
        write, or 0 when the key had changed. NotMaster when this nsqlookupd is not (or no
        longer) the master; EtcdError when etcd did not answer."""
        (revision,) = await self.write_many([(key, value, previous)])
        return revision

    async def write_many(self, items: list[tuple[str, bytes, int]]) -> list[int]:
        """`write` for each (key, value, previous), in as few transactions as they fit in;
        each one's revision (0: its key had changed). NotMaster or EtcdError when any of
        them met it (the others may be written)."""
        if not self.fence:
            raise NotMaster("this nsqlookupd is not the master")
        writes = [_Write(key, value, previous) for key, value, previous in items]
        self._pending.extend(writes)
        self._wakeup.set()
        for write in writes:
            await write.done.wait()
        for write in writes:
            if write.error is not None:
                raise write.error
        return [write.revision for write in writes]

    def stop(self) -> None:
        """No longer the master: what waits fails with NotMaster."""
        self.fence = 0
        pending, self._pending = self._pending, []
        for write in pending:
            write.finish(error=NotMaster("this nsqlookupd is no longer the master"))

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._pending:
                batch = self._take_batch()
                try:
                    await self._commit(batch)
                except BaseException:
                    # Cancelled with the master's work (its lease lost): whoever waits for
                    # these hears so; etcd may still apply the transaction, which the fence
                    # makes harmless once another master's key is there.
                    for write in batch:
                        if not write.done.is_set():
                            write.finish(
                                error=NotMaster("this nsqlookupd stopped being the master")
                            )
                    raise

    def _take_batch(self) -> list[_Write]:
        """The first pending writes that fit in one transaction: distinct keys (etcd refuses
        two operations on one key), at most MAX_TXN_OPS - 1 (the fence is a compare too)."""
        batch: list[_Write] = []
        keys: set[str] = set()
        size = 0
        rest = []
        for write in self._pending:
            fits = len(batch) < MAX_TXN_OPS - 1 and size + len(write.value) <= MAX_BATCH_BYTES
            if write.key in keys or not (fits or not batch):
                rest.append(write)
                continue
            batch.append(write)
            keys.add(write.key)
            size += len(write.value)
        self._pending = rest
        return batch

    async def _commit(self, batch: list[_Write]) -> None:
        fence = self.fence
        if not fence:
            for write in batch:
                write.finish(error=NotMaster("this nsqlookupd is no longer the master"))
            return
        compares = [Compare(self.fence_key, "CREATE", fence)]
        compares += [Compare(write.key, "MOD", write.previous) for write in batch]
        try:
            result = await self.client.txn(
                compares,
                [put_op(write.key, write.value) for write in batch],
                [range_op(self.fence_key), *(range_op(write.key) for write in batch)],
                resend=True,
            )
        except (EtcdError, EtcdAuthError) as error:
            for write in batch:
                write.finish(error=error)
            return
        self.transactions += 1
        if result.succeeded:
            self.writes += len(batch)
            for write in batch:
                write.finish(result.revision)
            return
        ranges = result.ranges()
        master = ranges[0] if ranges else []
        if not master or master[0].create_revision != fence:
            self.stop()
            for write in batch:
                write.finish(error=NotMaster("the master key is another nsqlookupd's now"))
            return
        retry = []
        for write, kvs in zip(batch, ranges[1:], strict=True):
            current = kvs[0] if kvs else None
            if current is not None and current.mod_revision == write.previous:
                retry.append(write)  # another write's compare failed
            elif (
                current is not None
                and current.value == write.value
                and current.mod_revision > write.previous
            ):
                self.writes += 1
                write.finish(current.mod_revision)  # an earlier try was applied
            else:
                write.finish(0)
        self._pending[:0] = retry
