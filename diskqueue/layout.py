"""Where go-diskqueue keeps things on disk, and how a record is framed.

A queue named ``name`` in ``data_path`` is a series of data files
``<name>.diskqueue.%06d.dat``, each a run of records ``[4-byte big-endian int32 size][data]``
with no file header, plus one metadata file ``<name>.diskqueue.meta.dat``
(see ``nsqpy.diskqueue.metadata``). nsqd names a topic's queue after the topic and a channel's
after ``<topic>:<channel>``.
"""

import os
import struct

#: The record length prefix: go-diskqueue writes it with binary.Write(BigEndian, int32).
RECORD_HEADER = struct.Struct(">i")
RECORD_HEADER_SIZE = RECORD_HEADER.size

#: Largest record length the int32 prefix can carry.
MAX_RECORD_SIZE = 2**31 - 1

#: Suffix go-diskqueue's handleReadError gives a data file it could not read.
BAD_FILE_SUFFIX = ".bad"


def data_file_name(data_path: str, name: str, file_num: int) -> str:
    """Path of data file number ``file_num`` (Go: ``"%s.diskqueue.%06d.dat"``)."""
    return os.path.join(data_path, f"{name}.diskqueue.{file_num:06d}.dat")


def metadata_file_name(data_path: str, name: str) -> str:
    """Path of the queue's metadata file (Go: ``"%s.diskqueue.meta.dat"``)."""
    return os.path.join(data_path, f"{name}.diskqueue.meta.dat")
