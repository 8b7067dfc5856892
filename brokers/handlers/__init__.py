"""What each API does: decode the body, check it, act through the broker's services,
build the answer.

One module per API family, each thin over the services it uses:

* ``admin.py``: ApiVersions, Metadata, topics and their configs, leader elections,
  partition reassignments (the metadata cache, ZooKeeper, the controller);
* ``produce.py``: Produce, InitProducerId and the Spark sink's staged commits (the
  replica manager's ``append_records`` and ``commit_staged``);
* ``fetch.py``: Fetch, ListOffsets, OffsetForLeaderEpoch (the replica manager's
  ``fetch_records``);
* ``groups.py``: the consumer-group APIs (the group coordinator);
* ``security.py``: SASL, SCRAM credentials, ACLs and client quotas;
* ``tier.py``: what the tiering job asks (DescribeTier, TierLease, UpdateTier);
* ``schemas.py``: the schema registry API.

They share ``context.py`` (the services, the one ACL check, the one quota path, the
request's session) and ``brokers/answers.py`` (each partition answered on its own);
``dispatch.py`` decodes a request and hands it to its family. A new family (a
``transactions.py`` for Kafka's transaction APIs) is a module with an ``ApiFamily``
subclass whose ``apis`` names what it answers, added to the dispatcher's list. A
listener for Kafka's own wire protocol would have a dispatcher and families of its own
built over the same ``ApiContext``, so both protocols write one log, through one group
coordinator, one ACL check and one quota path.

Per-partition failures are reported in the partition's ``error_code`` and
``error_message`` (the rest of the request still succeeds), as in Kafka. Request-level
failures (unsupported version, malformed body) raise, and the network layer answers
with the error in the response header.
"""

from brokers.handlers.context import ApiContext, ApiFamily, current_session
from brokers.handlers.dispatch import RequestHandlers

__all__ = ["ApiContext", "ApiFamily", "RequestHandlers", "current_session"]
