"""ZooKeeper for Strata: a launcher for a real server.

The client side (every znode Strata reads or writes) is ``brokers/coordination.py``;
zookeeper/README.md gives the launcher API and the znode layout.
"""

from zookeeper.launcher import (
    EnsembleMember,
    ZooKeeperError,
    ZooKeeperServer,
    ZooKeeperStartError,
    four_letter_word,
    is_serving,
)

__all__ = [
    "EnsembleMember",
    "ZooKeeperError",
    "ZooKeeperServer",
    "ZooKeeperStartError",
    "four_letter_word",
    "is_serving",
]
