"""The protocol's message classes, one module per API family.

Import them from ``wire.protocol`` (or ``wire.protocol.messages``, which keeps the API
keys, the request/response registry and the versions, and re-exports every class).
"""
