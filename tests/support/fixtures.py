"""The client fixtures most modules that talk to a broker share.

``tests/conftest.py`` imports them, so every test module can ask for them. ``bootstrap``
is the module's ``broker``; a module whose tests run against another broker or cluster
overrides ``bootstrap`` alone (``admin`` then follows it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata.client import Admin
from tests.support.broker_process import BrokerProcess
from tests.support.pipeline_process import PipelineProcess


@pytest.fixture(scope="module")
def bootstrap(broker: BrokerProcess) -> str:
    """The bootstrap address of the module's broker."""
    return broker.bootstrap


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[Admin]:
    """One ``Admin`` on ``bootstrap``, shared by a module's tests."""
    with Admin(bootstrap) as client:
        yield client


@pytest.fixture
def pipelines() -> Iterator[list[PipelineProcess]]:
    """The pipelines a test starts (it appends them); each is killed at teardown."""
    started: list[PipelineProcess] = []
    try:
        yield started
    finally:
        for pipeline in started:
            pipeline.kill()
