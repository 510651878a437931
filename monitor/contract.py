"""The event contract (v1, v2 and v3): the only coupling between the probe and the streaming job.

One event per Kafka record (a v3 record: several, below), UTF-8 JSON, record key = the entity
key, or for a partition's types its topic's (``record_key``): one entity's events stay ordered in
one partition of the events topic.  Every event carries the envelope
(``schema``, ``type``, ``event_id``, ``cluster``, ``source``, ``seq``, ``observed_at``) and a
type-specific ``data`` object.

The payload classes below are the single source of truth: the JSON Schema shipped in
``docs/event-schema.json``, the reference in ``docs/events.md`` and the Spark schema the job
parses with are all generated from them (``kafka-monitor schema``).

Compatibility rules: readers accept and ignore unknown extra fields; a new required field or a
changed meaning is a new ``schema`` version, and readers keep reading the old one.  v2 adds the
``quorum_state``, ``log_dirs`` and ``transactions`` types and the eligible leader replicas of
``partition_metadata`` (a v1 reader quarantines them as ``unknown_schema`` and reads every other
event: upgrade the job before the probes); the other types are still sent as v1
(``SCHEMA_OF_TYPE``), and a v1 ``partition_metadata`` still reads (its ELR null: not known).

v3 adds one optional envelope field, ``rows``: one record then stands for several events of its
type, observed together.  ``data`` is the first event's payload; ``rows`` names the payload
fields whose value differs between the events, each with its list of values, one per event (the
first event's included), all lists of one length, 1 to ``MAX_ROWS_PER_RECORD``.  Event k's payload
is ``data`` with each field of ``rows`` set to its k-th value; the envelope is shared.  A topic's
``partition_offsets`` in one record lists ``partition`` and ``high_watermark`` once each: the
envelope, the field names and the topic are written and decoded once, not once per partition.
A probe sends the types of ``ROWS_KEY_OF_TYPE`` this way: the rows of a cycle that share its
fields (a topic) in one record, keyed by the cluster and those fields, up to 1,000 rows and 32 KiB
a record; a topic with one partition goes as a plain event under the same key (``KEY_OF_TYPE``:
so do ``partition_gone`` and ``group_partition_gone``).  A v1/v2 reader quarantines a
v3 record as ``unknown_schema``: upgrade the job before the probes.

Sentinels are explicit: an offset that Kafka reports as -1 / -1001 ("none") is ``null`` here,
never a negative number; ``leader = -1`` means "no leader" (an offline partition) because that
is what a MetadataResponse says and the job alerts on it.

Limits: the streaming job quarantines (with the reason in brackets) a record longer than 64 KiB
(``oversized``; the job's ``max_event_bytes``), an identifier (``event_id``, ``cluster``,
``source``, ``topic``, ``group``, ``member_id``, a group's ``state``, a phase or reason) longer
than 1,024 characters (``field_too_long``), an integer beyond +-(2^53 - 1) (``out_of_range``),
and an ``observed_at`` more than 5 minutes after or before the Kafka timestamp of its record
(``event_time_ahead`` / ``event_time_behind``; the job's ``max_clock_skew_s``).  Free text
(``error``, ``cause``) is cut to 1,024 characters.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

SCHEMA_V1 = "kafka-monitor/v1"
SCHEMA_V2 = "kafka-monitor/v2"
SCHEMA_V3 = "kafka-monitor/v3"
SUPPORTED_SCHEMAS = (SCHEMA_V1, SCHEMA_V2, SCHEMA_V3)
#: events one v3 record may stand for (its ``rows``' length)
MAX_ROWS_PER_RECORD = 10_000

#: Kafka's "no offset" sentinels (OFFSET_INVALID = -1001, and -1 from ListOffsets / OffsetFetch).
KAFKA_OFFSET_SENTINELS = frozenset({-1, -1001})
#: leader id in a MetadataResponse for a partition without a leader.
NO_LEADER = -1
#: the events whose absence reads as the source's silence (SourceSilent, MetadataStale; an HA
#: group's, ShardUnobserved): a source sends each twice, on its key's partition and on another
#: (monitor/emitter.py)
LIVENESS_TYPES = frozenset({"heartbeat", "metadata_refresh", "ha_member"})


class ContractError(ValueError):
    """An event that does not satisfy the contract.  ``reason`` is short and stable
    (it becomes a metric label); ``detail`` says what exactly is wrong."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _doc(text: str, **kw: Any) -> Any:
    return field(metadata={"doc": text}, **kw)


# ---------------------------------------------------------------------------------------------
# Payloads
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Broker:
    node_id: int = _doc("Broker id.")
    host: str = _doc("Advertised host.")
    port: int = _doc("Advertised port.")
    rack: Optional[str] = _doc("Rack, when the broker reports one.", default=None)


@dataclass(frozen=True)
class PartitionCountChange:
    topic: str = _doc("Topic whose partition count changed.")
    old_count: int = _doc("Partitions in the client's previous metadata.")
    new_count: int = _doc("Partitions in this refresh.")
    unseen_for_at_most_ms: Optional[int] = _doc(
        "Time since the client's previous successful refresh: the change happened at most this long before "
        "the client saw it (how stale this client's partitioning was).", default=None)


@dataclass(frozen=True)
class MetadataRefresh:
    """One metadata refresh attempt by a client (successful or not)."""

    version: int = _doc("Metadata version after this attempt (bumped on every successful update).")
    reason: str = _doc("Why the refresh ran: bootstrap, periodic, invalidated or new_topic.")
    ok: bool = _doc("Whether the refresh succeeded.")
    duration_ms: Optional[float] = _doc("How long the request took, in milliseconds; null when unknown "
                                        "(an instrumented client's statistics only tell that it happened).")
    cause: Optional[str] = _doc("For invalidated refreshes: what invalidated the metadata.", default=None)
    error: Optional[str] = _doc("Error text when ok is false.", default=None)
    node_id: Optional[int] = _doc("Broker that answered, when known.", default=None)
    controller_id: Optional[int] = _doc("Active controller's id; null: a KRaft cluster's metadata names a random "
                                        "broker instead, so the probe reports none rather than a wrong one.",
                                        default=None)
    brokers: list[Broker] = _doc("Brokers in the response.", default_factory=list)
    topic_count: int = _doc("Topics in the response.", default=0)
    partition_count: int = _doc("Partitions in the response.", default=0)
    partition_count_changes: list[PartitionCountChange] = _doc(
        "Topics whose partition count differs from the client's previous metadata.", default_factory=list)
    leaderless_partitions: int = _doc("Partitions without a leader in the response.", default=0)
    metadata_max_age_ms: Optional[int] = _doc(
        "The client's periodic refresh interval (metadata.max.age.ms): MetadataStale fires after twice this "
        "without a successful refresh.", default=None)
    ha_group: Optional[str] = _doc(
        "A probe's HA group (--ha-group): MetadataStale is then raised only while it still tries to refresh (a "
        "member that stopped is the group's to judge). Null otherwise.", default=None)


@dataclass(frozen=True)
class PartitionMetadata:
    """One partition as one metadata refresh saw it.  A probe sends it when the partition's view
    changed since it last sent one, and at least every ``metadata_snapshot_s`` (60 s); in between,
    its partition_offsets' ``metadata_at`` says the view still holds."""

    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition index.")
    leader: int = _doc("Leader broker id; -1 when the partition has no leader (offline).")
    replicas: list[int] = _doc("Replica broker ids, preferred leader first.")
    isr: list[int] = _doc("In-sync replica broker ids.")
    metadata_version: int = _doc("Version of the client's metadata this came from.")
    leader_epoch: Optional[int] = _doc(
        "The leader's epoch as its last answer to ListOffsets said; null until a refresh after it "
        "answered (at start, and for one refresh after the leader changed), and where it answers "
        "without one (offsets_via fetch, librdkafka's mock cluster).", default=None)
    offline_replicas: list[int] = _doc("Replicas on offline log dirs or brokers.", default_factory=list)
    min_insync_replicas: Optional[int] = _doc("The topic's min.insync.replicas, when known.", default=None)
    error: Optional[str] = _doc("Partition-level error code name from the response, if any.", default=None)
    eligible_leader_replicas: Optional[list[int]] = _doc(
        "v2. Eligible leader replicas (KIP-966): replicas out of the ISR that hold every committed record and "
        "may still be elected without data loss (kept while the ISR is below min.insync.replicas). null: not "
        "known -- the cluster's eligible.leader.replicas.version is not finalized (Kafka before 4.1, or off), "
        "the probe's DescribeTopicPartitions has not yet answered for this ISR, or a v1 probe.", default=None)
    last_known_elr: Optional[list[int]] = _doc(
        "v2. Last-known eligible leader replicas: ELR members that were shut down uncleanly, the last resort "
        "before an unclean election. null as for eligible_leader_replicas.", default=None)


@dataclass(frozen=True)
class PartitionOffsets:
    """A partition's offsets, as a fetch response or ListOffsets returned them."""

    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition index.")
    high_watermark: int = _doc("High watermark: offset of the next record to be committed to the log.")
    via: str = _doc("Where the offsets came from: fetch (a fetch response) or list_offsets.")
    log_start_offset: Optional[int] = _doc(
        "First offset still in the log, when known. A probe reading ListOffsets asks it every "
        "log_start_interval_s (60 s by default; it moves only when segments are deleted) and sends the "
        "last answer in between.", default=None)
    last_stable_offset: Optional[int] = _doc("Last stable offset (transactions), when known.", default=None)
    metadata_at: Optional[int] = _doc(
        "When the source's metadata last confirmed this partition's leader, replicas and ISR (epoch ms of "
        "its last successful refresh that listed it). A source sends partition_metadata only when that view "
        "changes (and at least every metadata_snapshot_s), so this tells the job the view it holds is current.",
        default=None)


@dataclass(frozen=True)
class GroupOffsets:
    """A group's committed offset for one partition, with the partition's HW observed together."""

    group: str = _doc("Consumer group id.")
    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition index.")
    committed_offset: Optional[int] = _doc("Committed offset; null when the group has committed nothing here.")
    high_watermark: Optional[int] = _doc("The partition's HW observed with the commit (null when unknown).")
    hw_observed_at: Optional[int] = _doc("When that HW was observed (epoch ms).", default=None)
    member_id: Optional[str] = _doc("Owning member id, when known.", default=None)
    client_id: Optional[str] = _doc("Owning member's client id, when known.", default=None)
    host: Optional[str] = _doc("Owning member's host, when known.", default=None)
    last_stable_offset: Optional[int] = _doc(
        "The partition's last stable offset observed with the HW (ListOffsets with read_committed "
        "isolation): what a read_committed consumer can read up to; null when unknown.", default=None)
    held_by_transaction: Optional[str] = _doc(
        "When the committed offset is the last stable offset and that is below the HW (a read_committed consumer "
        "waiting on an open transaction): the transactional id of the transaction whose first record on the "
        "partition is at the LSO, as the probe's last transactions answer has it (cut to 1,024 characters); null "
        "otherwise or when not known (transactions not asked by this probe, or the transaction not described).",
        default=None)
    held_by_producer: Optional[int] = _doc(
        "That transaction's producer id (known also when its transactional id is not); null as above.", default=None)


@dataclass(frozen=True)
class GroupMember:
    member_id: str = _doc("Member id assigned by the coordinator.")
    client_id: Optional[str] = _doc("Client id.", default=None)
    host: Optional[str] = _doc("Client host.", default=None)
    assignment: list[str] = _doc("Assigned partitions as 'topic/partition'.", default_factory=list)


@dataclass(frozen=True)
class GroupState:
    """A consumer group as its coordinator describes it."""

    group: str = _doc("Consumer group id.")
    state: str = _doc("Empty, PreparingRebalance, CompletingRebalance, Stable, Dead (classic protocol), "
                      "Assigning, Reconciling (consumer protocol, KIP-848) or Unknown.")
    protocol: Optional[str] = _doc("Group protocol: classic, consumer (KIP-848) or simple (offsets only, "
                                   "no members).", default=None)
    assignor: Optional[str] = _doc("Partition assignor chosen for the generation.", default=None)
    coordinator: Optional[int] = _doc("Coordinator broker id.", default=None)
    generation: Optional[int] = _doc("Generation id, where the broker reports it.", default=None)
    members: list[GroupMember] = _doc("Members and their assignment.", default_factory=list)


@dataclass(frozen=True)
class Rebalance:
    """One phase of the rebalance protocol as an instrumented member lived it."""

    group: str = _doc("Consumer group id.")
    phase: str = _doc("join_started, assigned, revoked, lost or failed.")
    member_id: Optional[str] = _doc("Member id.", default=None)
    client_id: Optional[str] = _doc("Client id.", default=None)
    generation: Optional[int] = _doc("Generation id.", default=None)
    partitions: list[str] = _doc("Partitions concerned, as 'topic/partition'.", default_factory=list)
    reason: Optional[str] = _doc("Why the phase happened, when known.", default=None)
    duration_ms: Optional[float] = _doc("Duration of the phase in milliseconds.", default=None)


@dataclass(frozen=True)
class ClientFetch:
    """One partition as an instrumented consumer's statistics report it."""

    group: str = _doc("Consumer group id.")
    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition index.")
    fetch_state: Optional[str] = _doc("librdkafka fetch state (active, stopped, offset-query, ...).", default=None)
    position: Optional[int] = _doc("Offset of the next record the application will get (librdkafka's "
                                   "app_offset; the fetcher may be further ahead).", default=None)
    committed: Optional[int] = _doc("Last committed offset.", default=None)
    high_watermark: Optional[int] = _doc("HW from the last fetch response.", default=None)
    last_stable_offset: Optional[int] = _doc("LSO from the last fetch response.", default=None)
    log_start_offset: Optional[int] = _doc("Log start offset.", default=None)
    consumer_lag: Optional[int] = _doc("HW - committed, as the client computes it.", default=None)
    leader: Optional[int] = _doc("Leader broker id the client uses.", default=None)
    leader_epoch: Optional[int] = _doc("Leader epoch the client uses.", default=None)


@dataclass(frozen=True)
class DeliveryErrorCount:
    code: str = _doc("librdkafka's error name in a write's delivery report (e.g. NOT_ENOUGH_REPLICAS, "
                     "_MSG_TIMED_OUT).")
    count: int = _doc("Writes that failed with it.")


@dataclass(frozen=True)
class ClientProduce:
    """One partition an instrumented producer writes to, as its statistics report it; the
    leader's request figures are those of the broker that leads the partition for this client."""

    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition index.")
    leader: Optional[int] = _doc("Leader broker id the client writes to; null when unknown.", default=None)
    queued_messages: Optional[int] = _doc("Messages waiting in the client to be sent (librdkafka msgq_cnt + "
                                          "xmit_msgq_cnt).", default=None)
    in_flight_messages: Optional[int] = _doc("Messages sent and not acknowledged yet (msgs_inflight): writes "
                                             "pending on the partition.", default=None)
    sent_messages: Optional[int] = _doc("Messages sent since the client started (txmsgs).", default=None)
    sent_bytes: Optional[int] = _doc("Bytes of those (txbytes).", default=None)
    leader_rtt_avg_ms: Optional[float] = _doc("Mean request round trip to the leader over the last statistics "
                                              "interval (librdkafka rtt), ms; null when no request.", default=None)
    leader_rtt_p99_ms: Optional[float] = _doc("99th percentile of that, ms.", default=None)
    leader_queue_latency_p99_ms: Optional[float] = _doc(
        "99th percentile of the time requests to the leader waited in the client before being sent "
        "(librdkafka int_latency), ms.", default=None)
    leader_request_errors: Optional[int] = _doc("Requests to the leader that failed since the client started "
                                                "(txerrs).", default=None)
    leader_request_retries: Optional[int] = _doc("Requests to the leader sent again (txretries).", default=None)
    leader_request_timeouts: Optional[int] = _doc("Requests to the leader that timed out (req_timeouts).",
                                                  default=None)
    delivered_messages: Optional[int] = _doc(
        "Writes the application got a successful delivery report for, since the client started.  Null: its "
        "delivery reports do not go through the instrumentation (a plain Producer whose produce() calls pass "
        "their own callback; InstrumentedProducer sees them all).", default=None)
    delivery_errors: list[DeliveryErrorCount] = _doc(
        "Failed writes by error code, from the delivery reports (what the application saw after librdkafka's "
        "retries), since the client started.", default_factory=list)
    delivery_latency_counts: Optional[list[int]] = _doc(
        "Delivered writes by time from produce() to acknowledgement (librdkafka's message latency): counts per "
        "bucket of CANARY_LATENCY_BOUNDS_MS, the last bucket counting the rest; cumulative.", default=None)
    delivery_latency_sum_ms: Optional[float] = _doc("Sum of those times, ms.", default=None)


@dataclass(frozen=True)
class BrokerState:
    """One broker as one metadata refresh of a probe shows it, over every partition in the
    response (not only the watched topics).  Sent by an unshared probe, or by share 1 of n."""

    node_id: int = _doc("Broker id.")
    registered: bool = _doc("Listed among the response's brokers: registered and unfenced in the KRaft quorum "
                            "(a fenced or stopped broker is not listed; which of the two is not told).")
    metadata_version: int = _doc("Version of the client's metadata this came from.")
    leader_partitions: int = _doc("Partitions it leads.")
    replica_partitions: int = _doc("Partitions with a replica on it.")
    out_of_sync_replicas: int = _doc("Of those, the partitions whose ISR does not include it.")
    host: Optional[str] = _doc("Advertised host, when registered.", default=None)
    port: Optional[int] = _doc("Advertised port, when registered.", default=None)
    rack: Optional[str] = _doc("Rack, when registered and it reports one.", default=None)
    is_controller: Optional[bool] = _doc("Whether it is the active controller; null: unknown (a KRaft cluster's "
                                         "metadata names a random broker, see metadata_refresh.controller_id).",
                                         default=None)
    writes_waiting_since: Optional[int] = _doc(
        "When the canary's acks=all writes started waiting for this broker (epoch ms): it is a follower in the ISR "
        "of every canary partition whose oldest write has waited 2 s or more for its ack while the partition's "
        "leader answers (the canary's consumer hears from it), so it holds those partitions' high watermark.  Null: no such wait, no single "
        "broker explains it, or no canary runs.", default=None)
    writes_waiting_partitions: Optional[int] = _doc(
        "How many canary partitions wait for it (with writes_waiting_since).", default=None)


#: upper bounds (ms) of the canary's latency histogram buckets; a last bucket counts the rest.
#: Changing them is a new schema version (a report's bucket counts follow them by position).
CANARY_LATENCY_BOUNDS_MS: tuple[float, ...] = (2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


@dataclass(frozen=True)
class CanaryErrorCount:
    code: str = _doc("librdkafka's error name for a canary write's delivery report (e.g. NOT_ENOUGH_REPLICAS, "
                     "_MSG_TIMED_OUT).")
    count: int = _doc("Writes that failed with it since started_at.")


@dataclass(frozen=True)
class Canary:
    """One partition of the canary topic as the probe's canary sees it: its own acks=all writes
    (sequence-numbered, timestamped) and their reading back.  Counters and histograms are
    cumulative since ``started_at`` (a restarted canary starts from 0), so a report replayed or
    lost changes nothing that the next one does not restate."""

    topic: str = _doc("The canary topic.")
    partition: int = _doc("Partition index.")
    started_at: int = _doc("When this canary started (epoch ms): a change means its counters restarted.")
    leader: Optional[int] = _doc("Leader broker id the canary last saw for the partition; -1 without a leader; "
                                 "null when unknown.")
    sent: int = _doc("Writes sent (acks=all).")
    acked: int = _doc("Writes the leader acknowledged: the whole ISR had them (the HW passed them).")
    received: int = _doc("Writes read back by the canary's consumer (each sequence number once).")
    lost: int = _doc("Acknowledged writes not read back within the canary's loss window (lost_after_ms).")
    duplicated: int = _doc("Writes read back more than once.")
    out_of_order: int = _doc("Writes read back after one with a higher sequence number.")
    pending: int = _doc("Writes sent and not acknowledged yet, at observed_at.")
    oldest_pending_ms: Optional[int] = _doc("Age of the oldest of those at observed_at, ms; null when none.")
    produce_latency_counts: list[int] = _doc(
        "Acknowledged writes by time from send to ack (the replication commit time): one count per bucket of "
        "CANARY_LATENCY_BOUNDS_MS (a value <= the bound), then one for the rest.")
    produce_latency_sum_ms: float = _doc("Sum of those times, ms.")
    e2e_latency_counts: list[int] = _doc(
        "Writes read back by time from send to read (end to end), in the same buckets.")
    e2e_latency_sum_ms: float = _doc("Sum of those times, ms.")
    errors: list[CanaryErrorCount] = _doc("Failed writes by error code.", default_factory=list)
    lost_after_ms: Optional[int] = _doc("How long an acknowledged write may stay unread before it counts as lost.",
                                        default=None)


@dataclass(frozen=True)
class Heartbeat:
    """A source's periodic sign of life; the job raises SourceSilent when these stop."""

    interval_ms: int = _doc("How often this source sends heartbeats.")
    events_sent: int = _doc("Events delivered since the source started.")
    events_dropped: int = _doc("Events dropped since the source started (buffer full, delivery failed).")
    watching: list[str] = _doc("What the source watches (topics, groups or patterns).", default_factory=list)
    started_at: Optional[int] = _doc("When the source started (epoch ms): a change means seq restarted.", default=None)
    cycle_duration_ms: Optional[int] = _doc(
        "How long the source worked on the observation cycle this heartbeat ends, in milliseconds: for a probe, "
        "the metadata refreshes since its previous observation, then the committed offsets, the watermarks and "
        "the events. Above interval_ms the source cannot keep its interval and its observations fall behind. "
        "Null for sources without cycles (instrumented clients).", default=None)
    observation_lag_ms: Optional[int] = _doc(
        "How late that cycle's observation started after the time its schedule set for it, in milliseconds "
        "(near 0 when on time); it grows when cycles overrun the interval. Null when the source keeps no "
        "schedule.", default=None)
    share: Optional[str] = _doc(
        "The source's share of the cluster when several probes split it, \"i/n\" (1 <= i <= n): it watches "
        "the topics whose crc32 of the UTF-8 name modulo n is i-1 (their partitions, and every group's committed "
        "offsets on them) and reports the state of the groups whose crc32 modulo n is i-1, so that every "
        "partition, group partition and group is reported by exactly one of the n probes. Null: the whole "
        "cluster (or not a probe).", default=None)
    unanswered_brokers: Optional[list[int]] = _doc(
        "The brokers that left a request of this cycle's observation unanswered when it stopped waiting (a "
        "probe waits half its interval, at least 2 s, at most its request timeout): the offsets of the partitions "
        "they lead and the groups they coordinate are missing from this cycle. Empty when every broker answered; "
        "null for sources without cycles.", default=None)
    ha_group: Optional[str] = _doc(
        "The HA group the probe belongs to (--ha-group): its silence is then the group's to judge (an "
        "ha_member event of each member says what it holds; SourceSilent names the group when none is left). "
        "Null: a probe on its own, or not a probe.", default=None)


@dataclass(frozen=True)
class HaMember:
    """A probe of an HA group after each observation cycle (contract v2): the shards it holds and
    has claimed, observed in that cycle. The job keeps, per cluster and group, each shard's owner
    and last observation (docs/ha.md)."""

    ha_group: str = _doc("The HA group (--ha-group).")
    shards: int = _doc("The group's shard count (the shard topic's partitions).")
    interval_ms: int = _doc("The probe's observation interval.")
    held: list[int] = _doc("The shards it holds and has claimed, ascending.")
    epochs: list[int] = _doc("Its epoch on each of them (the offset of its claim record), in held's order.")
    watched: list[int] = _doc(
        "How many topics and groups it watched in each of them this cycle, in held's order.")
    handovers: int = _doc("Shard assignments this probe gained or lost since it started.")


@dataclass(frozen=True)
class PartitionGone:
    """A partition the probe no longer finds: its topic deleted (or shrunk, which Kafka does not do)."""

    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition id.")
    reason: str = _doc("Why it is gone: \"topic deleted\" (absent from 2 successive complete metadata "
                       "responses after it was seen).", default="topic deleted")


@dataclass(frozen=True)
class GroupGone:
    """A consumer group the probe no longer finds in the cluster's group listing."""

    group: str = _doc("Consumer group id.")
    reason: str = _doc("Why it is gone: \"group deleted\" (absent from 2 successive complete group "
                       "listings after it was seen).", default="group deleted")


@dataclass(frozen=True)
class GroupPartitionGone:
    """A group's committed offset on a partition that the coordinator no longer returns."""

    group: str = _doc("Consumer group id.")
    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition id.")
    reason: str = _doc("Why it is gone: \"committed offset deleted\" (absent from 2 successive answers of "
                       "the group's coordinator after it was seen; the group itself still exists).",
                       default="committed offset deleted")


@dataclass(frozen=True)
class QuorumReplica:
    """A voter or an observer of the KRaft metadata quorum, as its leader describes it."""

    replica_id: int = _doc("Node id: a controller (voter) or a broker (observer).")
    log_end_offset: Optional[int] = _doc("Its end offset of the metadata log as the leader last heard; null: "
                                         "unknown.", default=None)
    lag: Optional[int] = _doc("Metadata records it is behind the leader's log end offset; null: unknown.",
                              default=None)
    last_fetch_ms_ago: Optional[int] = _doc("Time since it last fetched from the leader, at observed_at (the "
                                            "leader's timestamp against the probe's clock); null: unknown.",
                                            default=None)
    last_caught_up_ms_ago: Optional[int] = _doc(
        "Time since it was last caught up with the leader, at observed_at; null: unknown (never, or a "
        "version that does not say).", default=None)


@dataclass(frozen=True)
class QuorumState:
    """The KRaft controller quorum (the ``__cluster_metadata`` log) as DescribeQuorum answers it,
    asked by a probe on an interval of its own (schema v2)."""

    ok: bool = _doc("Whether the quorum answered; false: error and error_kind say why, nothing else is known.")
    interval_ms: int = _doc("How often this probe asks (its quorum interval).")
    leader_id: Optional[int] = _doc("The active controller's id; -1: no leader (an election); null when not ok.",
                                    default=None)
    leader_epoch: Optional[int] = _doc("The leader's epoch: it changes with every new leader.", default=None)
    high_watermark: Optional[int] = _doc("The metadata log's high watermark.", default=None)
    voters: list[QuorumReplica] = _doc("The controllers that vote, the leader among them.", default_factory=list)
    observers: list[QuorumReplica] = _doc("The nodes that follow the log without voting: the brokers.",
                                          default_factory=list)
    error: Optional[str] = _doc("Why the quorum did not answer, when ok is false.", default=None)
    error_kind: Optional[str] = _doc(
        "permission (the probe's user lacks DESCRIBE on the cluster), unsupported (no DescribeQuorum: a "
        "ZooKeeper cluster or a version before 3.3), no_answer (no broker answered in time: the monitor's "
        "blindness, not the quorum's) or error (anything else); null when ok.", default=None)


@dataclass(frozen=True)
class LogDir:
    """One log dir of a broker as DescribeLogDirs answers it."""

    log_dir: str = _doc("The dir's absolute path on the broker.")
    online: bool = _doc("false: the broker reports the dir offline (error says why).")
    error: Optional[str] = _doc("The dir's error name (KAFKA_STORAGE_ERROR for an offline dir), when not online.",
                                default=None)
    total_bytes: Optional[int] = _doc("Size of the dir's filesystem; null: not reported (before Kafka 3.3, offline).",
                                      default=None)
    usable_bytes: Optional[int] = _doc("Bytes still usable on it; null as for total_bytes.", default=None)
    held_replicas: int = _doc("Replicas the dir holds (for an offline dir: held when it was last online).", default=0)
    held_bytes: Optional[int] = _doc("Sum of those replicas' sizes.", default=None)
    held_partitions: list[str] = _doc("Up to 20 of those replicas as topic-partition names, largest first (an offline "
                                      "dir's: from when it was last online).", default_factory=list)
    moving_replicas: int = _doc("Replicas being moved into the dir (future replicas, AlterReplicaLogDirs).", default=0)


@dataclass(frozen=True)
class BrokerLogDirs:
    """Every log dir of one broker as DescribeLogDirs answers it, asked by a probe on an interval of
    its own (schema v2).  A dir that fails (a disk gone, a filesystem full) is reported offline by
    its broker, which keeps serving its other dirs; the replicas it held leave their ISRs.  A broker
    that does not answer sends nothing (BrokerDown covers a stopped broker)."""

    broker: int = _doc("The broker's id.")
    interval_ms: int = _doc("How often this probe asks (its log dirs interval).")
    dirs: list[LogDir] = _doc("Each of the broker's log dirs (at most 64).", default_factory=list)


@dataclass(frozen=True)
class OpenTransaction:
    """One open transaction as its coordinator describes it (DescribeTransactions), or as
    ListTransactions lists it when the description failed (``described`` false)."""

    transactional_id: str = _doc("The producer's transactional.id (cut to 1,024 characters).")
    producer_id: int = _doc("Its producer id.")
    state: str = _doc("Ongoing (records being written), PrepareCommit or PrepareAbort (the coordinator is writing its "
                      "markers): the open states.")
    coordinator: int = _doc("The broker that coordinates it (the leader of its __transaction_state partition).")
    described: bool = _doc("false: DescribeTransactions failed for it; only what ListTransactions says (id, producer "
                           "id, state, coordinator) is known.", default=True)
    producer_epoch: Optional[int] = _doc("Its producer epoch; null: not described.", default=None)
    started_ms_ago: Optional[int] = _doc(
        "Time since it started, at observed_at (the coordinator's start time against the probe's clock); null: "
        "unknown (not described).", default=None)
    timeout_ms: Optional[int] = _doc("Its transaction.timeout.ms: the coordinator aborts it once it is older; null: "
                                     "not described.", default=None)
    partitions: list[str] = _doc("Up to 100 of the partitions it has added, as topic-partition names (sorted).",
                                 default_factory=list)
    partitions_count: int = _doc("How many partitions it has added (0 when not described).", default=0)


@dataclass(frozen=True)
class HeldPartition:
    """A partition on which a producer has an open transaction, as its leader describes it
    (DescribeProducers): the partition's last stable offset cannot pass first_offset until that
    transaction commits or aborts."""

    topic: str = _doc("Topic name.")
    partition: int = _doc("Partition index.")
    producer_id: int = _doc("The producer whose transaction is open there. One that no listed transaction has is "
                            "a hanging transaction (its coordinator knows none), or one not listed (its broker in "
                            "unlisted_brokers, no DESCRIBE on its transactional id, begun after the listing).")
    producer_epoch: int = _doc("That producer's epoch on the partition.")
    first_offset: int = _doc("Offset of the transaction's first record on the partition: read_committed consumers "
                             "stop before it (the last stable offset) until the transaction ends.")
    last_stable_offset: Optional[int] = _doc(
        "The partition's last stable offset in the probe's latest observation of its offsets; null when not "
        "watched or unknown.", default=None)
    high_watermark: Optional[int] = _doc(
        "The partition's high watermark in that observation: high_watermark - last_stable_offset records are "
        "written but held from read_committed consumers; null when not watched or unknown.", default=None)


@dataclass(frozen=True)
class OpenTransactions:
    """The cluster's open transactions (ListTransactions of each broker, DescribeTransactions
    of the open ones) and the partitions they hold (DescribeProducers), asked by a probe on an
    interval of its own (schema v2).  An open transaction pins its partitions' last stable offset:
    read_committed consumers stop there while the high watermark moves on.  The lists keep the
    oldest transactions first and are cut to keep the event under 60,000 bytes; the counts say
    how many there were."""

    ok: bool = _doc("Whether any broker listed its transactions; false: error and error_kind say why, nothing else "
                    "is known.")
    interval_ms: int = _doc("How often this probe asks (its transactions interval).")
    transactions: list[OpenTransaction] = _doc(
        "Open transactions, the oldest first (those not described last), at most 1000.", default_factory=list)
    transactions_count: int = _doc("Open transactions listed (the list may hold fewer).", default=0)
    held_partitions: list[HeldPartition] = _doc(
        "The open transactions' partitions on which a producer has a transaction open (DescribeProducers), those "
        "of the oldest transactions first, at most 1000.", default_factory=list)
    held_partitions_count: int = _doc("Such partitions and producers found (the list may hold fewer).", default=0)
    unasked_partitions: int = _doc(
        "Partitions of the open transactions that DescribeProducers did not answer for (it failed, or beyond the "
        "1000 asked per round); 0: every one was asked and answered.", default=0)
    unlisted_brokers: list[int] = _doc(
        "Brokers whose ListTransactions failed: the transactions they coordinate are missing.", default_factory=list)
    error: Optional[str] = _doc("Why nothing was listed, when ok is false.", default=None)
    error_kind: Optional[str] = _doc(
        "permission (the brokers refused DescribeCluster or ListTransactions; Kafka lists without refusing only the "
        "transactional ids the probe's user may DESCRIBE), unsupported (no ListTransactions: Kafka before 3.0; said "
        "once in the probe's log, not sent), no_answer (no broker answered in time: the monitor's blindness, not the "
        "cluster's) or error (anything else); null when ok.", default=None)


#: type name -> (payload class, fields that make up the entity key after the cluster)
PAYLOADS: dict[str, tuple[type, tuple[str, ...]]] = {
    "metadata_refresh": (MetadataRefresh, ("@source",)),
    "partition_metadata": (PartitionMetadata, ("topic", "partition")),
    "partition_offsets": (PartitionOffsets, ("topic", "partition")),
    "group_offsets": (GroupOffsets, ("group", "topic", "partition")),
    "group_state": (GroupState, ("group",)),
    "rebalance": (Rebalance, ("group",)),
    "client_fetch": (ClientFetch, ("group", "topic", "partition")),
    "canary": (Canary, ("topic", "partition")),
    "broker_state": (BrokerState, ("node_id",)),
    "client_produce": (ClientProduce, ("@source", "topic", "partition")),
    "heartbeat": (Heartbeat, ("@source",)),
    "partition_gone": (PartitionGone, ("topic", "partition")),
    "group_gone": (GroupGone, ("group",)),
    "group_partition_gone": (GroupPartitionGone, ("group", "topic", "partition")),
    "quorum_state": (QuorumState, ()),
    "log_dirs": (BrokerLogDirs, ("broker",)),
    "transactions": (OpenTransactions, ()),
    "ha_member": (HaMember, ("ha_group",)),
}
#: the contract version each type is sent with (the rest: v1)
SCHEMA_OF_TYPE = {"quorum_state": SCHEMA_V2, "partition_metadata": SCHEMA_V2, "log_dirs": SCHEMA_V2,
                  "transactions": SCHEMA_V2, "ha_member": SCHEMA_V2}
EVENT_TYPES = tuple(PAYLOADS)
#: the types a probe sends as v3 records (``rows``): the rows of a bulk send that share these
#: fields go in one record (a topic's partitions; a group's partitions of one topic)
ROWS_KEY_OF_TYPE = {"partition_offsets": ("topic",), "partition_metadata": ("topic",),
                    "group_offsets": ("group", "topic")}
#: an HA group's probe (monitor.shards): the field naming the shard of each type it sends ("" for
#: the cluster-wide types, held by shard 0); the types not here carry no shard (per source)
SHARD_OF_TYPE = {"partition_metadata": "topic", "partition_offsets": "topic", "partition_gone": "topic",
                 "group_offsets": "topic", "group_partition_gone": "topic", "group_state": "group",
                 "rebalance": "group", "group_gone": "group", "broker_state": "", "quorum_state": "",
                 "log_dirs": "", "transactions": "", "canary": ""}
TYPE_OF_PAYLOAD = {cls: name for name, (cls, _) in PAYLOADS.items()}
#: the record key's fields (after the cluster) where coarser than the entity's: all of a topic's
#: partitions under one key, whether in a v3 record or alone, and their *_gone events with them
KEY_OF_TYPE = {**ROWS_KEY_OF_TYPE, "partition_gone": ("topic",), "group_partition_gone": ("group", "topic")}

Payload = Union[
    MetadataRefresh, PartitionMetadata, PartitionOffsets, GroupOffsets, GroupState, Rebalance,
    ClientFetch, Canary, BrokerState, ClientProduce, Heartbeat, PartitionGone, GroupGone, GroupPartitionGone,
    QuorumState, BrokerLogDirs, OpenTransactions, HaMember,
]

ENVELOPE_DOCS = {
    "schema": "Contract version: \"kafka-monitor/v3\" for a record with rows (a probe sends partition_offsets, partition_metadata and group_offsets so, a topic's in one record), \"kafka-monitor/v2\" for quorum_state, log_dirs, transactions, ha_member and partition_metadata (its eligible leader replicas), \"kafka-monitor/v1\" for the other types; a reader takes all three.",
    "type": "Event type (one of the payload types below).",
    "event_id": "Unique id of this event (readers de-duplicate on it).",
    "cluster": "Id of the cluster the observation is about.",
    "source": "Which probe or instrumented client observed it.",
    "shard": "Only from a probe of an HA group (--ha-group): the shard the observed entity belongs to (SHARD_OF_TYPE: crc32 of its topic or group name modulo the group's shard count; 0 for the cluster-wide types). Absent otherwise.",
    "epoch": "Only with shard: the probe's claim on that shard, the offset of its claim record in the shard topic. A later owner's epoch is larger; the job drops a shard's events whose epoch is older than the newest it has seen (reason fenced). Absent otherwise.",
    "seq": "Per-source counter from 0: gaps mean loss, repeats mean replays.",
    "observed_at": "Event time: when the observation was made, epoch milliseconds.",
    "data": "The type-specific payload (v3 with rows: the first event's).",
    "rows": "v3 only, optional: the record stands for several events of its type. An object naming payload fields, each with a list of its values, one per event (all lists of one length, 1 to 10,000); event k is data with each listed field set to its k-th value, under the shared envelope. Its record key is the type's (below); the fields that key names are not listed.",
}


@dataclass(frozen=True)
class Event:
    type: str
    cluster: str
    source: str
    seq: int
    observed_at: int
    data: Payload
    event_id: str = ""
    schema: str = ""  # default: SCHEMA_OF_TYPE's
    #: an HA group's probe: the entity's shard and the probe's epoch on it (both or neither)
    shard: Optional[int] = None
    epoch: Optional[int] = None
    #: v3: payload field -> its values, one per event the record stands for (data: the first's)
    rows: Optional[dict[str, list[Any]]] = None

    def __post_init__(self) -> None:
        if not self.event_id:
            object.__setattr__(self, "event_id", uuid.uuid4().hex)
        if not self.schema:
            object.__setattr__(self, "schema", SCHEMA_V3 if self.rows is not None
                               else SCHEMA_OF_TYPE.get(self.type, SCHEMA_V1))
        if self.type not in PAYLOADS:
            raise ContractError("unknown_type", f"type {self.type!r} is not one of {', '.join(EVENT_TYPES)}")
        if not isinstance(self.data, PAYLOADS[self.type][0]):
            raise ContractError("bad_payload", f"{self.type} carries a {type(self.data).__name__}")
        if self.rows is not None:
            if self.schema != SCHEMA_V3:
                raise ContractError("unknown_schema", f"rows needs schema {SCHEMA_V3}, not {self.schema}")
            _check_rows(PAYLOADS[self.type][0], self.rows)

    @classmethod
    def batch(cls, payloads: list[Payload], *, cluster: str, source: str, seq: int, observed_at: int) -> "Event":
        """One v3 record for several payloads of one type (observed together): ``rows`` lists
        the fields whose values differ between them."""
        first = payloads[0]
        etype = TYPE_OF_PAYLOAD[type(first)]
        vals = [_fields(p) for p in payloads]
        rows = rows_of(etype, {f: [v[f] for v in vals] for f in vals[0]})
        return cls(type=etype, cluster=cluster, source=source, seq=seq, observed_at=observed_at, data=first,
                   rows=rows)

    def expand(self) -> list["Event"]:
        """The events a record stands for: itself, or one per row of a v3 record (its envelope,
        schema v3, no rows)."""
        if self.rows is None:
            return [self]
        base = _fields(self.data)
        n = len(next(iter(self.rows.values())))
        cls = PAYLOADS[self.type][0]
        return [dataclasses.replace(self, rows=None, data=_build(cls, {**base, **{f: v[k] for f, v in self.rows.items()}},
                                                                 "data")) for k in range(n)]

    @classmethod
    def of(cls, data: Payload, *, cluster: str, source: str, seq: int, observed_at: int) -> "Event":
        return cls(type=TYPE_OF_PAYLOAD[type(data)], cluster=cluster, source=source, seq=seq,
                   observed_at=observed_at, data=data)

    def key(self) -> str:
        """The record key in the events topic (``record_key``)."""
        return record_key(self.type, self.cluster, self.source, _fields(self.data))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.schema, "type": self.type, "event_id": self.event_id,
                               "cluster": self.cluster, "source": self.source}
        if self.epoch is not None:
            out["shard"], out["epoch"] = self.shard, self.epoch
        out.update(seq=self.seq, observed_at=self.observed_at, data=_fields(self.data))
        if self.rows is not None:
            out["rows"] = {f: [_plain(x) for x in v] for f, v in self.rows.items()}
        return out

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, raw: Union[bytes, str]) -> "Event":
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ContractError("malformed_json", str(e)) from None
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: Any) -> "Event":
        if not isinstance(obj, dict):
            raise ContractError("not_an_object", f"an event is a JSON object, got {type(obj).__name__}")
        schema = obj.get("schema")
        if schema not in SUPPORTED_SCHEMAS:
            raise ContractError("unknown_schema", f"schema {schema!r} is not one of {SUPPORTED_SCHEMAS}")
        etype = obj.get("type")
        if etype not in PAYLOADS:
            raise ContractError("unknown_type", f"type {etype!r} is not one of {', '.join(EVENT_TYPES)}")
        env = {}
        for name, typ in (("event_id", str), ("cluster", str), ("source", str), ("seq", int),
                          ("observed_at", int)):
            env[name] = _coerce(typ, obj.get(name), name, required=True)
        if env["seq"] < 0 or env["observed_at"] < 0:
            raise ContractError("out_of_range", "seq and observed_at must be >= 0")
        for name in ("shard", "epoch"):
            env[name] = _coerce(Optional[int], obj.get(name), name)
            if env[name] is not None and env[name] < 0:
                raise ContractError("out_of_range", f"{name} must be >= 0")
        if (env["shard"] is None) != (env["epoch"] is None):
            raise ContractError("missing_envelope", "shard and epoch come together")
        data = _build(PAYLOADS[etype][0], obj.get("data"), "data")
        rows = obj.get("rows") if schema == SCHEMA_V3 else None  # v1/v2: an unknown field, ignored
        if rows is not None:
            payload = PAYLOADS[etype][0]
            if not isinstance(rows, dict):
                raise ContractError("wrong_type", "rows must be an object")
            _check_rows(payload, rows)
            # checked against the field's type, kept as JSON values (expand builds the payloads)
            rows = {f: [_plain(_coerce(hints(payload)[f], x, f"rows.{f}[{i}]")) for i, x in enumerate(v)]
                    for f, v in rows.items()}
            if any(v[0] != _plain(getattr(data, f)) for f, v in rows.items()):
                raise ContractError("wrong_value", "rows' first values must be data's")
        return cls(type=etype, data=data, schema=schema, rows=rows, **env)


def rows_of(etype: str, columns: dict[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """The ``rows`` of a v3 record of ``etype`` whose events have these values (field -> one value
    per event, every field of the payload): the fields whose values differ, and always the entity
    key's fields that ``ROWS_KEY_OF_TYPE`` does not name (so the record's key is the cluster and
    those); events all alike list their first field."""
    named = ROWS_KEY_OF_TYPE.get(etype, ())
    keyed = {f for f in PAYLOADS[etype][1] if f not in named}
    out = {f: list(col) for f, col in columns.items() if f in keyed or col.count(col[0]) != len(col)}
    if not out:
        f = next(iter(columns))
        out = {f: list(columns[f])}
    return out


def _check_rows(payload: type, rows: dict[str, Any]) -> None:
    """rows' shape: known payload fields, lists of one length, 1 to MAX_ROWS_PER_RECORD."""
    names = {f.name for f in dataclasses.fields(payload)}
    unknown = sorted(set(rows) - names)
    if unknown:
        raise ContractError("unknown_field", f"rows names {unknown}: not fields of {payload.__name__}")
    lens = {len(v) if isinstance(v, list) else -1 for v in rows.values()}
    if not rows or -1 in lens or len(lens) != 1:
        raise ContractError("missing_field", "rows must hold lists of one length")
    n = lens.pop()
    if not 1 <= n <= MAX_ROWS_PER_RECORD:
        raise ContractError("out_of_range", f"rows hold {n} events; 1 to {MAX_ROWS_PER_RECORD}")


def _plain(v: Any) -> Any:
    """A value as JSON-ready Python: dataclasses as dicts, lists of them as lists of dicts."""
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    return v


def _fields(data: Any) -> dict[str, Any]:
    """A payload as a dict, like ``dataclasses.asdict`` but copying only what needs it: lists are
    copied shallowly, nested payloads (PartitionCountChange) become dicts.  With asdict's deep
    copy, key() + to_json() took 1.7x as long (42k probe-like events: 1.10 s vs 0.65 s)."""
    out = {}
    for f in dataclasses.fields(data):
        v = getattr(data, f.name)
        if isinstance(v, list):
            v = [dataclasses.asdict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else x for x in v]
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = dataclasses.asdict(v)
        out[f.name] = v
    return out


def key_fields(etype: str) -> tuple[str, ...]:
    """The fields of a type's record key after the cluster ("@source": the event's source)."""
    return KEY_OF_TYPE.get(etype, PAYLOADS[etype][1])


def record_key(etype: str, cluster: str, source: str, data: dict[str, Any]) -> str:
    """cluster/field/...: the entity key, or for the types of ``KEY_OF_TYPE`` the fields it names."""
    return "/".join([cluster] + [source if f == "@source" else str(data[f]) for f in key_fields(etype)])


# ---------------------------------------------------------------------------------------------
# Validation against the dataclass annotations (used by from_dict)
# ---------------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def is_dataclass_type(typ: Any) -> "typing.TypeGuard[type]":
    """A dataclass itself (not an instance of one)."""
    return isinstance(typ, type) and dataclasses.is_dataclass(typ)


def _unwrap_optional(typ: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(typ)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return typ, False


def _coerce(typ: Any, value: Any, path: str, required: bool = False) -> Any:
    inner, optional = _unwrap_optional(typ)
    if value is None:
        if optional and not required:
            return None
        raise ContractError("missing_field", f"{path} is required")
    if is_dataclass_type(inner):
        return _build(inner, value, path)
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        if not isinstance(value, list):
            raise ContractError("wrong_type", f"{path} must be a list")
        return [_coerce(item, v, f"{path}[{i}]", required=True) for i, v in enumerate(value)]
    if inner is bool:
        if not isinstance(value, bool):
            raise ContractError("wrong_type", f"{path} must be a boolean")
        return value
    if inner is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ContractError("wrong_type", f"{path} must be an integer")
        return value
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ContractError("wrong_type", f"{path} must be a number")
        return float(value)
    if inner is str:
        if not isinstance(value, str):
            raise ContractError("wrong_type", f"{path} must be a string")
        return value
    raise TypeError(f"unsupported annotation {typ!r} at {path}")  # a bug in this module


def _build(cls: type, obj: Any, path: str) -> Any:
    if not isinstance(obj, dict):
        raise ContractError("wrong_type", f"{path} must be an object")
    kwargs = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in obj:
            if required and not _unwrap_optional(hints(cls)[f.name])[1]:
                raise ContractError("missing_field", f"{path}.{f.name} is required")
            if required:  # Optional without default: must be present, may be null
                raise ContractError("missing_field", f"{path}.{f.name} is required (null allowed)")
            continue
        kwargs[f.name] = _coerce(hints(cls)[f.name], obj[f.name], f"{path}.{f.name}")
    # unknown extra fields are accepted and ignored (forward compatibility)
    return cls(**kwargs)


def kafka_offset(value: Optional[int]) -> Optional[int]:
    """Kafka's -1 / -1001 'no offset' sentinels become None; real offsets pass through."""
    if value is None or value in KAFKA_OFFSET_SENTINELS or value < 0:
        return None
    return value
