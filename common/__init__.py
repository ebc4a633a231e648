"""What nsqd, nsqlookupd, nsqadmin, the clients and the tools share, and that does no I/O of
its own: the wire codecs (V2, lookup V1, replication), the cluster metadata's layout, names,
Go-style flags and durations, Go text formatting, errors and the version."""

from nsqpy import refuse_bare_name
from nsqpy.common.version import NSQ_PROTOCOL_VERSION, VERSION

__all__ = ["NSQ_PROTOCOL_VERSION", "VERSION"]

refuse_bare_name(__name__)
