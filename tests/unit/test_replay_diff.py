"""kafka-monitor replay's comparison (``kafka_monitor.replay.diff``): alerts-topic records into
episodes, and per alert the episodes the same, added, removed and shifted within a range."""

from __future__ import annotations

from kafka_monitor.replay.diff import Episode, diff, entity_of, entity_text, episodes

S = 1_000
LO, HI = 1_000 * S, 2_000 * S
P0 = {"cluster": "k", "topic": "t", "partition": 0}
P1 = {"cluster": "k", "topic": "t", "partition": 1}


def rec(action: str, at: int, aid: str, alert: str = "IsrShrink", labels: dict = P0, severity: str = "warning") -> dict:
    return {"alert": alert, "action": action, "alert_id": aid, "severity": severity, "at": at, "labels": labels}


def ep(start, end, alert="IsrShrink", labels=P0, aid="x") -> Episode:
    return Episode(alert, entity_of(labels), start, end, aid, "warning")


def test_records_pair_into_episodes_by_alert_id_whatever_their_order_and_repeats():
    got = episodes([rec("resolve", 1500 * S, "a"), rec("open", 1200 * S, "a"), rec("open", 1200 * S, "a"),
                    rec("open", 1900 * S, "b"),                       # still open
                    rec("resolve", 1100 * S, "c", labels=P1),         # opened before what was read
                    rec("open", 1300 * S, "d", alert="UnderReplicated", severity="critical")])
    assert [(e.alert, dict(e.entity)["partition"], e.start, e.end, e.alert_id, e.severity) for e in got] == [
        ("IsrShrink", "0", 1200 * S, 1500 * S, "a", "warning"),
        ("IsrShrink", "0", 1900 * S, None, "b", "warning"),
        ("IsrShrink", "1", None, 1100 * S, "c", "warning"),
        ("UnderReplicated", "0", 1300 * S, None, "d", "critical")]


def test_the_same_records_are_the_same_episodes():
    recs = [rec("open", 1200 * S, "a"), rec("resolve", 1300 * S, "a"), rec("open", 1400 * S, "b", labels=P1)]
    d = diff(episodes(recs), episodes(list(reversed(recs))), LO, HI)
    assert {a: x.counts() for a, x in d.items()} == {"IsrShrink": {"same": 2, "added": 0, "removed": 0, "shifted": 0}}
    assert not d["IsrShrink"].differs


def test_added_removed_and_shifted_with_their_shift_in_seconds():
    job = [ep(1100 * S, 1200 * S, aid="j1"), ep(1500 * S, 1600 * S, aid="j2"), ep(1800 * S, 1850 * S, aid="j3")]
    rep = [ep(1090 * S, 1200 * S, aid="r1"),           # 10 s earlier
           ep(1300 * S, 1350 * S, aid="r2"),           # the replay alone
           ep(1500 * S, 1660 * S, aid="r3")]           # ends a minute later; j3 is the job's alone
    d = diff(job, rep, LO, HI)["IsrShrink"]
    assert [(s.job.alert_id, s.replay.alert_id, s.start_s, s.end_s) for s in d.shifted] == [
        ("j1", "r1", -10.0, 0.0), ("j2", "r3", 0.0, 60.0)]
    assert [e.alert_id for e in d.added] == ["r2"] and [e.alert_id for e in d.removed] == ["j3"]
    assert d.same == [] and d.differs


def test_only_the_range_is_judged():
    """Before the range's start and after its end both sides count as the range's edge: an
    episode both saw open at the start (however long before) and still open at the end is the
    same; one wholly outside the range is not compared."""
    job = [ep(None, 1100 * S, aid="j1"), ep(1900 * S, None, aid="j2"), ep(500 * S, 900 * S, aid="out"),
           ep(2100 * S, 2200 * S, aid="after")]
    rep = [ep(800 * S, 1100 * S, aid="r1"), ep(1900 * S, 2500 * S, aid="r2"), ep(2100 * S, 2300 * S, aid="after2")]
    d = diff(job, rep, LO, HI)["IsrShrink"]
    assert [(j.alert_id, r.alert_id) for j, r in d.same] == [("j1", "r1"), ("j2", "r2")]
    assert not d.differs


def test_a_split_episode_is_one_shifted_and_one_added():
    d = diff([ep(1100 * S, 1400 * S, aid="j")], [ep(1100 * S, 1200 * S, aid="r1"), ep(1250 * S, 1400 * S, aid="r2")],
             LO, HI)["IsrShrink"]
    assert [(s.job.alert_id, s.replay.alert_id, s.end_s) for s in d.shifted] == [("j", "r1", -200.0)]
    assert [e.alert_id for e in d.added] == ["r2"] and d.removed == []


def test_entities_and_alerts_are_compared_apart():
    job = [ep(1100 * S, 1200 * S, labels=P0, aid="j0")]
    rep = [ep(1100 * S, 1200 * S, labels=P1, aid="r1"), ep(1100 * S, 1200 * S, alert="UnderReplicated", aid="u")]
    d = diff(job, rep, LO, HI)
    assert list(d) == ["IsrShrink", "UnderReplicated"]  # sorted by alert
    assert [e.alert_id for e in d["IsrShrink"].removed] == ["j0"]
    assert [e.alert_id for e in d["IsrShrink"].added] == ["r1"]
    assert [e.alert_id for e in d["UnderReplicated"].added] == ["u"]


def test_moments_that_touch_overlap_and_instant_episodes_compare():
    """An episode a rule opens and resolves at one moment (a due timer met by its event) is an
    instant: equal instants are the same, one touching another episode's end overlaps it."""
    d = diff([ep(1500 * S, 1500 * S, aid="j")], [ep(1500 * S, 1500 * S, aid="r")], LO, HI)["IsrShrink"]
    assert d.counts() == {"same": 1, "added": 0, "removed": 0, "shifted": 0}
    d = diff([ep(1400 * S, 1500 * S, aid="j")], [ep(1500 * S, 1600 * S, aid="r")], LO, HI)["IsrShrink"]
    assert [(s.start_s, s.end_s) for s in d.shifted] == [(100.0, 100.0)]
    d = diff([ep(1400 * S, 1500 * S, aid="j")], [ep(1501 * S, 1600 * S, aid="r")], LO, HI)["IsrShrink"]
    assert d.counts() == {"same": 0, "added": 1, "removed": 1, "shifted": 0}


def test_nothing_on_either_side_is_no_alert():
    assert diff([], [], LO, HI) == {}
    assert diff([ep(100 * S, 200 * S)], [], LO, HI) == {}


def test_entities_read_as_their_labels():
    e = entity_of({"cluster": "k", "group": "g", "topic": "t", "partition": 3, "broker": None, "extra": "x"})
    assert entity_text(e) == "cluster k topic t partition 3 group g extra=x"
    assert ep(1, 2).to_json()["entity"] == {"cluster": "k", "topic": "t", "partition": "0"}
