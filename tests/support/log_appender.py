"""Child process for the crash tests: appends forever with flush.policy=always.

Usage: python log_appender.py DIR SEGMENT_BYTES [SEED]

Each record's value is ``seq:<n>``, where n continues from the log end offset it finds
on open. After every append returns (so the batch is fsynced), it prints
``<first_offset> <last_offset>`` on stdout and flushes: the parent treats that line as
the acknowledgement.
"""

from __future__ import annotations

import random
import sys

from brokers.log import FlushPolicy, LogConfig, PartitionLog
from wire.record_batch import build_batch


def main() -> None:
    directory, segment_bytes = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # record sizes: the parent's seed
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=1024,
                       flush_policy=FlushPolicy.ALWAYS)
    log = PartitionLog(directory, config)
    rng = random.Random(seed)
    next_seq = log.log_end_offset
    while True:
        count = rng.randint(1, 40)
        values = [f"seq:{next_seq + i}".encode() + b"." * rng.randint(0, 200) for i in range(count)]
        info = log.append(build_batch(values, keys=[b"k"] * count))
        next_seq += count
        sys.stdout.write(f"{info.first_offset} {info.last_offset}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
