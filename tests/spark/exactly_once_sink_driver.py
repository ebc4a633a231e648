"""A streaming query for the exactly-once sink tests: log topic "in" into log topic "out"
through the nsq sink.

`python exactly_once_sink_driver.py LOOKUPD_HTTP CHECKPOINT MARKER [MASTER [MODE [FORM]]]`. MASTER
is `local[2,3]` by default (a failed task is run again), a standalone cluster's (which runs a
failed task again by itself, up to `spark.task.maxFailures`) or a Spark Connect server's
`sc://host:port`. MODE:

* "fail-once" (the default): one task fails once after part of its rows were published. The
  failure comes from the task's input, as an upstream error would: the first attempt of Spark
  partition 0 of the first micro-batch reads two Arrow batches (100 rows each), which the real
  sink publishes, and then its input raises. MARKER records how many rows went through before
  that, and MARKER.executors the executor process (its JVM's PID) of every task.
* "continuous": micro-batches of at most 150 rows until the driver is killed;
  "available-now": what is there, then the query ends. Both with the plain sink, unless
  MARKER is given (not "-") in continuous mode: then the first attempt of Spark partition
  0's task that starts while the file MARKER.request exists publishes its first Arrow batch,
  writes MARKER.held (the rows it published, its executor's PID) and waits for ever, so that
  the test can kill the driver or that executor while a batch is partly published. Only one
  task holds.

FORM is what each output message holds: "body" (the default), the input message's body, or
"id-body", the input message's ID (hex) and body with a space between.
"""

import os
import sys
import threading

from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.functions import col, concat, lit

from nsqpy.spark import register
from nsqpy.spark.source import NSQDataSource
from nsqpy.spark.writer import NSQStreamWriter


class InjectingWriter(NSQStreamWriter):
    """The nsq sink with a fault injected into one task: option "inject" is "fail-once" or
    "hold" (see the module's text), "marker" the MARKER path."""

    def __init__(self, options, schema) -> None:
        super().__init__(options, schema)
        self.marker = options["marker"]
        self.inject = options["inject"]

    def write(self, iterator):
        context = TaskContext.get()
        first_attempt = context.attemptNumber() == 0 and context.partitionId() == 0
        if self.inject == "fail-once":
            with open(self.marker + ".executors", "a") as executors:
                executors.write(f"{context.partitionId()} {executor_process()}\n")
            if first_attempt and not os.path.exists(self.marker):
                iterator = self._failing(iterator)
        elif first_attempt and os.path.exists(self.marker + ".request"):
            try:
                # Only one task holds: the first to create the file.
                held = os.open(self.marker + ".held", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                pass
            else:
                iterator = self._holding(iterator, held)
        return super().write(iterator)

    def _failing(self, iterator):
        rows = 0
        for number, batch in enumerate(iterator):
            if number == 2:
                with open(self.marker, "w") as marker:
                    marker.write(str(rows))
                raise RuntimeError("injected: the task's input failed")
            rows += batch.num_rows
            yield batch

    def _holding(self, iterator, held: int):
        rows = 0
        for batch in iterator:
            yield batch
            # The sink asks for the next batch once it published this one.
            rows = batch.num_rows
            break
        os.write(held, f"{rows} {executor_process()}\n".encode())
        os.close(held)
        threading.Event().wait()


def executor_process() -> int:
    """The PID of the executor JVM this Python worker runs under (the driver's, locally)."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"CoarseGrainedExecutorBackend" in cmdline.read():
                return pid
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    return 0


class Injecting(NSQDataSource):
    @classmethod
    def name(cls) -> str:
        return "nsq_injecting"

    def streamWriter(self, schema, overwrite):  # noqa: N802 (Spark's name)
        return InjectingWriter(self.options, schema)


def main() -> None:
    lookupd_http, checkpoint, marker = sys.argv[1:4]
    master = sys.argv[4] if len(sys.argv) > 4 else "local[2,3]"
    mode = sys.argv[5] if len(sys.argv) > 5 else "fail-once"
    form = sys.argv[6] if len(sys.argv) > 6 else "body"
    if master.startswith("sc://"):
        # Spark Connect: the server has its master and settings; the session sets its own.
        spark = SparkSession.builder.remote(master).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    else:
        spark = (
            SparkSession.builder.master(master)
            .appName("nsqpy-exactly-once-sink")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    query = start_query(spark, lookupd_http, checkpoint, marker, mode, form)
    print("query started", flush=True)
    query.awaitTermination()
    print("query ended", flush=True)
    spark.stop()


def start_query(spark, lookupd_http: str, checkpoint: str, marker: str, mode: str, form: str):
    """The query, started (a test runs it again from its checkpoint in its own session)."""
    register(spark)
    spark.dataSource.register(Injecting)
    rows = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "150" if mode != "fail-once" else "100000")
        .load()
    )
    if form == "id-body":
        rows = rows.select(concat(col("id").cast("binary"), lit(b" "), col("body")).alias("body"))
    else:
        rows = rows.select("body")
    inject = None
    if mode == "fail-once":
        inject = "fail-once"
    elif mode == "continuous" and marker != "-":
        inject = "hold"
    writer = (
        rows.writeStream.format("nsq" if inject is None else "nsq_injecting")
        .option("lookupd", lookupd_http)
        .option("topic", "out")
        .option("publishChunk", "50")
        .option("marker", marker)
        .option("inject", inject or "")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "continuous":
        writer = writer.trigger(processingTime="0 seconds")
    else:
        writer = writer.trigger(availableNow=True)
    return writer.start()


if __name__ == "__main__":
    main()
