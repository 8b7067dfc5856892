"""``strata up --secure``: what a secured local stack is made of, kept in ``<data-dir>/security``.

- ``ca/ca.crt`` (and its key): a private CA; ``broker.crt`` / ``broker.key`` signed by it
  for 127.0.0.1 and localhost;
- ``secrets.json`` (owner-only): the generated passwords of the users ``admin`` (you),
  ``broker`` (the brokers between themselves), ``gateway`` and ``tier`` (the gateway's
  and the tiering job's own principals), and the brokers' ZooKeeper digest identity;
- ``admin.properties``, ``gateway.properties``, ``tier.properties`` (owner-only): client
  configs for ``--command-config`` / ``$STRATA_COMMAND_CONFIG``.

Brokers then serve one SASL_SSL listener (SCRAM-SHA-256 and -512, PLAIN over TLS) on the
usual client port, talk to each other over it as ``broker``, check every request
against ACLs (``admin``, ``broker``, ``gateway`` and ``tier`` are super users: a local
stack's services need every right; other users get only what ``strata acl add``
grants), and protect their znodes (``zookeeper.set.acl``). The users are written to
ZooKeeper before the first broker starts, as Kafka's bootstrap credentials are.

A data dir set up this way stays secured: ``strata up`` on it secures the stack again
whether or not ``--secure`` is given.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from wire.security import ClientSecurity

__all__ = ["SecureStack"]

USERS = ("admin", "broker", "gateway", "tier")
_DIR = "security"


class SecureStack:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / _DIR

    @property
    def enabled(self) -> bool:
        return (self.dir / "secrets.json").exists()

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca" / "ca.crt"

    def config_file(self, user: str) -> Path:
        return self.dir / f"{user}.properties"

    def secrets(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.dir / "secrets.json").read_text())
        return loaded

    def ensure(self) -> None:
        """Create the CA, certificate, passwords and client configs once."""
        if self.enabled:
            return
        from strata_tools.certs import CertificateAuthority

        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        authority = CertificateAuthority.create(self.dir / "ca", "Strata local stack CA")
        authority.issue(self.dir, "broker")
        values = {"users": {u: secrets.token_urlsafe(18) for u in USERS},
                  "zookeeper": {"username": "strata-brokers",
                                "password": secrets.token_urlsafe(18)}}
        _write_private(self.dir / "secrets.json", json.dumps(values, indent=2) + "\n")
        for user, password in values["users"].items():
            if user != "broker":
                _write_private(self.config_file(user), (
                    "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                    f"sasl.username={user}\nsasl.password={password}\n"
                    f"ssl.ca.location={self.ca_file}\n"))

    def client(self, user: str = "admin") -> ClientSecurity:
        return ClientSecurity("SASL_SSL", "SCRAM-SHA-256", user,
                              self.secrets()["users"][user], ssl_cafile=str(self.ca_file))

    def ensure_users(self, zookeeper: str) -> None:
        """Write the stack's users to ZooKeeper unless they are there (idempotent)."""
        from brokers.coordination import ZooKeeperClient
        from wire.sasl import scram_credential

        values = self.secrets()
        digest = values["zookeeper"]
        coordinator = ZooKeeperClient(zookeeper, digest=(digest["username"], digest["password"]))
        coordinator.start()
        try:
            have = coordinator.scram_credentials()
            for user, password in values["users"].items():
                for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                    if mechanism not in have.get(user, {}):
                        coordinator.put_scram_credential(
                            user, scram_credential(mechanism, password))
        finally:
            coordinator.stop()

    def broker_overrides(self, host: str, port: int) -> list[str]:
        values = self.secrets()
        digest = values["zookeeper"]
        settings = {
            "listeners": f"SASL_SSL://{host}:{port}",
            "ssl.certfile": str(self.dir / "broker.crt"),
            "ssl.keyfile": str(self.dir / "broker.key"),
            "ssl.cafile": str(self.ca_file),
            "inter.broker.sasl.username": "broker",
            "inter.broker.sasl.password": values["users"]["broker"],
            "authorizer.enable": "true",
            "super.users": ";".join(f"User:{u}" for u in USERS),
            "zookeeper.set.acl": "true",
            "zookeeper.digest.username": digest["username"],
            "zookeeper.digest.password": digest["password"],
        }
        return [arg for key, value in settings.items()
                for arg in ("--override", f"{key}={value}")]

    def describe(self) -> dict[str, Any]:
        """What ``strata up --format json`` tells about the secured stack."""
        return {"security_protocol": "SASL_SSL", "ca": str(self.ca_file),
                "admin_user": "admin", "admin_password": self.secrets()["users"]["admin"],
                "client_config": str(self.config_file("admin"))}


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
