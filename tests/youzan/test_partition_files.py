"""Each partition's channels have diskqueue files of their own: partition 0 keeps Go's
`<topic>:<channel>` names, partition p > 0 uses `<topic>#<p>:<channel>`."""

import os

from common.command import encode_pub, encode_rdy
from tests.nsqd.wire import with_options
from tests.youzan.support import connect, create_partitions, sub


@with_options(mem_queue_size=0)
async def test_two_partitions_of_one_topic_never_share_channel_files(nsqd):
    await create_partitions(nsqd, "pt", 0, 1)
    readers = {}
    for partition in (0, 1):
        reader = await connect(nsqd)
        await reader.command_ok(sub("SUB", "pt", "c", partition))
        readers[partition] = reader
    writer = await connect(nsqd)
    for partition in (0, 1):
        for n in range(3):
            await writer.command_ok(encode_pub("pt", b"p%d-%d" % (partition, n), partition))
    names = set(os.listdir(nsqd.data_path))
    assert "pt:c.diskqueue.000000.dat" in names
    assert "pt#1:c.diskqueue.000000.dat" in names
    for partition, reader in readers.items():
        await reader.send(encode_rdy(10))
        bodies = sorted(m.body for m in await reader.read_youzans(3))
        assert bodies == [b"p%d-%d" % (partition, n) for n in range(3)]
