"""What nsqd, nsqlookupd, nsqadmin and the tools share: sans-IO codecs, names, options, version."""

from nsqpy.common.version import NSQ_PROTOCOL_VERSION, VERSION

__all__ = ["NSQ_PROTOCOL_VERSION", "VERSION"]
