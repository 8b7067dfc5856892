"""ZooKeeper for Strata: a launcher for a real server (and, later, the coordination module).

See zookeeper/README.md for the API and the planned znode layout.
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
