"""Each partition of a partitioned topic is a log of its own, in Youzan's layout under
`<data-path>/<topic>/`: `<topic>-<p>.diskqueue.NNNNNN.dat` segments and a
`<topic>_<p>.commit.log` index; its channels are cursors with a reader file each, never copies."""

import os

from nsqpy.common.command import encode_pub, encode_rdy
from tests.nsqd.wire import with_options
from tests.youzan.support import connect, create_partitions, sub


@with_options(mem_queue_size=0)
async def test_two_partitions_of_one_topic_never_share_files(nsqd):
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
    names = set(os.listdir(os.path.join(nsqd.data_path, "pt")))
    for partition in (0, 1):
        assert f"pt-{partition}.diskqueue.000000.dat" in names
        assert f"pt_{partition}.commit.log" in names
        assert f"pt-{partition}:c.diskqueue.meta.v2.reader.dat" in names
    # No per-channel copies: no classic diskqueue for the topic or its channels.
    assert not any(name.startswith("pt") for name in os.listdir(nsqd.data_path) if name != "pt")
    for partition, reader in readers.items():
        await reader.send(encode_rdy(10))
        bodies = sorted(m.body for m in await reader.read_youzans(3))
        assert bodies == [b"p%d-%d" % (partition, n) for n in range(3)]
