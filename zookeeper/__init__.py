"""ZooKeeper for Strata: a launcher for a real server or a 3-node ensemble.

The client side (every znode Strata reads or writes) is ``brokers/coordination.py``;
zookeeper/README.md gives the launcher API and the znode layout.
"""

from zookeeper.launcher import (
    EnsembleHealth,
    EnsembleMember,
    ZooKeeperEnsemble,
    ZooKeeperError,
    ZooKeeperServer,
    ZooKeeperStartError,
    ensemble_health,
    four_letter_word,
    is_serving,
    server_mode,
)

__all__ = [
    "EnsembleHealth",
    "EnsembleMember",
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "ZooKeeperServer",
    "ZooKeeperStartError",
    "ensemble_health",
    "four_letter_word",
    "is_serving",
    "server_mode",
]
