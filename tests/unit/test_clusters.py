"""Two clusters watched by one job (issue 34): the same topic, partition, group and probe name
in both stay two entities, from the probe's events through the parser, the state function and
the exporter.  Events are built with the contract and parsed as the job parses them; every
entity is put in one bucket, the worst case for keeping them apart."""

from __future__ import annotations


from monitor.contract import BrokerState, Event, Heartbeat, PartitionGone, PartitionMetadata, PartitionOffsets
from streaming.rules.source import SourceRulesConfig
from streaming.state import function as st
from tests.support.state_fakes import EventsJob

SOURCE = "probe-host"  # the default source name is per host: two probes on one host share it


class Job(EventsJob):
    """One bucket of the state function and an exporter, fed contract events batch by batch."""

    def __init__(self, cfg: st.StateConfig | None = None):
        super().__init__(cfg or st.StateConfig(run_id="r"))
        self.seq: dict[str, int] = {}

    def event(self, data, cluster: str, t: int) -> bytes:
        seq = self.seq[cluster] = self.seq.get(cluster, 0) + 1
        return Event.of(data, cluster=cluster, source=SOURCE, seq=seq, observed_at=t).to_json()

    def open_alerts(self) -> set[tuple[str, str]]:
        """(alert, cluster) of every kafka_monitor_alert_active series."""
        return {(s.labels["alert"], s.labels["cluster"]) for fam in self.exporter.registry.collect()
                if fam.name == "kafka_monitor_alert_active" for s in fam.samples}


def partition(job: Job, cluster: str, t: int, isr: list[int], hw: int, leader: int = 1) -> list[bytes]:
    return [job.event(PartitionMetadata(topic="orders", partition=0, leader=leader, leader_epoch=1,
                                        replicas=[1, 2, 3], isr=isr, offline_replicas=[], metadata_version=1),
                      cluster, t),
            job.event(PartitionOffsets(topic="orders", partition=0, high_watermark=hw, log_start_offset=0,
                                       via="list_offsets"), cluster, t + 1)]


def test_the_same_partition_in_two_clusters_is_two_entities_with_their_own_gauges_and_alerts():
    job = Job()
    job.batch(*partition(job, "east", 1000, [1, 2, 3], 100), *partition(job, "west", 1000, [1, 2, 3], 7))
    assert job.value("job_state_entities", kind="partition") == 2
    assert job.value("partition_high_watermark", cluster="east", topic="orders", partition="0") == 100
    assert job.value("partition_high_watermark", cluster="west", topic="orders", partition="0") == 7

    # east's follower 3 leaves the ISR: east's alerts only, west's gauges untouched
    job.batch(*partition(job, "east", 2000, [1, 2], 110), *partition(job, "west", 2000, [1, 2, 3], 8))
    assert job.open_alerts() == {("IsrShrink", "east"), ("UnderReplicated", "east")}
    assert job.value("partition_in_sync_replicas", cluster="east", topic="orders", partition="0") == 2
    assert job.value("partition_in_sync_replicas", cluster="west", topic="orders", partition="0") == 3

    # then west's follower 2: an episode of its own, with its own alert id
    job.batch(*partition(job, "west", 3000, [1, 3], 9))
    assert job.open_alerts() == {(a, c) for a in ("IsrShrink", "UnderReplicated") for c in ("east", "west")}
    shrinks = {t["cluster"]: t["alert_id"] for t in job.transitions if t["alert"] == "IsrShrink"}
    assert set(shrinks) == {"east", "west"} and shrinks["east"] != shrinks["west"]

    # east's topic deleted: east's series and alerts go, west's stay
    job.batch(job.event(PartitionGone(topic="orders", partition=0), "east", 4000))
    assert job.value("partition_high_watermark", cluster="east", topic="orders", partition="0") is None
    assert job.value("partition_high_watermark", cluster="west", topic="orders", partition="0") == 9
    assert job.open_alerts() == {("IsrShrink", "west"), ("UnderReplicated", "west")}
    assert job.value("job_state_entities", kind="partition") == 1
    resolved = [t for t in job.transitions if t["action"] == "resolve"]
    assert {t["cluster"] for t in resolved} == {"east"}


def test_brokers_with_the_same_id_in_two_clusters_are_two_entities():
    job = Job()

    def broker(cluster: str, t: int, registered: bool) -> bytes:
        return job.event(BrokerState(node_id=2, registered=registered, metadata_version=1, leader_partitions=1,
                                     replica_partitions=3, out_of_sync_replicas=0), cluster, t)
    job.batch(broker("east", 1000, True), broker("west", 1000, True))
    job.batch(broker("east", 2000, False), broker("west", 2000, True))
    assert job.open_alerts() == {("BrokerDown", "east")}
    assert job.value("broker_registered", cluster="east", broker="2") == 0
    assert job.value("broker_registered", cluster="west", broker="2") == 1


def test_a_probe_that_stops_is_silent_in_its_cluster_only():
    """Two probes with the same source name, one per cluster, heartbeat every second; east's
    stops.  SourceSilent opens for east once west's heartbeats in the same bucket carry the
    job's clock past east's limit, and for west only when nothing arrives at all; each stamped
    at the moment its own limit passed."""
    job = Job(st.StateConfig(run_id="r", source=SourceRulesConfig(silent_factor=3, silence_grace_ms=0)))

    def beat(cluster: str, t: int) -> bytes:
        return job.event(Heartbeat(interval_ms=1000, events_sent=t // 1000, events_dropped=0, started_at=0),
                         cluster, t)
    job.batch(*[beat(c, t) for t in (1000, 2000) for c in ("east", "west")])
    job.batch(*[beat("west", t) for t in (3000, 4000, 5000)])
    assert job.open_alerts() == set()  # east last heard at 2000: silent after 5000
    job.batch(beat("west", 6000))
    assert job.open_alerts() == {("SourceSilent", "east")}
    job.timeout(60_000)  # no events at all: the processing time decides, west is silent too now
    assert job.open_alerts() == {("SourceSilent", "east"), ("SourceSilent", "west")}
    opened = {t["cluster"]: t["at"] for t in job.transitions if t["alert"] == "SourceSilent"}
    assert opened == {"east": 2000 + 3000 + 1, "west": 6000 + 3000 + 1}
    assert job.value("source_last_heartbeat_timestamp_seconds", cluster="east", source=SOURCE) == 2.0
    assert job.value("source_last_heartbeat_timestamp_seconds", cluster="west", source=SOURCE) == 6.0
