"""The `kafka-cdc` Data Source itself (`spark.read.format("kafka-cdc")`, also `readStream`) and
its registration in a session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

from changelake.spark.kafka_source.options import NAME, RECORDS_SCHEMA, KafkaOptions
from changelake.spark.kafka_source.read import KafkaCdcReader
from changelake.spark.kafka_source.stream import KafkaCdcStreamReader


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("kafka-cdc")` (and `readStream`) available in this session."""
    spark.dataSource.register(KafkaCdcDataSource)




class KafkaCdcDataSource(DataSource):
    """`spark.read.format("kafka-cdc")`, also `readStream`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _resolved(self) -> KafkaOptions:
        return KafkaOptions.parse(self.options).resolved()

    def schema(self) -> StructType | str:
        from changelake.spark.source import data_type_of, message_type

        options = self._resolved()
        if options.records:
            return RECORDS_SCHEMA  # DDL: no session in the worker that asks
        data_type, _ = data_type_of(options.rows())
        return message_type(data_type)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaCdcReader(self._resolved())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaCdcStreamReader(self._resolved())
