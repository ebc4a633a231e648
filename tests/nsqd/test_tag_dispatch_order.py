"""The waiting room of tag dispatch (nsqd/tag_dispatch.py) on its own: what a consumer of one
tag read for others waits there and comes out in the order the channel read it."""

import json

from nsqpy.nsqd.message import Message
from nsqpy.nsqd.tag_dispatch import TagDispatch


def tagged(number: int, tag: str) -> Message:
    message = Message(b"%016d" % number, b"m%d" % number, 0)
    message.ext_header = json.dumps({"##client_dispatch_tag": tag} if tag else {}).encode()
    return message


def reader(messages: list[Message]):
    """A channel queue holding `messages`: `read(n)` returns up to n of them."""

    def read(count: int) -> list[Message]:
        taken = messages[:count]
        del messages[:count]
        return taken

    return read


def test_what_waits_comes_out_in_the_order_it_was_read():
    dispatch = TagDispatch()
    read = [tagged(1, "x"), tagged(2, ""), tagged(3, "y"), tagged(4, ""), tagged(5, "z")]
    present = {"x", "z"}
    # A consumer of "z" reads everything and takes only its own.
    taken, woken = dispatch.take("z", 5, reader(read), present)
    assert [m.body for m in taken] == [b"m5"]
    assert woken == {"x", ""}
    # An untagged consumer takes the untagged ones and those of "y" (no consumer has it),
    # interleaved as they were read.
    taken, _ = dispatch.take("", 10, lambda n: [], present)
    assert [m.body for m in taken] == [b"m2", b"m3", b"m4"]
    assert [m.body for m in dispatch.drain()] == [b"m1"]
    assert dispatch.count == 0


def test_an_untagged_consumer_takes_a_tag_no_consumer_has_as_it_reads_it():
    dispatch = TagDispatch()
    read = [tagged(1, "gone"), tagged(2, ""), tagged(3, "here")]
    taken, woken = dispatch.take("", 3, reader(read), {"here"})
    assert [m.body for m in taken] == [b"m1", b"m2"]
    assert woken == {"here"} and dispatch.count == 1
