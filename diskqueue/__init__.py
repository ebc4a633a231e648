"""A file-segmented FIFO of byte records, byte-compatible with go-diskqueue."""

from nsqpy import refuse_bare_name
from nsqpy.diskqueue.errors import MessageSizeError, QueueClosedError
from nsqpy.diskqueue.metadata import Metadata
from nsqpy.diskqueue.queue import DiskQueue
from nsqpy.diskqueue.syncjob import SyncJob

__all__ = ["DiskQueue", "MessageSizeError", "Metadata", "QueueClosedError", "SyncJob"]

refuse_bare_name(__name__)
