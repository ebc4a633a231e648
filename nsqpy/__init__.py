"""nsqpy: NSQ, the realtime distributed message queue, in pure Python.

Every import package of the distribution lives under this one name:

* `nsqpy.nsqd`, `nsqpy.nsqlookupd`, `nsqpy.nsqadmin`: the three daemons (`python -m
  nsqpy.nsqd`, or the `nsqd` console script);
* `nsqpy.common`: the wire codecs and pure helpers they share;
* `nsqpy.diskqueue`: Go nsqd's on-disk queue;
* `nsqpy.tools`: the NSQ utilities (`nsq_tail`, `to_nsq`, ...);
* `nsqpy.spark`: the PySpark data source `nsq`;
* `nsqpy.testing`: the pytest plugin whose fixtures run a real nsqd and nsqlookupd.

In the source tree the daemons, `common`, `diskqueue` and `tools` keep their top-level
folders; this folder links to each (`nsqpy/nsqd -> ../nsqd`).
"""

__version__ = "0.1.0"
