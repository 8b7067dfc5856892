"""The group fault checker (tests/support/group_checker.py) catches what it must.

A checker that never fails proves nothing, so every check is shown failing on a
hand-made history, without any broker: a lost record, a wrong or foreign value, a
member's deliveries going back or skipping, a delivery of a partition the member does
not own, a committed offset moving backwards (between samples, and between a member's
commit and a sample), a kept partition never fetched again after a cooperative rebalance
(the client bug this test was written for), a partition left with no live owner (also
when its owner's application stopped polling and kept it), a commit accepted from a
member that had left for not polling, and a member that crashed. The same histories
with the fault taken out pass, so each check fails for the planted reason only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.group_checker import (
    Ack,
    History,
    MemberRun,
    OffsetSample,
    Report,
    check,
    load,
)

pytestmark = pytest.mark.unit

T0 = 1000.0
SESSION_S = 6.0  # limit: 11 s


def _value(p: int, o: int) -> str:
    return f"run:{p}:{o}"


class Story:
    """A hand-made history: records acknowledged every ``every`` seconds per partition
    from T0+1, members that take partitions, receive and commit."""

    def __init__(self, partitions: int = 2, records: int = 100, every: float = 0.1) -> None:
        self.partitions = partitions
        self.acks = [Ack(p, o, T0 + 1 + o * every, _value(p, o))
                     for p in range(partitions) for o in range(records)]
        self.members: dict[str, MemberRun] = {}
        self.samples: list[OffsetSample] = []
        self.disturbed: list[tuple[float, float]] = []
        self.end = T0 + 1 + records * every + 1
        self.max_poll_interval_s: float | None = None

    def ack_time(self, p: int, o: int) -> float:
        return next(a.at for a in self.acks if (a.partition, a.offset) == (p, o))

    def member(self, name: str, group: str = "g", started: float = T0) -> MemberRun:
        self.members[name] = MemberRun(name, group, started)
        return self.members[name]

    def event(self, name: str, ev: str, t: float, **fields: Any) -> None:
        member = self.members[name]
        member.events.append({"ev": ev, "g": member.group, "m": name, "t": t, **fields})

    def receive(self, name: str, p: int, offsets: range, lag: float = 0.05) -> None:
        """One poll per record, ``lag`` after it was acknowledged."""
        for o in offsets:
            self.event(name, "recv", self.ack_time(p, o) + lag, r=[[p, o, _value(p, o)]])

    def history(self) -> History:
        for member in self.members.values():
            member.events.sort(key=lambda e: e["t"])
        sent = {a.value: a.partition for a in self.acks}
        return History("t", self.partitions, SESSION_S, T0, self.end, list(self.acks), sent,
                       self.members, self.samples, self.disturbed,
                       max_poll_interval_s=self.max_poll_interval_s)


def _one_member_reads_everything(story: Story, group: str = "g") -> None:
    name = f"{group}-a"
    story.member(name, group)
    story.event(name, "assign", T0 + 0.5, ps=list(range(story.partitions)))
    for p in range(story.partitions):
        story.receive(name, p, range(100))


def _checks(report: Report) -> list[str]:
    return sorted({v.check for v in report.violations})


def test_a_clean_history_passes() -> None:
    story = Story()
    _one_member_reads_everything(story)
    story.event("g-a", "commit", T0 + 5.2, s=T0 + 5.1, err=None, ps={"0": 40, "1": 41})
    story.samples += [OffsetSample("g", T0 + 3, T0 + 3.1, {0: 20, 1: 20}),
                      OffsetSample("g", T0 + 5.15, T0 + 5.3, {0: 40, 1: 40}),
                      OffsetSample("g", T0 + 9, T0 + 9.1, {0: 80, 1: 80})]
    report = check(story.history())
    assert report.ok, report.render()
    group = report.groups[0]
    assert (group.acknowledged, group.delivered, group.commits, group.samples) == \
        (200, 200, 1, 3)


def test_two_groups_are_judged_separately_and_redeliveries_are_fine() -> None:
    story = Story()
    _one_member_reads_everything(story, "g1")
    story.member("g2-a", "g2")
    story.event("g2-a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("g2-a", 0, range(100))
    story.receive("g2-a", 1, range(60))
    story.event("g2-a", "lost", T0 + 7.2, ps=[1])
    story.event("g2-a", "assign", T0 + 7.4, ps=[1])  # rejoined: from the commit again
    story.receive("g2-a", 1, range(50, 100), lag=1.5)
    report = check(story.history())
    assert report.ok, report.render()
    assert [(g.group, g.deliveries - g.delivered) for g in report.groups] == \
        [("g1", 0), ("g2", 10)]


def test_a_lost_record_is_named_with_its_partition_and_offsets() -> None:
    story = Story()
    _one_member_reads_everything(story, "billing")
    story.members["billing-a"].events = [
        e for e in story.members["billing-a"].events
        if not (e["ev"] == "recv" and e["r"][0][:2] in ([1, 30], [1, 31]))]
    report = check(story.history())
    lost = [v for v in report.violations if v.check == "LOST"]
    assert len(lost) == 1, report.render()
    assert (lost[0].group, lost[0].partition) == ("billing", 1)
    assert "offsets 30..31 (2 records)" in lost[0].detail
    assert "group billing partition 1" in lost[0].render(T0)
    # The member skipped two offsets inside one ownership: ORDER says so too.
    assert _checks(report) == ["LOST", "ORDER"]


def test_a_wrong_value_and_a_foreign_value_are_reported() -> None:
    story = Story(records=10)
    story.member("a")
    story.event("a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("a", 0, range(10))
    story.receive("a", 1, range(10))
    story.event("a", "recv", T0 + 11.5, r=[[0, 10, "someone-else"]])  # beyond the acks
    recv = next(e for e in story.members["a"].events if e["ev"] == "recv")
    recv["r"] = [[0, 0, _value(0, 1)]]
    report = check(story.history())
    assert _checks(report) == ["UNEXPECTED", "WRONG"], report.render()


def test_deliveries_going_back_or_outside_ownership_are_reported() -> None:
    story = Story(records=20)
    story.member("a")
    story.event("a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("a", 0, range(20))
    story.receive("a", 1, range(10))
    story.event("a", "revoke", T0 + 2.04, ps=[1])
    story.receive("a", 1, range(10, 20))  # not its partition any more
    story.event("a", "recv", T0 + 3.5, r=[[0, 5, _value(0, 5)]])  # back to 5
    story.member("b", started=T0 + 2)
    story.event("b", "assign", T0 + 2.2, ps=[1])
    story.receive("b", 1, range(10, 20), lag=0.3)
    report = check(story.history())
    checks = [v.check for v in report.violations]
    assert checks.count("UNOWNED") == 10 and checks.count("ORDER") == 1, report.render()
    order = next(v for v in report.violations if v.check == "ORDER")
    assert (order.member, order.partition) == ("a", 0)
    assert "offset 5 delivered after offset 19 (went back)" in order.detail


def test_committed_offsets_moving_backwards_are_reported() -> None:
    story = Story()
    _one_member_reads_everything(story)
    story.samples += [OffsetSample("g", T0 + 3, T0 + 3.1, {0: 20, 1: 20}),
                      OffsetSample("g", T0 + 4, T0 + 4.1, {0: 25, 1: 18})]
    report = check(story.history())
    back = [v for v in report.violations if v.check == "COMMIT-BACKWARDS"]
    assert [(v.partition, v.start, v.end) for v in back] == [(1, T0 + 3.1, T0 + 4.1)], \
        report.render()
    # Overlapping requests may see either order: not a violation.
    story.samples[1] = OffsetSample("g", T0 + 3.05, T0 + 4.1, {0: 25, 1: 18})
    assert check(story.history()).ok


def test_a_commit_below_an_earlier_sample_is_reported() -> None:
    story = Story()
    _one_member_reads_everything(story)
    story.samples.append(OffsetSample("g", T0 + 5, T0 + 5.1, {0: 40, 1: 40}))
    story.event("g-a", "commit", T0 + 6.2, s=T0 + 6.1, err=None, kind="async",
                ps={"0": 50, "1": 30})
    report = check(story.history())
    back = [v for v in report.violations if v.check == "COMMIT-BACKWARDS"]
    assert len(back) == 1 and back[0].partition == 1, report.render()
    assert "async commit by g-a" in back[0].detail


def _kept_partition_story(receive_kept_after: bool) -> Story:
    """Member a owns both partitions; b joins at +10 s and gets p1 (revoked from a);
    a keeps p0 but (unless ``receive_kept_after``) never receives it again."""
    story = Story(records=300)  # 30 s of records
    story.member("a")
    story.event("a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("a", 0, range(90))
    story.receive("a", 1, range(90))
    story.event("a", "revoke", T0 + 10.0, ps=[1])
    story.member("b", started=T0 + 9)
    story.event("b", "assign", T0 + 10.1, ps=[1])
    story.receive("b", 1, range(90, 300), lag=0.2)
    if receive_kept_after:
        story.receive("a", 0, range(90, 300))
    return story


def test_a_kept_partition_never_fetched_after_a_rebalance_is_a_stall() -> None:
    report = check(_kept_partition_story(receive_kept_after=False).history())
    stalls = [v for v in report.violations if v.check == "STALL"]
    assert [(v.group, v.partition, v.member) for v in stalls] == [("g", 0, "a")], \
        report.render()
    assert stalls[0].start == T0 + 1 + 90 * 0.1  # the first record it did not get
    assert stalls[0].end == pytest.approx(T0 + 32)
    assert "210 acknowledged records above offset 89 waited" in stalls[0].detail
    assert _checks(report) == ["LOST", "STALL"]
    assert check(_kept_partition_story(receive_kept_after=True).history()).ok


def test_a_slow_but_moving_partition_is_not_a_stall() -> None:
    story = Story(records=300)
    story.member("a")
    story.event("a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("a", 0, range(300), lag=8.0)  # always 8 s behind, never 11 s idle
    story.receive("a", 1, range(300))
    story.end += 8
    assert check(story.history()).ok


def test_paused_members_and_broker_failovers_stop_the_stall_clock() -> None:
    story = _kept_partition_story(receive_kept_after=False)
    story.members["a"].pauses.append((T0 + 12, T0 + 25))  # waits 3 s before, 7 s after
    report = check(story.history())
    assert "STALL" not in _checks(report), report.render()
    story.members["a"].pauses.clear()
    story.disturbed.append((T0 + 12, T0 + 25))
    assert "STALL" not in _checks(check(story.history()))
    story.disturbed[0] = (T0 + 12, T0 + 18)  # 2 + 14 s idle outside it
    assert "STALL" in _checks(check(story.history()))


def test_a_member_that_stops_fetching_right_after_it_starts_owning_is_a_stall() -> None:
    story = Story(records=300)
    story.member("a")
    story.event("a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("a", 0, range(300))
    story.receive("a", 1, range(50))
    story.event("a", "revoke", T0 + 6.05, ps=[1])
    story.member("b", started=T0 + 5)
    story.event("b", "assign", T0 + 6.1, ps=[1])  # nothing ever received
    report = check(story.history())
    stalls = [v for v in report.violations if v.check == "STALL"]
    assert [(v.partition, v.member) for v in stalls] == [(1, "b")], report.render()
    assert stalls[0].start == T0 + 6.1


def test_a_partition_whose_owner_died_and_never_moved_is_an_orphan() -> None:
    story = Story(records=300)
    story.member("a")
    story.member("b")
    story.event("a", "assign", T0 + 0.5, ps=[0])
    story.event("b", "assign", T0 + 0.5, ps=[1])
    story.receive("a", 0, range(300))
    story.receive("b", 1, range(100))
    story.members["b"].ended, story.members["b"].end_kind = T0 + 11.02, "kill"
    story.members["b"].exit_code = -9
    report = check(story.history())
    assert _checks(report) == ["LOST", "ORPHAN"], report.render()
    orphan = next(v for v in report.violations if v.check == "ORPHAN")
    assert (orphan.partition, orphan.member) == (1, None)
    # Moved to a within the session timeout: fine.
    story.event("a", "assign", T0 + 17, ps=[1])
    story.receive("a", 1, range(100, 300), lag=6.5)
    assert check(story.history()).ok


def _stuck_story(moved_after: float | None) -> Story:
    """Two members; b's application stops polling at +10 s for 20 s (its ``busy``
    line) while its heartbeats would go on; its partition 1 moves to a ``moved_after``
    seconds later (None: never, as before ``max_poll_interval_ms``)."""
    story = Story(records=400)  # 40 s of records
    story.max_poll_interval_s = 5.0
    story.member("a")
    story.member("b")
    story.event("a", "assign", T0 + 0.5, ps=[0])
    story.event("b", "assign", T0 + 0.5, ps=[1])
    story.receive("a", 0, range(400))
    story.receive("b", 1, range(90))
    story.event("b", "busy", T0 + 30.5, **{"from": T0 + 10.0, "to": T0 + 30.5})
    if moved_after is None:
        story.receive("b", 1, range(90, 400), lag=21.0)  # back from the stall: all of it
    else:
        story.event("a", "assign", T0 + 10 + moved_after, ps=[1])
        story.receive("a", 1, range(90, 400), lag=moved_after + 0.5)
        story.event("b", "lost", T0 + 30.6, ps=[1])
    story.end += 21
    return story


def test_a_stuck_application_that_keeps_its_partitions_is_an_orphan() -> None:
    report = check(_stuck_story(moved_after=None).history())
    orphans = [v for v in report.violations if v.check == "ORPHAN"]
    assert [(v.partition, v.member) for v in orphans] == [(1, None)], report.render()
    assert orphans[0].start == T0 + 10.0
    assert _checks(report) == ["ORPHAN"]
    # Moved within max_poll_interval_ms plus a rebalance: fine.
    assert check(_stuck_story(moved_after=6.0).history()).ok
    # Without its busy line the stuck member counts as live: a STALL instead.
    story = _stuck_story(moved_after=None)
    story.members["b"].events = [e for e in story.members["b"].events if e["ev"] != "busy"]
    assert _checks(check(story.history())) == ["STALL"]


def test_a_commit_accepted_after_the_member_left_for_not_polling_is_reported() -> None:
    story = _stuck_story(moved_after=6.0)
    story.event("b", "commit", T0 + 29.2, s=T0 + 29.0, kind="sync", err=1300,
                fail={"1": "UNKNOWN_MEMBER_ID"}, ps={})  # refused: fine
    story.event("b", "commit", T0 + 12.1, s=T0 + 12.0, kind="sync", err=None,
                ps={"1": 90})  # 2 s into the stall, still a member: fine
    assert check(story.history()).ok
    story.event("b", "commit", T0 + 29.6, s=T0 + 29.5, kind="sync", err=None,
                ps={"1": 90})
    report = check(story.history())
    zombies = [v for v in report.violations if v.check == "ZOMBIE-COMMIT"]
    assert [(v.member, v.end) for v in zombies] == [("b", T0 + 29.5)], report.render()
    assert "19.5s after its application last polled" in zombies[0].detail


def test_a_member_that_crashed_or_hung_on_leaving_is_reported() -> None:
    story = Story(records=10)
    story.member("a")
    story.event("a", "assign", T0 + 0.5, ps=[0, 1])
    story.receive("a", 0, range(10))
    story.receive("a", 1, range(10))
    story.member("b")
    story.event("b", "error", T0 + 2, text="Traceback ...\nRuntimeError: boom")
    story.members["b"].ended, story.members["b"].end_kind = T0 + 2.5, "exit"
    story.members["b"].exit_code = 1
    story.member("c")
    story.members["c"].ended, story.members["c"].end_kind = T0 + 3, "stop"
    story.members["c"].exit_code = -9
    report = check(story.history())
    exits = {v.member: v.detail for v in report.violations if v.check == "EXIT"}
    assert set(exits) == {"b", "c"}, report.render()
    assert "RuntimeError: boom" in exits["b"]


def _write(path: Path, rows: list[dict[str, Any]], torn: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)


def test_load_reads_a_log_directory_and_skips_a_torn_last_line(tmp_path: Path) -> None:
    _write(tmp_path / "harness.jsonl", [
        {"ev": "meta", "topic": "t", "partitions": 1, "session_timeout_s": 6.0, "t0": T0,
         "seed": 7},
        {"ev": "member-start", "m": "a", "g": "g", "t": T0},
        {"ev": "member-start", "m": "b", "g": "g", "t": T0},
        {"ev": "member-pause", "m": "b", "t": T0 + 1},
        {"ev": "member-resume", "m": "b", "t": T0 + 2},
        {"ev": "member-kill", "m": "b", "t": T0 + 3},
        {"ev": "broker-kill", "broker": 1, "t": T0 + 4},
        {"ev": "broker-healthy", "broker": 1, "t": T0 + 9},
        {"ev": "end", "t": T0 + 10},
        {"ev": "member-stop", "m": "a", "t": T0 + 11},
        {"ev": "member-exit", "m": "a", "t": T0 + 11.5, "code": 0},
    ])
    _write(tmp_path / "records.jsonl", [
        {"p": 0, "v": _value(0, 0), "o": 0, "t": T0 + 1},
        {"p": 0, "v": "never-acked", "o": None, "t": None}])
    _write(tmp_path / "samples.jsonl", [{"g": "g", "s": T0 + 2, "t": T0 + 2.1,
                                         "offsets": {"0": 1}}])
    _write(tmp_path / "members" / "a.jsonl", [
        {"ev": "assign", "g": "g", "m": "a", "t": T0 + 0.5, "ps": [0]},
        {"ev": "recv", "g": "g", "m": "a", "t": T0 + 1.1, "r": [[0, 0, _value(0, 0)]]}])
    _write(tmp_path / "members" / "b.jsonl", [], torn='{"ev": "recv", "g": "g", "m"')
    history = load(tmp_path)
    assert (history.seed, history.end, history.disturbed) == (7, T0 + 10, [(T0 + 4, T0 + 9)])
    assert history.members["b"].pauses == [(T0 + 1, T0 + 2)]
    assert (history.members["b"].end_kind, history.members["a"].end_kind) == ("kill", "stop")
    assert history.members["a"].exit_code == 0 and history.members["b"].events == []
    assert [a.offset for a in history.acks] == [0] and history.sent["never-acked"] == 0
    assert history.samples[0].offsets == {0: 1}
    assert check(history).ok
