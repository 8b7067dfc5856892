"""The partition log storage engine: segments, sparse indexes, checkpoints, recovery.

Public API: ``PartitionLog`` (one partition's log), ``LogConfig`` (its settings),
``AppendInfo`` and ``FileSlice`` (what append and read return), ``LeaderEpochCache``
(the per-partition epoch -> start offset checkpoint). The log knows
nothing of sockets or ZooKeeper; see ``brokers/README.md``.
"""

from brokers.log.config import CleanupPolicy, FlushPolicy, LogConfig, TimestampTypeConfig
from brokers.log.leader_epoch import EpochEntry, LeaderEpochCache
from brokers.log.partition_log import AppendInfo, PartitionLog, SegmentSummary
from brokers.log.segment import FileSlice, LogSegment

__all__ = [
    "AppendInfo",
    "CleanupPolicy",
    "EpochEntry",
    "FileSlice",
    "FlushPolicy",
    "LeaderEpochCache",
    "LogConfig",
    "LogSegment",
    "PartitionLog",
    "SegmentSummary",
    "TimestampTypeConfig",
]
