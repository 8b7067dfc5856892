"""The Strata Python client (depends only on ``brokers.record_batch``, ``brokers.protocol``
and ``brokers.errors``, never on the broker's server or log)."""
