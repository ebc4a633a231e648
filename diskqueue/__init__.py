"""A file-segmented FIFO of byte records, byte-compatible with go-diskqueue."""

from diskqueue.errors import MessageSizeError, QueueClosedError
from diskqueue.metadata import Metadata
from diskqueue.queue import DiskQueue
from diskqueue.syncjob import SyncJob

__all__ = ["DiskQueue", "MessageSizeError", "Metadata", "QueueClosedError", "SyncJob"]
