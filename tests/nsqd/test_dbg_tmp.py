import pytest, trio
from common.command import encode_fin, encode_rdy
from tests.nsqd.wire import consumer, UNKNOWN_ID

async def test_nonfatal_as_fatal_fails(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_fin(UNKNOWN_ID))
    with pytest.raises(trio.TooSlowError):
        await wire.expect_error(b"E_FIN_FAILED FIN " + UNKNOWN_ID + b" failed ID not in flight", fatal=True)

async def test_fatal_as_nonfatal_fails(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_rdy(5000))
    with pytest.raises(AssertionError, match="closed"):
        await wire.expect_error("E_INVALID RDY count 5000 out of range 0-2500", fatal=False)
