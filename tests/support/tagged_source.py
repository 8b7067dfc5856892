"""A deterministic Spark streaming source whose rows name their micro-batch.

``spark.readStream.format("strata-test-tagged")`` (after
``spark.dataSource.register(TaggedSource)``) serves ``ticks`` ticks, one more each time
Spark asks for the latest offset, so each micro-batch usually covers one tick. A
micro-batch covering ticks ``[start, end)`` yields ``rowsPerTick * (end - start)`` rows,
written by two Spark tasks: ``key`` ``"<start>-<j>"`` (so the sink's murmur2 spreads the
batch over every partition) and ``value`` ``"<start>:<count>:<j>"``: the micro-batch's
tag (its first tick), its row count and the row's index. A reader can then tell, from
the rows alone, whether it sees all of a micro-batch or part of it. The rows depend only
on the offsets, so a batch Spark re-runs after a crash is the same batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StringType, StructField, StructType

__all__ = ["TaggedSource", "parse_value"]


def parse_value(value: bytes) -> tuple[int, int, int]:
    """``(tag, count, index)`` of a row this source wrote."""
    tag, count, index = value.decode().split(":")
    return int(tag), int(count), int(index)


class _Slice(InputPartition):
    def __init__(self, start: int, end: int, rows_per_tick: int, part: int) -> None:
        super().__init__((start, end, part))
        self.start, self.end, self.rows_per_tick, self.part = start, end, rows_per_tick, part


class _Reader(DataSourceStreamReader):
    def __init__(self, ticks: int, rows_per_tick: int) -> None:
        self.ticks = ticks
        self.rows_per_tick = rows_per_tick

    def initialOffset(self) -> dict[str, int]:
        return {"tick": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"tick": min(int(start["tick"]) + 1, self.ticks)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Slice]:
        return [_Slice(int(start["tick"]), int(end["tick"]), self.rows_per_tick, part)
                for part in range(2)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
        assert isinstance(partition, _Slice)
        count = (partition.end - partition.start) * partition.rows_per_tick
        for j in range(partition.part, count, 2):
            yield f"{partition.start}-{j}", f"{partition.start}:{count}:{j}"

    def commit(self, end: dict[str, int]) -> None:
        pass


class TaggedSource(DataSource):
    """Options: ``ticks`` (micro-batches with data, default 10), ``rowsPerTick`` (20)."""

    @classmethod
    def name(cls) -> str:
        return "strata-test-tagged"

    def schema(self) -> StructType:
        return StructType([StructField("key", StringType()), StructField("value", StringType())])

    def streamReader(self, schema: StructType) -> _Reader:
        return _Reader(int(self.options.get("ticks", "10")),
                       int(self.options.get("rowsPerTick", "20")))
