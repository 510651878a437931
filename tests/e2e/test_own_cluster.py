"""The user's layout (issue 33): the monitor's events and alerts topics on the cluster it watches,
replication factor 3, so every broker fault is also a fault of the monitor's own dependency.

    real cluster (KRaft, 3 brokers): a watched topic with writes flowing, and the events and
      alerts topics -> probe (every second) -> events topic -> Spark job (trigger 1 s)
      -> /metrics and the alerts topic, both on the same brokers

Each fault hits a broker that leads a partition of the monitor's own topics: SIGKILL (librdkafka
then answers ListOffsets with -1001 for a while, which the source once read as a log that went
back, ending the job), SIGSTOP for longer than the fencing timeout (FENCED_LEADER_EPOCH and
timeouts), and a controlled stop of the alerts topic's leader while alerts are being published.
Through each one the query stays up, /metrics answers every poll, batches go on completing, and
the job keeps seeing the cluster (BrokerDown for the broker).  At the end every transition the
job decided (kafka_monitor_alert_transitions_total) is on the alerts topic exactly once.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from contextlib import ExitStack

import pytest

from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig, start, stop_query
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for, watermarks
from tests.support.alerts_topic import read_alerts
from tests.support.kafka_cluster import in_sync
from tests.support.real_cluster import MultiTopicWriter, broker_alerts

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def metrics(url: str) -> dict[tuple[str, str], float]:
    """{(name, labels text): value} of the unlabelled and labelled samples on /metrics."""
    out = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def value(url: str, name: str) -> float:
    return metrics(url).get((name, ""), 0.0)


@pytest.fixture(scope="module")
def own(kafka_cluster, spark, tmp_path_factory):
    c = kafka_cluster
    tmp = tmp_path_factory.mktemp("own-cluster")
    prefix = unique("own.e2e")
    rep = f"{prefix}.rep"
    events, alerts = f"{prefix}.events", f"{prefix}.alerts"
    c.create_topic(rep, partitions=2, config={"min.insync.replicas": 2})
    # as the README tells a user to create them: replication factor 3, min.insync.replicas 1
    c.create_topic(events, partitions=3, config={"min.insync.replicas": 1})
    c.create_topic(alerts, partitions=1, config={"min.insync.replicas": 1})
    with ExitStack() as cleanup:
        def heal():
            for b in c.broker_ids:
                if c._broker(b).paused:
                    c.resume_broker(b)
                if not c.is_running(b):
                    c.start_broker(b)
        cleanup.callback(heal)
        writer = MultiTopicWriter(c.bootstrap_servers, [rep]).start()
        cleanup.callback(writer.stop)
        stop_probe = threading.Event()
        probe = Probe(ProbeConfig(bootstrap_servers=c.bootstrap_servers, events_topic=events, interval_s=1,
                                  refresh_backoff_s=0.5, request_timeout_s=5,
                                  topics_include=f"^{re.escape(rep)}$", groups_include="^$",
                                  cluster="own-e2e", source=unique("probe-own-e2e")))
        probe_thread = threading.Thread(target=probe.run, args=(stop_probe,), name="own-probe", daemon=True)
        probe_thread.start()

        def stop_the_probe():
            stop_probe.set()
            probe_thread.join(30)
            probe.close(flush_timeout=5)
        cleanup.callback(stop_the_probe)

        exporter = Exporter()
        port = exporter.serve(0)
        cleanup.callback(exporter.shutdown)
        # the probe's interval is 1 s here, but a paused broker costs its cycle up to 2 s of
        # observation (observe_wait_s) and up to the request timeout, 5 s, of metadata request:
        # 10 intervals of silence, not 3, as the default 10 s interval leaves 30 s for 15 s
        cfg = JobConfig(bootstrap_servers=c.bootstrap_servers, checkpoint_dir=str(tmp / "ckpt"), events_topic=events,
                        alerts_topic=alerts, trigger_s=1, buckets=2, metrics_port=port,
                        rules={"source": {"silent_factor": 10}, "client": {"metadata_stale_factor": 10}})
        query = start(spark, cfg, exporter, query_name=unique("own-e2e"))
        cleanup.callback(stop_query, query)
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: f'kafka_monitor_partition_in_sync_replicas{{cluster="own-e2e",partition="1",topic="{rep}"}} 3.0'
                 in urllib.request.urlopen(url, timeout=5).read().decode(), timeout=180, interval=0.5,
                 what="the watched topic's ISR on /metrics")
        yield {"cluster": c, "rep": rep, "events": events, "alerts": alerts, "url": url, "query": query,
               "probe": probe}


def leader_of(c, topic: str, partition: int = 0) -> int:
    def led():
        leader = c.partitions(topic)[partition][0]
        return leader if leader > 0 else None
    return wait_for(led, timeout=60, what=f"a leader for {topic}/{partition}")


def registered(c, broker: int):
    """Whether the controller counts ``broker`` as live; None when the asked broker did not
    answer (it may be the paused one)."""
    try:
        return broker in c.live_brokers()
    except Exception:  # noqa: BLE001 - a timeout: ask again
        return None


class Watch:
    """Polls /metrics every half second from its own thread while a fault lasts: every poll must
    answer, and the query must stay up; keeps the largest unreadable-partition count seen."""

    def __init__(self, own):
        self.own, self.polls, self.failures, self.max_unreadable = own, 0, [], 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="own-watch", daemon=True)

    def __enter__(self) -> "Watch":
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                m = metrics(self.own["url"])
                self.polls += 1
                self.max_unreadable = max(self.max_unreadable,
                                          m.get(("kafka_monitor_job_source_unreadable_partitions", ""), 0.0))
            except OSError as e:
                self.failures.append(repr(e))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(10)


def wait_broker_down(own, brokers, timeout: float) -> None:
    """Until BrokerDown is open on /metrics for every broker in ``brokers``, the query up."""
    want = {("BrokerDown", str(b)) for b in brokers}
    try:
        wait_for(lambda: want <= broker_alerts(own["url"]) and own["query"].exception() is None, timeout=timeout,
                 interval=0.5, what=f"BrokerDown for brokers {sorted(brokers)} on /metrics")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{situation(own)}") from None


def situation(own) -> str:
    """What the cluster, the probe and the job show, for a failure's message."""
    c, out = own["cluster"], []
    for topic in (own["events"], own["alerts"], own["rep"]):
        try:
            out.append(f"{topic}: {c.partitions(topic)}")
        except Exception as e:  # noqa: BLE001 - part of the picture
            out.append(f"{topic}: {e!r}")
    if c.managed:  # a broker fenced by a loaded machine (its heartbeats late past the session timeout)
        out.append(f"fencings and long GC pauses: {c.fencings()}")
    em = own["probe"].emitter
    out.append(f"probe: sent {em.sent} dropped {em.dropped} last error {em.last_error} renewals {em.renewals}")
    try:
        out.append(f"broker alerts on /metrics: {sorted(broker_alerts(own['url']))}")
        out.append(f"query exception: {own['query'].exception()}; last progress: "
                   f"{json.dumps(own['query'].lastProgress, default=str)[:1500]}")
    except Exception as e:  # noqa: BLE001
        out.append(repr(e))
    return "\n".join(out)


def wait_broker_back(own, brokers) -> None:
    want = {("BrokerDown", str(b)) for b in brokers}
    wait_for(lambda: not want & broker_alerts(own["url"]), timeout=120, interval=0.5,
             what=f"BrokerDown for {sorted(brokers)} resolved")


def assert_alive(own, batches_before: float, what: str) -> None:
    """The query runs and completes batches again after the fault."""
    def going():
        assert own["query"].exception() is None, own["query"].exception()
        assert own["query"].isActive, "the query stopped"
        return value(own["url"], "kafka_monitor_job_batches_total") >= batches_before + 3
    wait_for(going, timeout=120, interval=0.5, what=f"batches completing after {what}")


@pytest.mark.parametrize("fault", ["pause", "kill"])
def test_the_source_reads_on_when_a_leader_is_paused_or_killed(own, fault):
    """The source's driver calls right after the fault, without Spark: the partitions the broker
    leads are reported unreadable (a paused leader answers nothing, a killed one gets -1001 from
    librdkafka), never as data loss; the others advance in the same call, within one
    offsetsTimeoutMs of waiting; once the leadership has moved, every partition reads again."""
    from confluent_kafka import Producer

    from streaming.read.source import KafkaStreamReader, ReadAllAvailable

    c = own["cluster"]
    topic = unique(f"own.reader-{fault}")
    c.create_topic(topic, partitions=3, config={"min.insync.replicas": 2})
    p = Producer({"bootstrap.servers": c.bootstrap_servers, "acks": "all"})

    def write(n: int) -> None:
        for i in range(n):
            p.produce(topic, b"x", partition=i % 3)
        assert p.flush(60) == 0

    write(30)
    # offsetsTimeoutMs 2000: the call ends (~4 s at most) well before the controller fences the
    # silent broker (broker.session.timeout.ms 8000) and moves its leaderships; with 4000 the
    # metadata could name the new leader within the call, which then read 20 (CI, stop 54)
    reader = KafkaStreamReader({"subscribe": topic, "kafka.bootstrap.servers": c.bootstrap_servers,
                                "offsetsTimeoutMs": "2000"})
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first["offsets"] == {"0": 10, "1": 10, "2": 10}
    write(30)  # acks=all while every broker is in: the other partitions' ends move to 20
    # the leaders as the reader last saw them, just before the fault (a broker a test before this
    # one stopped may still be handing leaderships back)
    def settled():
        e = reader.latestOffset(first, ReadAllAvailable())
        now = {q: v[0] for q, v in c.partitions(topic).items()}
        ok = e["offsets"] == {"0": 20, "1": 20, "2": 20} and reader._leaders == now
        return now if ok and not reader.reportLatestOffset().get("unreadable") else None
    leaders = wait_for(settled, timeout=30, interval=0.5, what="the reader reading every partition from its leader")
    victim = leaders[0]
    led = {str(q) for q, b in leaders.items() if b == victim}
    (c.pause_broker if fault == "pause" else c.kill_broker)(victim)
    try:
        t0 = time.monotonic()
        end = reader.latestOffset(first, ReadAllAvailable())
        took = time.monotonic() - t0
        report = reader.reportLatestOffset()
        assert set(report.get("unreadable", {})) == led, report
        assert {q: o for q, o in end["offsets"].items() if q in led} == {q: 10 for q in led}, end
        assert {q: o for q, o in end["offsets"].items() if q not in led} == {q: 20 for q in "012" if q not in led}
        # half a timeout for metadata (its broker may be the silent one), one for the offsets
        assert took < 2 * 1.5 + 2, f"latestOffset took {took:.1f}s with offsetsTimeoutMs 2000"

        def moved():
            e = reader.latestOffset(first, ReadAllAvailable())
            return e if not reader.reportLatestOffset().get("unreadable") else None
        end = wait_for(moved, timeout=60, interval=0.5, what="every partition readable after the leadership moved")
        assert end["offsets"] == {"0": 20, "1": 20, "2": 20}
    finally:
        (c.resume_broker if fault == "pause" else c.start_broker)(victim)
        reader.stop()
        p.flush(10)
    print(f"\n{fault} of leader {victim} of partitions {sorted(led)}: first call {took:.1f}s, "
          f"reason {report['unreadable']}")


def test_a_killed_leader_of_the_events_topic_does_not_end_the_job(own):
    c = own["cluster"]
    victim = leader_of(c, own["events"])
    t0 = time.monotonic()
    with Watch(own) as w:
        c.kill_broker(victim)
        try:
            wait_broker_down(own, [victim], timeout=90)
            seen = time.monotonic() - t0
            batches = value(own["url"], "kafka_monitor_job_batches_total")
        finally:
            c.start_broker(victim)
        assert_alive(own, batches, f"broker {victim} was killed")
        wait_broker_back(own, [victim])
    print(f"\nkilled broker {victim} (led {own['events']}/0): BrokerDown on /metrics after {seen:.1f}s; "
          f"{w.polls} polls of /metrics, {len(w.failures)} failed; at most {w.max_unreadable:.0f} events "
          f"partition(s) unreadable")
    assert not w.failures, w.failures[:3]


def test_a_paused_leader_of_the_events_topic_delays_the_job_and_is_reported(own):
    c = own["cluster"]
    victim = leader_of(c, own["events"])
    with Watch(own) as w:
        batches = value(own["url"], "kafka_monitor_job_batches_total")
        c.pause_broker(victim)
        try:
            # fenced after the session timeout (8 s here): its partitions move, the job reads on.
            # (Whether the probe raises BrokerDown for a paused broker is the probe's part of
            # issue 33, still open: it did not within 90 s in one CI run; not asserted here.)
            wait_for(lambda: registered(c, victim) is False, timeout=60, interval=0.5,
                     what=f"the controller to fence the paused broker {victim}")
            assert_alive(own, batches, f"broker {victim} was paused")
        finally:
            c.resume_broker(victim)
        batches = value(own["url"], "kafka_monitor_job_batches_total")
        assert_alive(own, batches, f"broker {victim} was resumed")
        wait_for(lambda: registered(c, victim) is True, timeout=120, interval=0.5,
                 what=f"the resumed broker {victim} registered again")
    print(f"\npaused broker {victim}: {w.polls} polls of /metrics, {len(w.failures)} failed; at most "
          f"{w.max_unreadable:.0f} events partition(s) unreadable")
    assert not w.failures, w.failures[:3]
    # whether a trigger fell in the seconds before the fencing (and so reported a partition
    # unreadable) is timing; the reader test below makes sure it is reported when one does
    assert value(own["url"], "kafka_monitor_job_source_unreadable_partitions") == 0


def test_a_stopped_leader_of_the_alerts_topic_delays_publishing_and_loses_nothing(own):
    c = own["cluster"]
    victim = leader_of(c, own["alerts"])
    with Watch(own) as w:
        c.stop_broker(victim)  # its partitions' alerts (IsrShrink, UnderReplicated, ...) open now
        try:
            wait_broker_down(own, [victim], timeout=90)
            batches = value(own["url"], "kafka_monitor_job_batches_total")
        finally:
            c.start_broker(victim)
        assert_alive(own, batches, f"broker {victim} was stopped")
        wait_broker_back(own, [victim])
    assert not w.failures, w.failures[:3]


def test_a_job_starting_while_the_alerts_leader_is_paused_reads_the_topic_back(own):
    """What a restarted job does first: read the alerts topic's tail back (which transitions are
    already there).  With the topic's leader paused its requests time out; the read is retried
    until the leadership has moved, and finds what the running job published."""
    from streaming.sinks.alerts import AlertsTopicSink

    c = own["cluster"]
    wait_for(lambda: read_alerts(c.bootstrap_servers, own["alerts"]), timeout=60, interval=1,
             what="a transition on the alerts topic")
    victim = leader_of(c, own["alerts"])
    # the running job's query id: what its restart on the checkpoint would look for
    sink = AlertsTopicSink({"bootstrap.servers": c.bootstrap_servers}, own["alerts"], recover_timeout_s=90,
                           query_id=str(own["query"].id))
    c.pause_broker(victim)
    try:
        t0 = time.monotonic()
        sink.recover()
        took = time.monotonic() - t0
    finally:
        c.resume_broker(victim)
        sink.close()
        c.wait_ready(120, brokers=[victim])  # fenced while paused: registered again before the next test
    last = sink.last_published()
    assert last is not None and last[1], "nothing read back"
    print(f"\nread the alerts topic back in {took:.1f}s with its leader {victim} paused "
          f"(last batch {last[0]})")
    assert own["query"].exception() is None, own["query"].exception()


def test_two_brokers_down_the_job_reads_and_publishes_from_the_last_one(own):
    """Two of three brokers stopped: the watched topic is under its min ISR (2), the monitor's
    topics (min ISR 1, as the README says) go on from the remaining broker."""
    c, rep = own["cluster"], own["rep"]
    # the last broker can lead only the partitions whose ISR it is in: a broker restarted by an
    # earlier test may still be catching up, and a partition whose ISR is the two stopped ones
    # stays offline (no unclean election), its events undeliverable -- wait until all are in sync
    for topic in (own["events"], own["alerts"], rep):
        wait_for(lambda t=topic: in_sync(c, t), timeout=120, interval=0.5, what=f"{topic} fully in sync")
    down = [b for b in c.broker_ids if b != leader_of(c, own["alerts"])][:2]
    with Watch(own) as w:
        for b in down:
            c.stop_broker(b)
        try:
            wait_broker_down(own, down, timeout=120)
            wait_for(lambda: any(ln.startswith("kafka_monitor_alert_active{") and 'alert="UnderMinIsr"' in ln
                                 and f'topic="{rep}"' in ln
                                 for ln in urllib.request.urlopen(own["url"], timeout=5).read().decode().splitlines()),
                     timeout=60, interval=0.5, what=f"UnderMinIsr on {rep} on /metrics")
            batches = value(own["url"], "kafka_monitor_job_batches_total")
            assert_alive(own, batches, f"brokers {down} were stopped")
        finally:
            for b in down:  # both launched before either is waited for: one late does not leave two down
                c.start_broker(b, wait=False)
            c.wait_ready(180, brokers=down)
        wait_broker_back(own, down)
    assert not w.failures, w.failures[:3]


def test_partitions_added_to_the_events_topic_are_read(own):
    """The job reads partitions added while it runs.  (The probe's producer writes to them only
    after its next topic metadata refresh, librdkafka's topic.metadata.refresh.interval.ms,
    5 minutes by default; so the test writes one record to each itself: not an event, it is
    quarantined, which shows it was read.)"""
    from confluent_kafka import Producer

    c, events = own["cluster"], own["events"]
    c.add_partitions(events, 5)
    p = Producer({"bootstrap.servers": c.bootstrap_servers})
    for q in (3, 4):
        p.produce(events, key=b"test", value=b"{}", partition=q)
    assert p.flush(30) == 0

    def read_new() -> bool:
        assert own["query"].exception() is None, own["query"].exception()
        for prog in own["query"].recentProgress:
            for src in prog.get("sources", []):
                end = json.loads(src["endOffset"]) if isinstance(src.get("endOffset"), str) else src.get("endOffset")
                if end and all(end.get("offsets", {}).get(str(q), 0) >= 1 for q in (3, 4)):
                    return True
        return False
    wait_for(read_new, timeout=120, interval=1, what=f"the records of the partitions added to {events} read")


def heartbeat_partition(own) -> int:
    """The events partition the probe's latest heartbeat was written to, read from the topic."""
    from confluent_kafka import Consumer, TopicPartition

    c, events, source = own["cluster"], own["events"], own["probe"].cfg.source
    con = Consumer({"bootstrap.servers": c.bootstrap_servers, "group.id": unique("hb-find"),
                    "enable.auto.commit": False})
    try:
        parts = con.list_topics(events, timeout=10).topics[events].partitions
        tps = []
        for q in parts:
            lo, hi = watermarks(con, TopicPartition(events, q))
            tps.append(TopicPartition(events, q, max(lo, hi - 200)))
        con.assign(tps)
        deadline, found = time.monotonic() + 30, {}
        while time.monotonic() < deadline and not found:
            for m in con.consume(500, timeout=1):
                if m.error() is None and b'"type":"heartbeat"' in m.value() and source.encode() in m.value():
                    found[m.partition()] = m.offset()
        assert found, f"no heartbeat of {source} in {events}"
        return max(found)
    finally:
        con.close()


def test_a_paused_leader_of_the_heartbeats_partition_does_not_silence_the_probe(own):
    """The probe's heartbeats (and metadata refreshes) share one key, hence one partition.  With
    its leader paused they wait there until the broker is fenced (8 s here) and their requests
    time out (SourceSilent and MetadataStale open after 10 intervals, 10 s here).  Each also goes
    to another partition, one that delivers, so neither opens; and no metadata refresh fails."""
    c, probe = own["cluster"], own["probe"]
    # the earlier faults of this module can leave every events partition led by one broker, and
    # then no partition delivers while it is paused (seen in CI: SourceSilent opened with the
    # copies waiting on the paused broker too): leaders back to their preferred replicas first
    parts = range(len(c.partitions(own["events"])))
    c.elect_leaders("preferred", [(own["events"], p) for p in parts])
    q = heartbeat_partition(own)
    wait_for(lambda: len({leader_of(c, own["events"], p) for p in parts}) > 1, timeout=60, interval=0.5,
             what=f"{own['events']}'s partitions led by more than one broker")
    victim = leader_of(c, own["events"], q)

    def opened(alert: str) -> float:
        return metrics(own["url"]).get(("kafka_monitor_alert_transitions_total",
                                        f'{{action="open",alert="{alert}"}}'), 0.0)
    before = {a: opened(a) for a in ("SourceSilent", "MetadataStale")}
    copies = getattr(probe._emitter, "copies", 0)
    retries, failures = probe.refresh_retries, probe.refresh_failures
    t_pause = int(time.time() * 1000)
    c.pause_broker(victim)
    try:
        wait_for(lambda: registered(c, victim) is False, timeout=60, interval=0.5,
                 what=f"the controller to fence the paused broker {victim}")
        wait_for(lambda: leader_of(c, own["events"], q) != victim, timeout=60, interval=0.5,
                 what=f"{own['events']}/{q} led by another broker")
        batches = value(own["url"], "kafka_monitor_job_batches_total")
        assert_alive(own, batches, f"broker {victim} was paused")
    finally:
        c.resume_broker(victim)
        t_resume = int(time.time() * 1000)
    assert_alive(own, value(own["url"], "kafka_monitor_job_batches_total"), f"broker {victim} was resumed")
    after = {a: opened(a) for a in before}
    copies = getattr(probe._emitter, "copies", 0) - copies
    print(f"\npaused broker {victim} (led the heartbeats' partition {q}): "
          f"{copies} liveness events also sent to another partition; metadata requests sent again "
          f"{probe.refresh_retries - retries}, failed {probe.refresh_failures - failures}; openings "
          f"before {before}, after {after}")
    if after != before:  # what opened, for the failure report
        for a in read_alerts(c.bootstrap_servers, own["alerts"]):
            if a["alert"] in ("SourceSilent", "MetadataStale"):
                print(json.dumps(a)[:900])
        print(f"paused at {t_pause}, resumed at {t_resume}")
    assert after == before
    # a metadata request the paused broker held was sent again through a new client, which does not ask it
    assert probe.refresh_failures == failures


def test_every_transition_the_job_decided_is_on_its_alerts_topic_once(own):
    def counted() -> int:
        return int(sum(v for (name, _), v in metrics(own["url"]).items()
                       if name == "kafka_monitor_alert_transitions_total"))

    def settled():
        before = counted()
        records = read_alerts(own["cluster"].bootstrap_servers, own["alerts"])
        return records if len(records) >= before == counted() else None
    records = wait_for(settled, timeout=60, interval=1, what="the alerts topic to hold the counted transitions")
    keys = [(a["alert_id"], a["action"], a["at"]) for a in records]
    assert len(keys) == len(set(keys)), "a transition appears twice"
    assert len(records) == counted(), (len(records), counted())
    kinds = sorted({a["alert"] for a in records})
    print(f"\n{len(records)} transitions on the alerts topic, as many as the job counted: {kinds}")
    assert "BrokerDown" in kinds
