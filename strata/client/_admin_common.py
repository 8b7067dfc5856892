"""What the admin client's API families share.

``strata.client.admin`` holds the faces (``AsyncAdmin``, ``Admin``); each family of admin
APIs is one private module under it: ``_admin_topics`` (topics, configs, offsets),
``_admin_cluster`` (brokers, preferred-leader elections, reassignments),
``_admin_groups`` (consumer groups), ``_admin_security`` (ACLs, SCRAM users, quotas),
``_admin_tier`` (the Delta tiering job's APIs), ``_admin_schemas`` (the schema
registry) and ``_admin_transactions`` (transactional ids, open transactions). Every
family reads the one ``AdminContext`` of its admin client: the connection to the
cluster and the timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.client._cluster import Cluster
from strata.client._common import error_from_code
from wire.protocol import MetadataResponse

__all__ = ["AdminContext"]


@dataclass(slots=True)
class AdminContext:
    """One admin client's cluster connection and timeouts, shared by its API families
    (the face's ``request_timeout_ms`` / ``retry_backoff_ms`` read and write these)."""

    cluster: Cluster
    request_timeout_ms: int
    retry_backoff_ms: int

    @property
    def request_timeout_s(self) -> float:
        return self.request_timeout_ms / 1000

    @property
    def operation_timeout_ms(self) -> int:
        # The broker must give up before the client stops waiting, or a slow but
        # successful operation would look like a lost connection.
        return self.request_timeout_ms * 3 // 4

    async def existing_topics(self, wanted: list[str] | None) -> MetadataResponse:
        """Fresh metadata of ``wanted`` (None: every topic); a missing topic raises
        ``UnknownTopicOrPartitionError``."""
        response = await self.cluster.refresh(wanted)
        for topic in response.topics:
            if topic.error_code:
                raise error_from_code(topic.error_code, f"topic {topic.name!r} does not exist; "
                                      "check the name (strata topic list)")
        return response
