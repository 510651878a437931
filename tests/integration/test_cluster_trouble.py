"""The watched cluster in trouble (issue 19.2): a rolling restart of the 3 brokers, one broker gone
for a while, then the whole cluster unreachable.  The probe keeps running throughout, says when
its refreshes fail and resumes; the job's rules -- its own parser and state function over the
events the probe emitted (tests/support/local_job.py) -- raise what each phase calls for and
nothing else, and say how long the monitor was blind.

Durations are reduced by default; ``KAFKA_MONITOR_TROUBLE_SCALE=4`` runs the issue's (one broker
gone for 2 minutes, the cluster unreachable for 60 s... times 4 of the reduced ones)."""

from __future__ import annotations

import bisect
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import unique, wait_for
from streaming.rules.client import ClientRulesConfig
from streaming.rules.source import SourceRulesConfig
from streaming.state.function import StateConfig
from tests.support.kafka_cluster import in_sync
from tests.support.local_job import LocalJob
from tests.support.real_cluster import TopicWriter, probe_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SCALE = float(os.environ.get("KAFKA_MONITOR_TROUBLE_SCALE", "1"))
GONE_S = 30 * SCALE      # one broker away
OUTAGE_S = 20 * SCALE    # every broker away
INTERVAL_S = 2.0
#: MetadataStale opens after 2 x this without a successful refresh; a cycle whose requests wait
#: for a broker that just went away (request_timeout_s each) stays well within it
MAX_AGE_S = 5.0


def batches(events):
    """The captured events in seq order, one micro-batch per probe cycle (ends at a heartbeat)."""
    out, cur = [], []
    for e in sorted(events, key=lambda e: e.seq):
        cur.append(e)
        if e.type == "heartbeat":
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def storm_clears_at(events) -> float | None:
    """When the job's MetadataRefreshStorm, if the probe's invalidated refreshes opened it, falls
    due to resolve (``streaming.rules.client.client_due_at``, provided no more come); None if it
    never opened."""
    cfg = ClientRulesConfig()
    ts = sorted({e.event_id: e.observed_at for e in events
                 if e.type == "metadata_refresh" and e.data.reason == "invalidated"}.values())
    window = cfg.refresh_storm_window_ms
    opened = any(bisect.bisect_right(ts, t) - bisect.bisect_left(ts, t - window) > cfg.refresh_storm_max for t in ts)
    if not opened:
        return None
    return ts[len(ts) - cfg.refresh_storm_clear - 1] + window


def test_rolling_restart_a_broker_gone_and_the_cluster_unreachable(kafka_cluster):
    c = kafka_cluster
    topic = unique("trouble")
    c.create_topic(topic, partitions=3, rf=3, config={"min.insync.replicas": "2"})
    wait_for(lambda: in_sync(c, topic), timeout=60, what="the topic in sync")
    probe, cap = probe_for(c, f"^{topic}$", interval_s=INTERVAL_S, metadata_max_age_s=MAX_AGE_S,
                           request_timeout_s=3)
    stop = threading.Event()
    crashed: list[BaseException] = []

    def run():
        try:
            probe.run(stop)
        except BaseException as e:  # noqa: BLE001 - the test's verdict
            crashed.append(e)
    thread = threading.Thread(target=run, name="probe", daemon=True)
    marks: dict[str, float] = {}
    thread.start()
    try:
        with TopicWriter(c.bootstrap_servers, topic):
            wait_for(lambda: any(e.type == "partition_offsets" for e in cap.events), timeout=30,
                     what="the probe's first observation")
            marks["rolling"] = time.time()
            for b in (1, 2, 3):
                c.restart_broker(b)
                wait_for(lambda: in_sync(c, topic), timeout=120, what=f"ISR full after restarting broker {b}")
            marks["gone"] = time.time()
            c.stop_broker(2)
            time.sleep(GONE_S)  # the scenario: a broker away this long
            c.start_broker(2)
            wait_for(lambda: in_sync(c, topic), timeout=120, what="ISR full after broker 2 returned")
            marks["outage"] = time.time()
            with ThreadPoolExecutor(3) as pool:
                list(pool.map(c.stop_broker, (1, 2, 3)))
            marks["outage_stopped"] = time.time()
            time.sleep(OUTAGE_S)  # the scenario: nothing to talk to for this long
            marks["outage_end"] = time.time()
            for b in (1, 2, 3):  # from this thread: a broker dies with the thread that started it
                c.start_broker(b)
            wait_for(lambda: in_sync(c, topic), timeout=180, what="the cluster back in sync")
            marks["recovered"] = time.time()
        refreshed = len([e for e in cap.events if e.type == "metadata_refresh" and e.data.ok])
        wait_for(lambda: len([e for e in cap.events if e.type == "metadata_refresh" and e.data.ok]) >= refreshed + 3,
                 timeout=60, what="the probe refreshing again")
        time.sleep(3 * INTERVAL_S)  # a few healthy cycles for the rules to resolve on
        # MetadataRefreshStorm resolves by hysteresis, once the invalidations of the outage and
        # its recovery have slid out of its 60-s window (docs/rules.md): the probe runs on until then
        clears = storm_clears_at(cap.events)
        if clears is not None:
            wait_for(lambda: max(e.observed_at for e in cap.events) > clears + INTERVAL_S * 1000,
                     timeout=ClientRulesConfig().refresh_storm_window_ms / 1000 + 30,
                     what="a heartbeat after the refresh storm's window slid")
            marks["storm_window_slid"] = time.time()
    finally:
        stop.set()
        thread.join(60)
        probe.close(flush_timeout=1)
        for b in (1, 2, 3):  # leave the session's cluster whole for the next test
            if not c.is_running(b):
                c.start_broker(b)

    # the probe never stopped
    assert not crashed, crashed
    assert not thread.is_alive()
    beats = sorted(e.observed_at / 1000 for e in cap.events if e.type == "heartbeat")
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    print(f"\nheartbeats: {len(beats)}, longest gap {max(gaps):.1f} s (interval {INTERVAL_S:g} s); phases: "
          + ", ".join(f"{k} +{v - marks['rolling']:.0f}s" for k, v in marks.items()))
    failed = [e for e in cap.events if e.type == "metadata_refresh" and not e.data.ok]
    assert any(marks["outage_stopped"] <= e.observed_at / 1000 <= marks["outage_end"] for e in failed), \
        "no failed refresh reported while every broker was away"

    if os.environ.get("KAFKA_MONITOR_TROUBLE_DUMP"):
        with open(os.environ["KAFKA_MONITOR_TROUBLE_DUMP"], "wb") as f:
            f.write(b"\n".join(e.to_json() for e in cap.events))
            f.write(("\n" + __import__("json").dumps(marks)).encode())
    # the probe's events are captured in memory here: nothing holds them back as a stalled
    # follower of an events topic would, so the silence limits need no grace (docs/rules.md)
    job = LocalJob(StateConfig(run_id="local", client=ClientRulesConfig(silence_grace_ms=0),
                               source=SourceRulesConfig(silence_grace_ms=0)))
    for b in batches(cap.events):
        job.batch(b)
    assert not job.quarantined, job.quarantined
    seen = {(t["alert"], t["action"]) for t in job.transitions}
    print("transitions:", sorted(seen))
    for t in job.transitions:
        print(f"  +{t['at'] / 1000 - marks['rolling']:5.1f}s {t['alert']} {t['action']} partition {t['partition']}")
    # the monitor says it was blind, and for how long: MetadataStale (and SourceSilent while the
    # probe's cycles wait on brokers that are gone) in episodes that all end; timers expire when
    # they do (streaming.state.function.catch_up), so a refresh that came a moment late is an episode too
    episodes = {}
    for name in ("MetadataStale", "SourceSilent"):
        ts = [t for t in job.transitions if t["alert"] == name]
        assert [t["action"] for t in ts] == ["open", "resolve"] * (len(ts) // 2), ts
        episodes[name] = [(o["at"] / 1000, r["at"] / 1000) for o, r in zip(ts[::2], ts[1::2])]
        print(f"{name}: " + ", ".join(f"+{a - marks['rolling']:.0f}s for {b - a:.1f}s" for a, b in episodes[name]))
    outage = [(a, b) for a, b in episodes["MetadataStale"]
              if marks["outage_stopped"] - 5 <= a <= marks["outage_end"] and b >= marks["outage_end"]]
    assert len(outage) == 1, (episodes["MetadataStale"], marks)
    print(f"MetadataStale open {outage[0][1] - outage[0][0]:.0f} s through the outage "
          f"(every broker away {marks['outage_end'] - marks['outage_stopped']:.0f} s)")
    # what the faults call for
    assert {("IsrShrink", "open"), ("UnderReplicated", "open"), ("LeaderChanged", "open")} <= seen
    # each stopped broker is named once (BrokerDown), and resolved when it is back (checked below);
    # a broker catching up after its restart is BrokerUnderReplicating meanwhile
    assert ("BrokerDown", "open") in seen and ("BrokerDown", "resolve") in seen
    # and nothing else: no lag or group alerts.  MetadataRefreshStorm may open while brokers come
    # and go: the probe refreshes at its own pace (c27665d), every 2 s here, and the outage's
    # failed attempts and the recovery's unknown_leader ones can pass 10 a minute (seen: 11 from
    # +69 s to +91 s); like every episode here it must end (the open alerts are checked below)
    # BrokerMetadataLagging too: the brokers restarted together after the outage replay the
    # metadata log on 2 cores shared with the job, and one took longer than observer_lag_ms (30 s)
    # to be caught up (x19, a loaded machine); it is behind then, and the episode must end
    allowed = {"IsrShrink", "UnderReplicated", "AtMinIsr", "UnderMinIsr", "LeaderChanged",
               "PreferredLeaderImbalance", "MetadataStale", "SourceSilent", "OfflinePartition",
               "MetadataRefreshStorm", "BrokerDown", "BrokerUnderReplicating", "BrokerMetadataLagging"}
    assert {t["alert"] for t in job.transitions} <= allowed, seen
    offline = [t for t in job.transitions if t["alert"] == "OfflinePartition" and t["action"] == "open"]
    assert all(t["at"] / 1000 >= marks["outage"] for t in offline), "offline before every broker was stopped"
    # recovered: only the alerts that resolve on their own clock may still be open
    assert {a[0] for a in job.open_alerts()} <= {"LeaderChanged", "PreferredLeaderImbalance"}, job.open_alerts()
