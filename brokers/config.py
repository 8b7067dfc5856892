"""Broker configuration: defaults < config file < ``STRATA_*`` environment < flags.

The file is Java-properties style (``key=value`` lines, ``#`` comments), like Kafka's
``server.properties``. An environment variable ``STRATA_<KEY>`` overrides ``<key>``
(upper-cased, dots as underscores: ``STRATA_LOG_SEGMENT_BYTES`` sets
``log.segment.bytes``). Flags (``--override key=value`` and the named shortcuts) win.

Every broker-wide default for a topic config is the topic key prefixed with ``log.``
(``log.retention.ms`` is the default of ``retention.ms``). ``docs/configuration.md``
lists every key with its default; ``BrokerConfig.describe()`` produces that table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from brokers.log.config import TOPIC_CONFIG_KEYS, LogConfig
from brokers.security import Listener, check_mechanisms, parse_listeners, server_ssl_context
from wire.errors import InvalidConfigError
from wire.security import ClientSecurity

__all__ = ["BROKER_KEYS", "BrokerConfig", "load_broker_config"]


@dataclass(frozen=True, slots=True)
class _BrokerKey:
    attribute: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    check: Callable[[Any], bool] = lambda v: True
    accepted: str = ""


def _flag(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise ValueError(text)
    return lowered == "true"


def _port(v: int) -> bool:
    return 0 <= v <= 65535


BROKER_KEYS: Final[dict[str, _BrokerKey]] = {
    "broker.id": _BrokerKey("broker_id", int, 0, "unique id of this broker in the cluster",
                            lambda v: 0 <= v < 2**31, "0 .. 2^31-1"),
    "host": _BrokerKey("host", str, "127.0.0.1", "address the broker listens on"),
    "port": _BrokerKey("port", int, 9092, "TCP port of the Strata protocol", _port, "0..65535"),
    "advertised.host": _BrokerKey("advertised_host", str, "",
                                  "host clients are told to connect to (default: host)"),
    "log.dirs": _BrokerKey("log_dir", str, "./data/broker",
                           "directory holding one sub-directory per partition"),
    "zookeeper.connect": _BrokerKey("zookeeper_connect", str, "127.0.0.1:2181",
                                    "ZooKeeper connection string host:port[,host:port...]"),
    "zookeeper.session.timeout.ms": _BrokerKey(
        "zookeeper_session_timeout_ms", int, 4_000,
        "ZooKeeper session timeout: a crashed broker's registration, and so its "
        "leaderships, vanish after it (failover time); too short and a stalled broker "
        "loses its session",
        lambda v: 2_000 <= v <= 120_000, "2000..120000"),
    "metrics.port": _BrokerKey("metrics_port", int, 9190,
                               "HTTP port serving Prometheus /metrics (0: pick a free port)",
                               _port, "0..65535"),
    "socket.request.max.bytes": _BrokerKey(
        "socket_request_max_bytes", int, 100 * 1024 * 1024,
        "largest request frame accepted; a larger one closes that connection",
        lambda v: 1024 <= v < 2**31, "1024 .. 2^31-1"),
    "num.partitions": _BrokerKey("num_partitions", int, 1,
                                 "partitions of a topic created without a count",
                                 lambda v: v >= 1, ">= 1"),
    "default.replication.factor": _BrokerKey(
        "default_replication_factor", int, 1, "replicas of a topic created without a factor",
        lambda v: v >= 1, ">= 1"),
    "producer.id.block.size": _BrokerKey(
        "producer_id_block_size", int, 1000, "producer ids claimed from ZooKeeper at a time",
        lambda v: v >= 1, ">= 1"),
    "producer.id.expiration.ms": _BrokerKey(
        "producer_id_expiration_ms", int, 86_400_000,
        "forget an idempotent producer's sequence state after this long without a batch",
        lambda v: v >= 1, ">= 1"),
    "sink.staging.retention.ms": _BrokerKey(
        "sink_staging_retention_ms", int, 86_400_000,
        "delete records a sink writer staged but nobody committed or aborted after this long",
        lambda v: v >= 1, ">= 1"),
    "sink.state.expiration.ms": _BrokerKey(
        "sink_state_expiration_ms", int, 604_800_000,
        "forget a sink's last committed batch id after this long without a commit (a "
        "batch re-run after that is appended again)", lambda v: v >= 1, ">= 1"),
    "log.retention.check.interval.ms": _BrokerKey(
        "retention_check_interval_ms", int, 300_000, "how often retention runs",
        lambda v: v >= 1, ">= 1"),
    "log.cleaner.interval.ms": _BrokerKey(
        "cleaner_interval_ms", int, 15_000,
        "how often the log cleaner looks for cleanup.policy=compact partitions to compact "
        "(docs/compaction.md)", lambda v: v >= 1, ">= 1"),
    "log.flush.scheduler.interval.ms": _BrokerKey(
        "flush_scheduler_interval_ms", int, 1000,
        "how often logs with flush.policy=interval are checked", lambda v: v >= 1, ">= 1"),
    "shutdown.timeout.ms": _BrokerKey(
        "shutdown_timeout_ms", int, 10_000,
        "how long a SIGTERM waits for in-flight requests before closing", lambda v: v >= 0,
        ">= 0"),
    "controlled.shutdown.enable": _BrokerKey(
        "controlled_shutdown_enable", _flag, True,
        "on SIGTERM, first ask the controller to move this broker's leaderships to other "
        "in-sync replicas (and take it out of every ISR), so clients see no outage",
        accepted="true or false"),
    "controlled.shutdown.timeout.ms": _BrokerKey(
        "controlled_shutdown_timeout_ms", int, 30_000,
        "how long a controlled shutdown waits for its leaderships to move before the "
        "broker stops anyway (and says so in its log)", lambda v: v >= 0, ">= 0"),
    "fetch.max.wait.ms": _BrokerKey(
        "fetch_max_wait_ms", int, 30_000, "upper bound on a fetch's max_wait_ms",
        lambda v: v >= 0, ">= 0"),
    "replica.lag.time.max.ms": _BrokerKey(
        "replica_lag_time_max_ms", int, 10_000,
        "a follower that has not caught up with the leader's log end for this long leaves "
        "the in-sync replica set", lambda v: v >= 100, ">= 100"),
    "replica.fetch.wait.max.ms": _BrokerKey(
        "replica_fetch_wait_max_ms", int, 500,
        "how long a follower's fetch waits at the leader for new data",
        lambda v: 1 <= v <= 60_000, "1..60000"),
    "replica.fetch.max.bytes": _BrokerKey(
        "replica_fetch_max_bytes", int, 8 << 20,
        "bytes a follower asks for per partition and fetch (at least one batch comes)",
        lambda v: v >= 1024, ">= 1024"),
    "replica.fetch.backoff.ms": _BrokerKey(
        "replica_fetch_backoff_ms", int, 200,
        "pause before a follower retries after a failed fetch", lambda v: v >= 0, ">= 0"),
    "controller.eligible": _BrokerKey(
        "controller_eligible", _flag, True,
        "whether this broker may become the controller (false: it never runs for it)",
        accepted="true, false"),
    "offsets.topic.num.partitions": _BrokerKey(
        "offsets_topic_num_partitions", int, 8,
        "partitions of the internal topic __consumer_offsets (fixed once it exists): the "
        "groups' coordinators are spread over their leaders", lambda v: 1 <= v <= 1000,
        "1..1000"),
    "offsets.topic.replication.factor": _BrokerKey(
        "offsets_topic_replication_factor", int, 3,
        "replicas of __consumer_offsets, created at the first FindCoordinator; until that "
        "many brokers are live, groups get COORDINATOR_NOT_AVAILABLE (set 1 for a "
        "single-broker cluster)", lambda v: v >= 1, ">= 1"),
    "group.session.timeout.ms": _BrokerKey(
        "group_session_timeout_ms", int, 10_000,
        "a group member that sends no heartbeat for this long is removed and its "
        "partitions move (members may ask for another value within the min/max below)",
        lambda v: v >= 1, ">= 1"),
    "group.min.session.timeout.ms": _BrokerKey(
        "group_min_session_timeout_ms", int, 1_000,
        "smallest session timeout a member may ask for", lambda v: v >= 1, ">= 1"),
    "group.max.session.timeout.ms": _BrokerKey(
        "group_max_session_timeout_ms", int, 300_000,
        "largest session timeout a member may ask for", lambda v: v >= 1, ">= 1"),
    "group.heartbeat.interval.ms": _BrokerKey(
        "group_heartbeat_interval_ms", int, 500,
        "how often members heartbeat (sooner while partitions are moving)",
        lambda v: 10 <= v <= 60_000, "10..60000"),
    "group.max.size": _BrokerKey(
        "group_max_size", int, 1000, "most members one group may have", lambda v: v >= 1,
        ">= 1"),
    "offset.metadata.max.bytes": _BrokerKey(
        "offset_metadata_max_bytes", int, 4096,
        "longest metadata string an offset commit may carry", lambda v: v >= 0, ">= 0"),
    "group.lag.interval.ms": _BrokerKey(
        "group_lag_interval_ms", int, 10_000,
        "how often a coordinator refreshes the strata_group_lag_records gauge of its groups",
        lambda v: v >= 100, ">= 100"),
    # ------------------------------------------------------------- transactions
    "transaction.state.log.num.partitions": _BrokerKey(
        "transaction_state_log_num_partitions", int, 8,
        "partitions of the internal topic __transaction_state (fixed once it exists): the "
        "transaction coordinators are spread over their leaders; it has "
        "offsets.topic.replication.factor replicas", lambda v: 1 <= v <= 1000, "1..1000"),
    "transaction.max.timeout.ms": _BrokerKey(
        "transaction_max_timeout_ms", int, 900_000,
        "largest transaction_timeout_ms a producer may ask for (larger: "
        "INVALID_TRANSACTION_TIMEOUT)", lambda v: v >= 1, ">= 1"),
    "transactional.id.expiration.ms": _BrokerKey(
        "transactional_id_expiration_ms", int, 604_800_000,
        "a transactional id with no transaction for this long is forgotten (its next "
        "producer starts afresh)", lambda v: v >= 1, ">= 1"),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": _BrokerKey(
        "transaction_abort_timed_out_transaction_cleanup_interval_ms", int, 10_000,
        "how often a coordinator aborts the transactions open past their timeout",
        lambda v: v >= 1, ">= 1"),
    # ------------------------------------------------------------- security (docs/security.md)
    "listeners": _BrokerKey(
        "listeners", str, "",
        "NAME://host:port,... the broker serves (NAME a security protocol: PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL, or mapped by listener.security.protocol.map); empty: "
        "PLAINTEXT://host:port"),
    "kafka.listeners": _BrokerKey(
        "kafka_listeners", str, "",
        "NAME://host:port,... that speak Kafka's protocol for stock Kafka clients "
        "(docs/kafka-compatibility.md); a NAME the protocol map does not name is read as "
        "KAFKA (PLAINTEXT) or KAFKA_<PROTOCOL>, e.g. KAFKA_SASL_SSL; empty: none"),
    "kafka.fetch.cache.bytes": _BrokerKey(
        "kafka_fetch_cache_bytes", int, 256 << 20,
        "memory for RecordBatch v2 batches a Kafka listener keeps: those its fetches "
        "converted, those it converted ahead of a reader's next fetch and those Kafka "
        "clients produced through it, so that later readers of the same recent data get "
        "them without converting (docs/kafka-compatibility.md); 0: convert every fetch "
        "while the reader waits",
        lambda v: v >= 0, ">= 0"),
    "advertised.listeners": _BrokerKey(
        "advertised_listeners", str, "",
        "NAME://host:port clients are told to use per listener (default: the bound "
        "address, advertised.host if set, and the port actually bound)"),
    "listener.security.protocol.map": _BrokerKey(
        "listener_security_protocol_map", str, "",
        "NAME:PROTOCOL,... for listener names that are not a protocol (default: each "
        "protocol maps to itself)"),
    "inter.broker.listener.name": _BrokerKey(
        "inter_broker_listener_name", str, "",
        "the listener brokers use to reach each other (replication, group coordinator "
        "writes); default: the first listener"),
    "ssl.certfile": _BrokerKey("ssl_certfile", str, "",
                               "the broker's TLS certificate chain (PEM) for SSL/SASL_SSL"),
    "ssl.keyfile": _BrokerKey("ssl_keyfile", str, "", "the certificate's private key (PEM)"),
    "ssl.cafile": _BrokerKey(
        "ssl_cafile", str, "",
        "CA bundle (PEM) that signs client certificates (mutual TLS) and, for the "
        "inter-broker listener, the other brokers' certificates"),
    "ssl.client.auth": _BrokerKey(
        "ssl_client_auth", str, "none",
        "client certificates on SSL/SASL_SSL listeners: none, requested or required (the "
        "certificate's subject becomes the principal on SSL)",
        lambda v: v in ("none", "requested", "required"), "none, requested, required"),
    "sasl.enabled.mechanisms": _BrokerKey(
        "sasl_enabled_mechanisms", str, "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        "SASL mechanisms offered on SASL listeners (PLAIN only over TLS unless "
        "sasl.plain.allow.plaintext)"),
    "sasl.plain.allow.plaintext": _BrokerKey(
        "sasl_plain_allow_plaintext", _flag, False,
        "offer PLAIN on SASL_PLAINTEXT listeners too (it sends the password itself)",
        accepted="true or false"),
    "sasl.mechanism.inter.broker.protocol": _BrokerKey(
        "sasl_mechanism_inter_broker_protocol", str, "SCRAM-SHA-256",
        "mechanism brokers log in to each other with on a SASL inter-broker listener"),
    "inter.broker.sasl.username": _BrokerKey(
        "inter_broker_sasl_username", str, "",
        "the user brokers log in as on a SASL inter-broker listener"),
    "inter.broker.sasl.password": _BrokerKey(
        "inter_broker_sasl_password", str, "", "that user's password"),
    "sasl.authentication.timeout.ms": _BrokerKey(
        "sasl_authentication_timeout_ms", int, 10_000,
        "a connection to a SASL listener that has not logged in within this long is closed",
        lambda v: 100 <= v <= 600_000, "100..600000"),
    "zookeeper.set.acl": _BrokerKey(
        "zookeeper_set_acl", _flag, False,
        "log in to ZooKeeper with zookeeper.digest.username/password and create every "
        "znode writable by that identity only (SCRAM credentials readable by it only)",
        accepted="true or false"),
    "zookeeper.digest.username": _BrokerKey(
        "zookeeper_digest_username", str, "", "the brokers' ZooKeeper digest identity"),
    "zookeeper.digest.password": _BrokerKey(
        "zookeeper_digest_password", str, "", "its password"),
    "authorizer.enable": _BrokerKey(
        "authorizer_enable", _flag, False,
        "check every request against the ACLs (strata acl); off: any client that reaches "
        "a listener may do everything", accepted="true or false"),
    "super.users": _BrokerKey(
        "super_users", str, "",
        "principals allowed everything, separated by ';' (e.g. User:admin;User:broker); "
        "the brokers' own user belongs here"),
    "allow.everyone.if.no.acl.found": _BrokerKey(
        "allow_everyone_if_no_acl_found", _flag, False,
        "with the authorizer on, allow a request on a resource no ACL names at all",
        accepted="true or false"),
    "connections.max.reauth.ms": _BrokerKey(
        "connections_max_reauth_ms", int, 0,
        "a SASL connection is closed this long after it logged in (0: no limit); the "
        "client reconnects and logs in again. Sessions of a deleted or changed credential "
        "are closed as soon as brokers see the change", lambda v: v >= 0, ">= 0"),
}

_LOG_DEFAULT_PREFIX: Final = "log."


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    broker_id: int = 0
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str = ""
    log_dir: str = "./data/broker"
    zookeeper_connect: str = "127.0.0.1:2181"
    zookeeper_session_timeout_ms: int = 4_000
    metrics_port: int = 9190
    socket_request_max_bytes: int = 100 * 1024 * 1024
    num_partitions: int = 1
    default_replication_factor: int = 1
    producer_id_block_size: int = 1000
    producer_id_expiration_ms: int = 86_400_000
    sink_staging_retention_ms: int = 86_400_000
    sink_state_expiration_ms: int = 604_800_000
    retention_check_interval_ms: int = 300_000
    cleaner_interval_ms: int = 15_000
    flush_scheduler_interval_ms: int = 1000
    shutdown_timeout_ms: int = 10_000
    controlled_shutdown_enable: bool = True
    controlled_shutdown_timeout_ms: int = 30_000
    fetch_max_wait_ms: int = 30_000
    replica_lag_time_max_ms: int = 10_000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 8 << 20
    replica_fetch_backoff_ms: int = 200
    controller_eligible: bool = True
    offsets_topic_num_partitions: int = 8
    offsets_topic_replication_factor: int = 3
    group_session_timeout_ms: int = 10_000
    group_min_session_timeout_ms: int = 1_000
    group_max_session_timeout_ms: int = 300_000
    group_heartbeat_interval_ms: int = 500
    group_max_size: int = 1000
    offset_metadata_max_bytes: int = 4096
    group_lag_interval_ms: int = 10_000
    transaction_state_log_num_partitions: int = 8
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    listeners: str = ""
    kafka_listeners: str = ""
    kafka_fetch_cache_bytes: int = 256 << 20
    advertised_listeners: str = ""
    listener_security_protocol_map: str = ""
    inter_broker_listener_name: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_cafile: str = ""
    ssl_client_auth: str = "none"
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"
    sasl_plain_allow_plaintext: bool = False
    sasl_mechanism_inter_broker_protocol: str = "SCRAM-SHA-256"
    inter_broker_sasl_username: str = ""
    inter_broker_sasl_password: str = field(default="", repr=False)
    sasl_authentication_timeout_ms: int = 10_000
    connections_max_reauth_ms: int = 0
    zookeeper_set_acl: bool = False
    zookeeper_digest_username: str = ""
    zookeeper_digest_password: str = field(default="", repr=False)
    authorizer_enable: bool = False
    super_users: str = ""
    allow_everyone_if_no_acl_found: bool = False
    log_defaults: LogConfig = field(default_factory=LogConfig)

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    @property
    def data_dir(self) -> Path:
        return Path(self.log_dir)

    def parsed_listeners(self) -> list[Listener]:
        return parse_listeners(self.listeners, self.advertised_listeners,
                               self.listener_security_protocol_map, self.host, self.port,
                               self.advertised_host, self.kafka_listeners)

    def inter_broker_listener(self) -> Listener:
        listeners = self.parsed_listeners()
        if not self.inter_broker_listener_name:
            return listeners[0]
        for listener in listeners:
            if listener.name == self.inter_broker_listener_name.upper():
                if listener.kafka:
                    raise InvalidConfigError(
                        f"inter.broker.listener.name={self.inter_broker_listener_name} is a "
                        "Kafka listener; brokers speak Strata's protocol to each other: name "
                        "one of listeners")
                return listener
        raise InvalidConfigError(
            f"inter.broker.listener.name={self.inter_broker_listener_name} is not among "
            f"the listeners ({', '.join(x.name for x in listeners)})")

    def zookeeper_digest(self) -> tuple[str, str] | None:
        if not self.zookeeper_set_acl:
            return None
        return self.zookeeper_digest_username, self.zookeeper_digest_password

    def inter_broker_security(self) -> ClientSecurity:
        """How this broker connects to the others (their inter-broker listener)."""
        listener = self.inter_broker_listener()
        return ClientSecurity(
            listener.protocol, self.sasl_mechanism_inter_broker_protocol,
            self.inter_broker_sasl_username, self.inter_broker_sasl_password,
            ssl_cafile=self.ssl_cafile or None,
            ssl_certfile=(self.ssl_certfile or None) if self.ssl_client_auth != "none"
            else None,
            ssl_keyfile=(self.ssl_keyfile or None) if self.ssl_client_auth != "none"
            else None)

    def check_security(self) -> None:
        """Refuse, before anything starts, settings that cannot serve a listener."""
        listeners = self.parsed_listeners()
        check_mechanisms(self.sasl_enabled_mechanisms)
        if any(x.uses_tls for x in listeners):
            server_ssl_context(self.ssl_certfile, self.ssl_keyfile, self.ssl_cafile,
                               self.ssl_client_auth)
        if self.zookeeper_set_acl and not (self.zookeeper_digest_username
                                           and self.zookeeper_digest_password):
            raise InvalidConfigError(
                "zookeeper.set.acl=true needs zookeeper.digest.username and "
                "zookeeper.digest.password (the identity every broker logs in to ZooKeeper "
                "as)")
        inter = self.inter_broker_listener()
        if inter.uses_sasl:
            if not self.inter_broker_sasl_username or not self.inter_broker_sasl_password:
                raise InvalidConfigError(
                    f"the inter-broker listener {inter.name} is {inter.protocol}: set "
                    "inter.broker.sasl.username and inter.broker.sasl.password (a user "
                    "created with `strata user create`)")
            if self.sasl_mechanism_inter_broker_protocol not in \
                    check_mechanisms(self.sasl_enabled_mechanisms):
                raise InvalidConfigError(
                    f"sasl.mechanism.inter.broker.protocol="
                    f"{self.sasl_mechanism_inter_broker_protocol} is not among "
                    f"sasl.enabled.mechanisms={self.sasl_enabled_mechanisms}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, str]) -> BrokerConfig:
        """Parse ``key -> value`` strings; unknown keys and bad values are errors."""
        broker: dict[str, Any] = {}
        log_values: dict[str, str] = {}
        for key, raw in values.items():
            if key.startswith(_LOG_DEFAULT_PREFIX) and key[len(_LOG_DEFAULT_PREFIX):] \
                    in TOPIC_CONFIG_KEYS:
                log_values[key[len(_LOG_DEFAULT_PREFIX):]] = raw
                continue
            spec = BROKER_KEYS.get(key)
            if spec is None:
                raise InvalidConfigError(
                    f"unknown broker config {key!r}; see docs/configuration.md for the keys")
            try:
                value = spec.parse(raw.strip())
            except ValueError:
                raise InvalidConfigError(f"broker config {key}={raw!r} is not a valid value") \
                    from None
            if not spec.check(value):
                raise InvalidConfigError(
                    f"broker config {key}={raw!r} is out of range; accepted: {spec.accepted}")
            broker[spec.attribute] = value
        try:
            log_defaults = LogConfig.from_mapping(log_values)
        except InvalidConfigError as err:
            raise InvalidConfigError(f"broker default (log.*): {err.message}") from None
        if "listeners" in values and ("port" in values or "host" in values):
            raise InvalidConfigError(
                "give either listeners (NAME://host:port,...) or host and port, not both")
        config = cls(**broker, log_defaults=log_defaults)
        config.check_security()
        if not config.group_min_session_timeout_ms <= config.group_session_timeout_ms \
                <= config.group_max_session_timeout_ms:
            raise InvalidConfigError(
                f"group.session.timeout.ms={config.group_session_timeout_ms} must lie within "
                f"group.min.session.timeout.ms={config.group_min_session_timeout_ms} and "
                f"group.max.session.timeout.ms={config.group_max_session_timeout_ms}; "
                "change one of the three")
        return config

    @staticmethod
    def describe() -> list[tuple[str, str, str]]:
        """(key, default, meaning) for every key, topic defaults included."""
        rows = [(k, str(s.default), s.doc) for k, s in BROKER_KEYS.items()]
        defaults = LogConfig()
        for key, spec in TOPIC_CONFIG_KEYS.items():
            rows.append((_LOG_DEFAULT_PREFIX + key, str(getattr(defaults, spec.attribute)),
                         f"default of topic config {key}: {spec.doc}"))
        return rows


def parse_properties(text: str, source: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        if "=" not in stripped:
            raise InvalidConfigError(f"{source}:{number}: expected key=value, got {line!r}")
        key, value = stripped.split("=", 1)
        values[key.strip()] = value.strip()
    return values


def _env_key(key: str) -> str:
    return "STRATA_" + key.upper().replace(".", "_")


def load_broker_config(path: Path | None = None, overrides: Mapping[str, str] | None = None,
                       environ: Mapping[str, str] | None = None) -> BrokerConfig:
    """Defaults, then the file, then ``STRATA_*`` variables, then ``overrides``."""
    values: dict[str, str] = {}
    if path is not None:
        try:
            values.update(parse_properties(path.read_text(), str(path)))
        except OSError as err:
            raise InvalidConfigError(f"cannot read config file {path}: {err.strerror}") from None
    env = os.environ if environ is None else environ
    known = list(BROKER_KEYS) + [_LOG_DEFAULT_PREFIX + k for k in TOPIC_CONFIG_KEYS]
    for key in known:
        if _env_key(key) in env:
            values[key] = env[_env_key(key)]
    values.update(overrides or {})
    return BrokerConfig.from_mapping(values)
