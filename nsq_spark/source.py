"""The `nsq` data source: `spark.readStream.format("nsq")` and `df.write.format("nsq")`."""

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

SCHEMA = "id string, body binary, attempts int, timestamp timestamp, topic string, nsqd string"


class NSQDataSource(DataSource):
    """Options are read lazily by the reader and writers: this object is pickled into
    several Spark worker processes and must do no I/O."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: StructType):
        from nsq_spark.reader import NSQStreamReader

        return NSQStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool):
        from nsq_spark.writer import NSQWriter

        return NSQWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from nsq_spark.writer import NSQStreamWriter

        return NSQStreamWriter(self.options, schema)
