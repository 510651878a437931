"""Two probes sharing one cluster (a real Tansu broker): every partition, group partition and
group reported by exactly one of them; the job's rules, fed the events they wrote, see one source
per entity and name the probe that stopped; each probe's cycle figures reach /metrics."""

from __future__ import annotations

import re
import threading

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_monitor.local.broker import create_topics
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig, share_of
from streaming.ingest import parsing
from streaming.state import function as state
from streaming.state import fold as state_fold
from streaming.state import rows as st_rows
from streaming.rules.client import ClientRulesConfig
from streaming.rules.source import SourceRulesConfig
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for
from tests.support.events import read_events

pytestmark = pytest.mark.integration


def _names(prefix: str, sep: str, n: int) -> list[str]:
    """n names, both shares of 2 holding at least two of them (the names carry a unique part)."""
    i, out = 0, []
    while len(out) < n or min(sum(share_of(x, 2) == s for x in out) for s in (1, 2)) < 2:
        out.append(f"{prefix}{sep}{i}")
        i += 1
    return out


def test_two_probes_split_one_cluster_and_silent_names_the_one_that_stopped(tansu):
    prefix = unique("share")
    topics = {t: 1 + i % 3 for i, t in enumerate(_names(prefix, ".t", 6))}
    groups = _names(prefix, "-g", 3)
    events = unique("events")
    create_topics(tansu.bootstrap, {**topics, events: 1})
    p = Producer({"bootstrap.servers": tansu.bootstrap})
    for t, n in topics.items():
        for part in range(n):
            for k in range(part + 2):
                p.produce(t, value=b"v%d" % k, partition=part)
    assert p.flush(10) == 0
    committed = {}  # every group commits on every partition of every topic: group partitions of both shares
    for g in groups:
        c = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": g, "enable.auto.commit": False})
        try:
            tps = [TopicPartition(t, part, 1) for t, n in topics.items() for part in range(n)]
            c.commit(offsets=tps, asynchronous=False)
        finally:
            c.close()
        committed.update({(g, tp.topic, tp.partition): 1 for tp in tps})
    partitions = {(t, part) for t, n in topics.items() for part in range(n)}

    sources = {1: f"probe-{prefix}-a", 2: f"probe-{prefix}-b"}
    probes = {i: Probe(ProbeConfig(bootstrap_servers=tansu.bootstrap, events_topic=events, cluster="shared",
                                   source=sources[i], interval_s=1, offsets_via="fetch", share=f"{i}/2",
                                   topics_include=f"^{re.escape(prefix)}\\.t", groups_include=f"^{re.escape(prefix)}-g"))
              for i in (1, 2)}
    stops = {i: threading.Event() for i in probes}
    threads = {i: threading.Thread(target=probes[i].run, args=(stops[i],), daemon=True) for i in probes}
    closed = set()
    try:
        for t in threads.values():
            t.start()
        wait_for(lambda: all(pr.cycles >= 3 for pr in probes.values()), timeout=60, what="3 cycles of each probe")
        stops[2].set()  # probe b's share goes dark
        threads[2].join(30)
        probes[2].close()
        closed.add(2)
        after = probes[1].cycles
        wait_for(lambda: probes[1].cycles >= after + 5, timeout=60, what="5 more cycles of probe a")
    finally:
        for i in probes:
            stops[i].set()
            threads[i].join(30)
            if i not in closed:
                probes[i].close()
    evs = read_events(tansu.bootstrap, events)
    by = {sources[i]: i for i in sources}
    assert {e.source for e in evs} == set(by)

    def keys(etype, key):
        out = {}
        for e in evs:
            if e.type == etype:
                out.setdefault(key(e.data), set()).add(by[e.source])
        return out

    # every partition by exactly one probe, the one whose share holds its topic
    for etype in ("partition_metadata", "partition_offsets"):
        seen = keys(etype, lambda d: (d.topic, d.partition))
        assert set(seen) == partitions, etype
        assert all(owners == {share_of(t, 2)} for (t, _), owners in seen.items()), etype
    seen = keys("group_offsets", lambda d: (d.group, d.topic, d.partition))
    assert set(seen) == set(committed)
    assert all(owners == {share_of(t, 2)} for (_, t, _), owners in seen.items())
    seen = keys("group_state", lambda d: d.group)
    assert set(seen) == set(groups) and all(owners == {share_of(g, 2)} for g, owners in seen.items())
    # a group's offsets are read with the HW of the same probe's observation (the tail consumer of
    # fetch mode may not have the HW in the first one)
    go = [e for e in evs if e.type == "group_offsets"]
    assert all(e.data.high_watermark >= e.data.committed_offset for e in go if e.data.high_watermark is not None)
    latest = {(e.data.group, e.data.topic, e.data.partition): e for e in sorted(go, key=lambda e: e.seq)}
    assert all(e.data.high_watermark is not None for e in latest.values())
    assert {(e.source, e.data.share) for e in evs if e.type == "heartbeat"} == {(sources[1], "1/2"), (sources[2], "2/2")}

    # the job's rules, fed these events: one source per entity, and SourceSilent for probe b only
    rows = parsing.parse_values(pa.array([e.to_json() for e in evs], pa.binary()), gate=True).to_pandas()
    assert rows["reason"].isna().all(), rows["reason"].dropna().unique()
    entities: dict[str, dict] = {}
    # events captured in memory: nothing holds them back, no silence grace (docs/rules.md)
    cfg = state.StateConfig(client=ClientRulesConfig(silence_grace_ms=0), source=SourceRulesConfig(silence_grace_ms=0))
    opened, _ = state_fold.fold(entities, rows, cfg)
    for s in entities.values():
        if s["kind"] in ("partition", "group_partition", "group"):
            observers = {src for (etype, src) in s["applied"] if etype != "metadata_refresh"}
            assert len(observers) == 1, (s["kind"], s.get("topic"), s.get("group"), observers)
    assert {(s["topic"], s["partition"]) for s in entities.values() if s["kind"] == "partition"} == partitions
    last_b = max(e.observed_at for e in evs if e.type == "heartbeat" and e.source == sources[2])
    now = max(e.observed_at for e in evs if e.type == "heartbeat" and e.source == sources[1])
    assert now - last_b > cfg.source.silent_factor * 1000  # probe a went on for longer than b's silent limit
    silent = [t for t in opened + state_fold.tick(entities, now, cfg) if t.alert.value == "SourceSilent"]
    assert [(t.action, t.labels["source"], t.labels["cluster"]) for t in silent] == [("open", sources[2], "shared")]
    assert silent[0].evidence["last_heartbeat_at"] == last_b

    # each probe's cycle figures, as its last heartbeat gave them, are what /metrics shows
    ex = Exporter()
    ex.apply(st_rows.changed_entity_rows(entities, [k for k, s in entities.items() if s["kind"] == "source"], "run"),
             batch_id=0)
    text = ex.render().decode()
    for src in sources.values():
        hb = max((e for e in evs if e.type == "heartbeat" and e.source == src), key=lambda e: e.seq).data
        assert hb.cycle_duration_ms is not None and hb.observation_lag_ms is not None
        lab = {"cluster": "shared", "source": src}
        get = ex.registry.get_sample_value
        assert get("kafka_monitor_source_cycle_duration_seconds", lab) == hb.cycle_duration_ms / 1000
        assert get("kafka_monitor_source_observation_lag_seconds", lab) == hb.observation_lag_ms / 1000
        assert get("kafka_monitor_source_heartbeat_interval_seconds", lab) == 1.0
        assert f'kafka_monitor_source_cycle_duration_seconds{{cluster="shared",source="{src}"}}' in text
