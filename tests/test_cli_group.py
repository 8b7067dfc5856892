"""``strata group ...`` and ``strata consume --group``: argument checks in process (no
broker), then the real commands as subprocesses against a real broker."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import strata_tools.commands.consume as consume
from strata.client import (
    Admin,
    ConsumerRecord,
    NewTopic,
    TimestampType,
    TopicPartition,
)
from strata_tools.cli import main
from tests.conftest import ProcessReaper
from tests.support.broker_process import BrokerProcess
from tests.support.helpers import produce

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- no broker


@pytest.mark.parametrize(("argv", "words"), [
    (["group", "reset-offsets", "g", "--topic", "t", "--to-offset", "-3"], "offset >= 0"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-offset", "x"], "offset >= 0"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-datetime", "yesterday"],
     "ISO 8601"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-datetime", "1969-12-31"],
     "before 1970"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-latest", "--partition", "a"],
     "partition number"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-latest", "--partition", "1",
      "--partition", "1"], "twice"),
    (["group", "reset-offsets", " ", "--topic", "t", "--to-latest"], "group id is empty"),
    (["group", "describe", ""], "group id is empty"),
    (["consume", "t", "--group", "g", "--offset", "3"], "--offset cannot be used with --group"),
    (["consume", "t", "--group", "g", "--partition", "0"], "--partition cannot be used"),
    (["consume", "t", "--group", "g", "--timestamp", "5"], "--timestamp cannot be used"),
    (["consume", "t", "--group", "", "-n", "1"], "--group is empty"),
    (["consume", "t", "--group", "g", "-n", "0"], "at least 1"),
    (["group", "list"], "no brokers given"),
])
def test_bad_input_is_refused_before_anything_is_sent(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATA_BOOTSTRAP", raising=False)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["group", "reset-offsets", "g", "--topic", "t"],  # no target
    ["group", "reset-offsets", "g", "--to-latest"],  # no topic
    ["group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"],
    ["group", "frobnicate"],
    ["group", "delete"],
])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    capsys.readouterr()


def test_consume_group_exits_cleanly_on_a_signal_during_the_final_commit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM stops the loop; a second one during the final commit (or close) must not
    escape as the internal ``_Stop``: exit 0 once the commit and the leave are done."""
    calls: list[str] = []

    class FakeAdmin:
        def __init__(self, bootstrap: str, **options: Any) -> None:
            pass

        def __enter__(self) -> FakeAdmin:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def describe_topics(self, topics: list[str]) -> None:
            pass

    def signal_self() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, in this (main) thread

    class FakeConsumer:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.polls = 0

        def subscribe(self, topics: list[str], **callbacks: Any) -> None:
            calls.append("subscribe")

        def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Any]:
            self.polls += 1
            if self.polls == 1:
                return [ConsumerRecord("t", 0, 0, 0, TimestampType.CREATE_TIME, None, b"r0",
                                       [])]
            signal_self()  # the first SIGTERM: stop consuming
            return []

        def commit(self) -> dict[TopicPartition, int]:
            calls.append("commit")
            signal_self()  # the second one, during the final commit
            return {TopicPartition("t", 0): 1}

        def close(self) -> None:
            calls.append("close")
            signal_self()  # and a third, during close

    monkeypatch.setattr(consume, "Admin", FakeAdmin)
    monkeypatch.setattr(consume, "Consumer", FakeConsumer)
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["consume", "t", "--group", "g", "--bootstrap", "127.0.0.1:1"]) == 0
    assert calls == ["subscribe", "commit", "close"]
    assert signal.getsignal(signal.SIGTERM) == previous
    out = capsys.readouterr()
    assert "r0" in out.out and "1 record(s) consumed" in out.err


# ----------------------------------------------------------------------------- real broker


class Cli:
    """The real ``strata`` command run in this process (no interpreter start-up per call)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, err
        return out

    def fails(self, *argv: str, words: tuple[str, ...] = ()) -> str:
        code, out, err = self(*argv)
        assert code == 1, (out, err)
        for word in words:
            assert word in err, err
        return err


def _describe(cli: Cli, group: str) -> dict[str, Any]:
    described: dict[str, Any] = json.loads(cli.ok("group", "describe", group,
                                                  "--format", "json"))
    return described


def _offsets(described: dict[str, Any]) -> dict[int, int | None]:
    return {p["partition"]: p["current_offset"] for p in described["partitions"]}


def test_consume_group_commits_the_position_of_a_partition_it_printed_nothing_from(
        broker: BrokerProcess, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As Kafka's console consumer: a partition the member holds but printed nothing
    from still gets its position committed (here the reset position 0 of an empty
    partition), so the next owner does not reset again and skip what came meanwhile.
    Before, only printed partitions were committed and partition 1 stayed without one."""
    monkeypatch.setenv("STRATA_BOOTSTRAP", broker.bootstrap)
    cli = Cli(capsys)
    topic, group = "cli-group-reset-position", "cli-group-reset"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    produce(broker.bootstrap, topic, 5, value="r{}")
    out = cli.ok("consume", topic, "--group", group, "--from-beginning", "-n", "5")
    assert sorted(out.split()) == [f"r{i}" for i in range(5)]
    assert _offsets(_describe(cli, group)) == {0: 5, 1: 0}


def test_group_commands_end_to_end(broker: BrokerProcess, reaper: ProcessReaper,
                                   capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_BOOTSTRAP", broker.bootstrap)
    cli = Cli(capsys)
    topic, group = "cli-group-events", "cli-group-g"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, 1)])
    produce(broker.bootstrap, topic, 30, 3, value="r{}")

    # consume --group prints the group's share and commits what it printed.
    out = cli.ok("consume", topic, "--group", group, "--from-beginning", "-n", "30",
                 "--format", "json")
    assert sorted(json.loads(line)["value"] for line in out.splitlines()) == \
        sorted(f"r{i}" for i in range(30))
    described = _describe(cli, group)
    assert described["members"] == [] and described["state"] == "Empty"  # it left cleanly
    assert _offsets(described) == {0: 10, 1: 10, 2: 10}
    assert all(p["lag"] == 0 and p["log_end_offset"] == 10 for p in described["partitions"])
    listed = json.loads(cli.ok("group", "list", "--format", "json"))
    assert {"group_id": group, "state": "Empty", "assignor": "cooperative-sticky",
            "members": 0, "coordinator": 0} in listed
    assert group in cli.ok("group", "list")

    # Six more: lag 2 per partition; a second run resumes at the committed offsets.
    produce(broker.bootstrap, topic, 6, 3, start=30, value="r{}")
    text = cli.ok("group", "describe", group)
    assert "TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG MEMBER" in " ".join(text.split())
    assert _describe(cli, group)["total_lag"] == 6
    out = cli.ok("consume", topic, "--group", group, "-n", "6")
    assert sorted(out.split()) == sorted(f"r{i}" for i in range(30, 36))

    # reset-offsets: the plan changes nothing; --execute commits it.
    plan = json.loads(cli.ok("group", "reset-offsets", group, "--topic", topic,
                             "--to-earliest", "--format", "json"))
    assert plan["executed"] is False
    assert [(p["current_offset"], p["new_offset"]) for p in plan["partitions"]] == \
        [(12, 0)] * 3
    assert _offsets(_describe(cli, group)) == {0: 12, 1: 12, 2: 12}
    assert "Dry run: nothing changed" in cli.ok("group", "reset-offsets", group,
                                                "--topic", topic, "--to-latest")
    done = json.loads(cli.ok("group", "reset-offsets", group, "--topic", topic,
                             "--to-offset", "5", "--partition", "0", "--execute",
                             "--format", "json"))
    assert done["executed"] is True and len(done["partitions"]) == 1
    assert _offsets(_describe(cli, group)) == {0: 5, 1: 12, 2: 12}
    cli.ok("group", "reset-offsets", group, "--topic", topic, "--to-datetime",
           "1970-01-02T00:00:00Z", "--execute")
    assert _offsets(_describe(cli, group)) == {0: 0, 1: 0, 2: 0}
    plan = json.loads(cli.ok("group", "reset-offsets", group, "--topic", topic,
                             "--to-datetime", "2999-01-01", "--format", "json"))
    assert [p["new_offset"] for p in plan["partitions"]] == [12, 12, 12]  # past the end
    cli.fails("group", "reset-offsets", group, "--topic", "cli-no-such-topic",
              "--to-earliest", words=("UNKNOWN_TOPIC_OR_PARTITION",))
    cli.fails("group", "reset-offsets", group, "--topic", topic, "--to-earliest",
              "--partition", "7", words=("7",))

    # A live member: reset --execute and delete are refused; SIGTERM leaves cleanly.
    env = dict(os.environ, PYTHONPATH=str(REPO), STRATA_BOOTSTRAP=broker.bootstrap)
    live = subprocess.Popen(
        [sys.executable, "-m", "strata_tools.cli", "consume", topic, "--group", group],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    reaper.track(live.pid, group)
    try:
        deadline = time.monotonic() + 30
        while not _describe(cli, group)["members"]:
            assert time.monotonic() < deadline and live.poll() is None, live.stderr
            time.sleep(0.2)
        member = _describe(cli, group)["members"][0]
        assert member["client_id"] == "strata-console-consumer"
        assert len(member["assignment"]) == 3
        text = cli.ok("group", "describe", group)
        assert member["member_id"] in text
        cli.fails("group", "reset-offsets", group, "--topic", topic, "--to-earliest",
                  "--execute", words=("active member", "Nothing was changed"))
        assert "--execute is refused" in cli.ok("group", "reset-offsets", group,
                                                "--topic", topic, "--to-earliest")
        cli.fails("group", "delete", group, words=("NON_EMPTY_GROUP",))
        # It printed the 36 records from offset 0 and committed them.
        deadline = time.monotonic() + 30
        while _offsets(_describe(cli, group)) != {0: 12, 1: 12, 2: 12}:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        live.send_signal(signal.SIGTERM)
        stdout, stderr = live.communicate(timeout=30)
    finally:
        if live.poll() is None:
            live.kill()
    assert live.returncode == 0, stderr
    assert "36 record(s) consumed" in stderr and "Traceback" not in stderr
    assert sorted(stdout.split()) == sorted(f"r{i}" for i in range(36))
    assert _describe(cli, group)["members"] == []  # left at once, no session timeout

    cli.ok("group", "delete", group)
    cli.fails("group", "describe", group, words=("does not exist",))
    cli.fails("group", "delete", group, words=("GROUP_ID_NOT_FOUND",))
    assert group not in cli.ok("group", "list")


@pytest.mark.parametrize("group", [None, "cli-pipe-group"], ids=["assigned", "group"])
def test_consume_prints_every_record_when_its_pipe_is_not_read_for_longer_than_timeout(
        broker: BrokerProcess, reaper: ProcessReaper, tmp_path: Path,
        group: str | None) -> None:
    """Issue [3.1]: ``strata consume ... | slow-program``. The output is a real pipe that
    nobody reads for four times ``--timeout-ms`` while records wait, so the consumer
    blocks in a print (the pipe holds 64 KiB; the output is about 1 MB) with half the
    records still in the log. Time spent
    printing is not silence (Kafka's console consumer ends only when polls that waited
    the whole interval came back empty): every record arrives. Before, the silence clock
    started when poll returned, so the first print that blocked longer than the timeout
    ended the loop with records waiting (the [2.1] "stall")."""
    topic = f"cli-pipe-{group or 'assigned'}"
    count = 3000

    value = "{:06d}" + "x" * 200
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, 1)])
    produce(broker.bootstrap, topic, count // 2, 3, value=value)
    env = dict(os.environ, PYTHONPATH=str(REPO), STRATA_BOOTSTRAP=broker.bootstrap)
    argv = [sys.executable, "-m", "strata_tools.cli", "consume", topic, "--from-beginning",
            "-n", str(count), "--timeout-ms", "1000", "--format", "json"]
    if group is not None:
        argv += ["--group", group]
    with (tmp_path / "err").open("w") as err:
        consumer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
    reaper.track(consumer.pid, topic)
    try:
        assert consumer.stdout is not None
        readable, _, _ = select.select([consumer.stdout], [], [], 60)
        assert readable, (tmp_path / "err").read_text()  # it has started printing
        # Nobody reads: the consumer blocks on the full pipe with the first half (one
        # poll's worth); the second half waits in the log meanwhile.
        produce(broker.bootstrap, topic, count - count // 2, 3, start=count // 2, value=value)
        time.sleep(4.0)
        assert consumer.poll() is None, (tmp_path / "err").read_text()
        out, _ = consumer.communicate(timeout=90)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    stderr = (tmp_path / "err").read_text()
    assert consumer.returncode == 0, stderr
    values = sorted(json.loads(line)["value"][:6] for line in out.decode().splitlines())
    assert values == [f"{i:06d}" for i in range(count)], stderr
    assert f"{count} record(s) consumed" in stderr
    if group is not None:
        with Admin(broker.bootstrap) as admin:
            committed = admin.list_group_offsets(group)
        assert {tp.partition: c.offset for tp, c in committed.items()} == \
            {0: count // 3, 1: count // 3, 2: count // 3}


def test_group_consume_does_not_count_the_wait_for_its_first_partitions(
        broker: BrokerProcess, reaper: ProcessReaper, tmp_path: Path) -> None:
    """``--timeout-ms`` with ``--group`` counts silence only once the group has given the
    member partitions. A first member (a ``strata consume --group`` whose stdout nobody
    reads) holds every partition, blocked in a print, until ``--max-poll-interval-ms
    4000`` makes it leave; a second member with ``--timeout-ms 1000`` waits those seconds
    without counting them, then prints every record. Before, it ended after about a
    second with "0 record(s) consumed" while 3,000 records waited (as a slow join on a
    busy machine did in CI)."""
    topic = group = "cli-join-wait"
    count = 3000
    value = "{:06d}" + "x" * 200
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, 1)])
    produce(broker.bootstrap, topic, count, 3, value=value)
    env = dict(os.environ, PYTHONPATH=str(REPO), STRATA_BOOTSTRAP=broker.bootstrap)
    argv = [sys.executable, "-m", "strata_tools.cli", "consume", topic, "--group", group,
            "--from-beginning", "--format", "json"]
    with (tmp_path / "first.err").open("w") as err:
        first = subprocess.Popen([*argv, "--max-poll-interval-ms", "4000"],
                                 stdout=subprocess.PIPE, stderr=err, env=env)
    reaper.track(first.pid, topic)
    try:
        assert first.stdout is not None
        readable, _, _ = select.select([first.stdout], [], [], 60)
        assert readable and first.poll() is None, (tmp_path / "first.err").read_text()
        with (tmp_path / "second.err").open("w") as err:
            second = subprocess.Popen([*argv, "-n", str(count), "--timeout-ms", "1000"],
                                      stdout=subprocess.PIPE, stderr=err, env=env)
        reaper.track(second.pid, topic)
        out, _ = second.communicate(timeout=90)
    finally:
        first.kill()
        first.wait(30)
    stderr = (tmp_path / "second.err").read_text()
    assert second.returncode == 0, stderr
    assert f"{count} record(s) consumed" in stderr, stderr
    values = sorted(json.loads(line)["value"][:6] for line in out.decode().splitlines())
    assert values == [f"{i:06d}" for i in range(count)], stderr
