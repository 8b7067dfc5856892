"""Kafka's protocol on the brokers' ``kafka.listeners`` (docs/kafka-compatibility.md).

``codec``: request headers, the API versions served, framed answers (bodies by
kafka-python's generated ``kafka.protocol``). ``apis``: each Kafka request translated into
Strata's and answered by Strata's own handler. ``records``: Kafka's RecordBatch v2 to
Strata's Arrow batch and back. ``groups``: the classic group protocol on Strata's group
coordinator. ``listener``: the connection codec the broker plugs into its connections.
"""
