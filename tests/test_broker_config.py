"""Broker configuration: defaults < file < STRATA_* environment < flags, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokers.config import BrokerConfig, load_broker_config
from brokers.log import FlushPolicy
from wire.errors import InvalidConfigError

pytestmark = pytest.mark.unit


def test_precedence_file_then_environment_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("# a comment\nbroker.id=3\nport = 9999\nlog.segment.bytes=4096\n"
                    "log.flush.policy=interval\n")
    environ = {"STRATA_PORT": "9100", "STRATA_LOG_FLUSH_POLICY": "always",
               "UNRELATED": "x"}
    config = load_broker_config(path, {"log.segment.bytes": "8192"}, environ)
    assert config.broker_id == 3  # file
    assert config.port == 9100  # environment beats the file
    assert config.log_defaults.flush_policy is FlushPolicy.ALWAYS
    assert config.log_defaults.segment_bytes == 8192  # overrides beat everything
    assert load_broker_config(None, {}, {}) == BrokerConfig()


@pytest.mark.parametrize(("values", "words"), [
    ({"brokr.id": "1"}, "unknown broker config 'brokr.id'"),
    ({"port": "70000"}, "out of range"),
    ({"port": "ninety"}, "not a valid value"),
    ({"log.segment.bytes": "1"}, "log.*"),
    ({"zookeeper.session.timeout.ms": "10"}, "2000..120000"),
    ({"group.min.session.timeout.ms": "20000"}, "must lie within group.min.session"),
    ({"group.session.timeout.ms": "400000"}, "must lie within group.min.session"),
])
def test_bad_values_name_the_key(values: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidConfigError, match=words.replace("*", r"\*")):
        BrokerConfig.from_mapping(values)


def test_bad_file_lines_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("broker.id=1\njust words\n")
    with pytest.raises(InvalidConfigError, match=r"bad\.properties:2: expected key=value"):
        load_broker_config(path, {}, {})
    with pytest.raises(InvalidConfigError, match="cannot read config file"):
        load_broker_config(tmp_path / "missing.properties", {}, {})


def test_every_key_is_documented() -> None:
    documented = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    for key, _, _ in BrokerConfig.describe():
        assert f"`{key}`" in documented
