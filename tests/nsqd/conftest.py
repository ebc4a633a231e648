import pytest

from nsqpy.nsqd.server import NSQD


@pytest.fixture
def standalone(nsqd_options):
    """An nsqd that is never served: topics, channels, the queue scan and the V2 interpreter
    driven directly, with no socket."""
    server = NSQD(nsqd_options)
    yield server
    for topic in server.topics.values():
        topic.close()
