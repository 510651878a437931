"""The metric catalogue of the Prometheus exporter (``streaming.sinks.exporter``): every metric's
name, type, help and labels (``CATALOGUE``), their label tuples, and the constants the exporter,
the sink (``streaming.sinks.batch``) and the job's settings share.

Every metric is documented in ``docs/metrics.md`` (a test keeps the two in step).  Naming: one
prefix (``kafka_monitor_``), base units, ``_total`` only on counters, a fixed label vocabulary
(``cluster``, ``topic``, ``partition``, ``group``, ``source``, ``alert``, ``severity``,
``action``, ``reason``, ``state``, ``status``, and ``broker``, ``node``, ``role``, ``log_dir`` for
brokers, the quorum's nodes and log dirs).
"""

from __future__ import annotations

from streaming.ingest import quality

P = "kafka_monitor_"
#: lag status name -> gauge value (streaming.rules.lag_status.LagStatus, in severity order)
LAG_STATUS_VALUE = {"OK": 0, "WARN": 1, "STALL": 2, "STOP": 3, "REWIND": 4}
#: the reasons the quality gate gives (streaming.job.parse)
QUARANTINE_REASONS = ("oversized", "malformed_json", "unknown_schema", "unknown_type", "missing_envelope",
                      "missing_field", "out_of_range", "field_too_long", "event_time_ahead", "event_time_behind",
                      *quality.RULES)  # parsing.REASONS, then the gate's rules
#: why the state drops a valid event (streaming.state.fold.admit)
DROP_REASONS = ("duplicate", "out_of_order", "fenced")
#: the (kind, reason) pairs of entities_removed_total served from the start
REMOVED_SEEDS = (("partition", "topic_deleted"), ("group", "group_deleted"), ("group_partition", "group_deleted"),
                 ("group_partition", "offset_deleted"), ("partition", "not_observed"),
                 ("group", "not_observed"), ("group_partition", "not_observed"))
PART = ("cluster", "topic", "partition")
#: buckets of the delay histogram (seconds): a healthy pipeline is a trigger or two
DELAY_BUCKETS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600)
GPART = ("cluster", "group", "topic", "partition")
#: canary series: the partition and the broker that led it at the canary's last report
CANARY = ("cluster", "topic", "partition", "broker")
CPROD = ("cluster", "source", "topic", "partition", "broker")
ALERT = ("alert", "severity", "cluster", "topic", "partition", "group", "source", "broker")
BROKER = ("cluster", "broker")
QUORUM = ("cluster",)
#: a whole cluster (its open transactions)
CLUSTER = ("cluster",)
#: a node of the KRaft quorum: a voter (controller) or an observer (broker)
QNODE = ("cluster", "node", "role")
#: a log dir of a broker
LOGDIR = ("cluster", "broker", "log_dir")
#: an HA group of probes: source is "ha:<group>"
HA = ("cluster", "source")
HA_PROBE = ("cluster", "source", "probe")
#: metrics granularity: ``partition`` serves every partition's and group partition's gauges;
#: ``topic`` only their per-topic aggregates (served at both), for a Prometheus that cannot take
#: a series per partition (at 100,000 partitions: ~900,000 series against ~few thousand)
GRANULARITIES = ("partition", "topic")
_STATUSES = tuple(sorted(LAG_STATUS_VALUE, key=LAG_STATUS_VALUE.__getitem__))
_AGGREGATES = ("topic_partitions", "topic_under_replicated_partitions", "topic_offline_partitions",
               "topic_high_watermark_sum", "group_topic_lag", "group_topic_lag_max", "group_topic_lag_seconds_max",
               "group_topic_lag_status_partitions")
#: the gauges of a partition row and of a group-partition row, in the order of their values
_PARTITION_GAUGES = ("partition_high_watermark", "partition_log_start_offset", "partition_last_stable_offset",
                     "partition_leader", "partition_replicas", "partition_in_sync_replicas")
_GROUP_PARTITION_GAUGES = ("group_partition_committed_offset", "group_partition_lag", "group_partition_lag_seconds",
                           "group_partition_lag_status", "group_partition_read_committed_lag")

#: name -> (type, help, labels); the catalogue docs/metrics.md is checked against
CATALOGUE: dict[str, tuple[str, str, tuple[str, ...]]] = {
    P + "partition_high_watermark": ("gauge", "High watermark of the partition (offset of the next record to be committed).", PART),
    P + "partition_log_start_offset": ("gauge", "First offset still in the partition's log.", PART),
    P + "partition_last_stable_offset": ("gauge", "Last stable offset of the partition (transactions).", PART),
    P + "partition_leader": ("gauge", "Broker id of the partition's leader; -1 when it has none.", PART),
    P + "partition_replicas": ("gauge", "Number of replicas of the partition.", PART),
    P + "partition_in_sync_replicas": ("gauge", "Number of in-sync replicas of the partition.", PART),
    P + "partition_eligible_leader_replicas": ("gauge", "Eligible leader replicas of the partition (KIP-966: out of the ISR, still electable without data loss); served while its ISR is short and the probe knows them (Kafka 4.1+).", PART),
    P + "partition_last_known_elr": ("gauge", "Last-known eligible leader replicas of the partition (shut down uncleanly: the last resort before an unclean election); served with partition_eligible_leader_replicas.", PART),
    P + "group_partition_committed_offset": ("gauge", "Offset the consumer group committed for the partition.", GPART),
    P + "group_partition_lag": ("gauge", "Consumer lag in offsets: HW - committed offset, from one observation; never negative.", GPART),
    P + "group_partition_lag_seconds": ("gauge", "Consumer lag in seconds: how long ago the partition's HW was at the committed offset (interpolated; never negative, bounded extrapolation).", GPART),
    P + "group_partition_lag_status": ("gauge", "Burrow-style lag status evaluated at each observation: 0 OK, 1 WARN, 2 STALL, 3 STOP, 4 REWIND.", GPART),
    P + "topic_partitions": ("gauge", "Partitions of the topic the job knows (per-topic aggregate: present at either metrics granularity).", ("cluster", "topic")),
    P + "topic_under_replicated_partitions": ("gauge", "Partitions of the topic with fewer in-sync replicas than replicas.", ("cluster", "topic")),
    P + "topic_offline_partitions": ("gauge", "Partitions of the topic without a leader.", ("cluster", "topic")),
    P + "topic_high_watermark_sum": ("gauge", "Sum of the topic's partitions' high watermarks (its rate is the topic's write rate).", ("cluster", "topic")),
    P + "group_topic_lag": ("gauge", "Consumer lag in offsets of the group on the topic: the sum over its partitions with a known lag.", ("cluster", "group", "topic")),
    P + "group_topic_lag_max": ("gauge", "Consumer lag in offsets of the group on the topic: its most lagging partition's.", ("cluster", "group", "topic")),
    P + "group_topic_lag_seconds_max": ("gauge", "Consumer lag in seconds of the group on the topic: its most lagging partition's.", ("cluster", "group", "topic")),
    P + "group_topic_lag_status_partitions": ("gauge", "Partitions of the topic whose lag status (group_partition_lag_status) is ``status`` for the group; every status has a series, 0 included.", ("cluster", "group", "topic", "status")),
    P + "group_partition_read_committed_lag": ("gauge", "Consumer lag in offsets of a read_committed consumer: last stable offset - committed offset, from one observation; never negative; absent when the LSO is unknown.", GPART),
    P + "group_members": ("gauge", "Members of the consumer group as its coordinator reports them.", ("cluster", "group")),
    P + "group_state": ("gauge", "1 for the group's current state (Empty, PreparingRebalance, CompletingRebalance, Stable, Dead; Assigning, Reconciling for the consumer protocol; Unknown).", ("cluster", "group", "state")),
    P + "client_fetch_position": ("gauge", "Offset of the next record the instrumented consumer's application gets from the partition (its client_fetch report).", GPART),
    P + "client_fetch_committed_offset": ("gauge", "Offset the instrumented consumer last committed for the partition, as the client reports it.", GPART),
    P + "client_fetch_high_watermark": ("gauge", "High watermark of the partition in the instrumented consumer's last fetch response.", GPART),
    P + "client_fetch_lag": ("gauge", "Consumer lag in offsets as the instrumented consumer computes it (HW - committed, from its own fetches).", GPART),
    P + "client_fetch_state": ("gauge", "1 for the instrumented consumer's fetch state of the partition (librdkafka's: active, stopped, offset-query, ...); the series of the previous state is removed.", GPART + ("state",)),
    P + "client_last_metadata_refresh_timestamp_seconds": ("gauge", "Event time of the source's last successful metadata refresh.", ("cluster", "source")),
    P + "source_last_heartbeat_timestamp_seconds": ("gauge", "Event time of the last heartbeat of a probe or instrumented client.", ("cluster", "source")),
    P + "source_heartbeat_interval_seconds": ("gauge", "Heartbeat interval the source announced (SourceSilent = no heartbeat for 3 of them).", ("cluster", "source")),
    P + "source_cycle_duration_seconds": ("gauge", "How long the source's last observation cycle took (its last heartbeat's cycle_duration_ms); above the heartbeat interval its observations fall behind.", ("cluster", "source")),
    P + "source_observation_lag_seconds": ("gauge", "How late the source's last observation started after its schedule (its last heartbeat's observation_lag_ms).", ("cluster", "source")),
    P + "source_events_dropped": ("gauge", "Events the source dropped since it started (its last heartbeat's events_dropped: local queue full or delivery failed); back to 0 when it restarts.", ("cluster", "source")),
    P + "source_heartbeat_delay_seconds": ("histogram", "Pipeline delay of heartbeats: from a heartbeat's event time at its source to the moment the job's exporter serves it (source -> events topic -> micro-batch -> sink).", ()),
    P + "client_produce_queued_messages": ("gauge", "Messages an instrumented producer holds for the partition, not sent yet (its last statistics).", CPROD),
    P + "client_produce_in_flight_messages": ("gauge", "Messages an instrumented producer sent to the partition and has no acknowledgement for yet: writes pending on it.", CPROD),
    P + "client_produce_sent_messages_total": ("counter", "Messages an instrumented producer sent to the partition since it started.", CPROD),
    P + "client_produce_leader_rtt_p99_seconds": ("gauge", "99th percentile of the producer's request round trip to the partition's leader over its last statistics interval; absent when it sent nothing then.", CPROD),
    P + "client_produce_leader_queue_latency_p99_seconds": ("gauge", "99th percentile of the time the producer's requests to the partition's leader waited in the client before being sent, over its last statistics interval.", CPROD),
    P + "client_produce_leader_request_errors_total": ("counter", "The producer's requests to the partition's leader that failed, since it started.", CPROD),
    P + "client_produce_leader_request_retries_total": ("counter", "The producer's requests to the partition's leader sent again, since it started.", CPROD),
    P + "client_produce_delivered_messages_total": ("counter", "Writes of an instrumented producer to the partition that the application got a successful delivery report for, since it started (InstrumentedProducer; absent when its reports are not seen).", CPROD),
    P + "client_produce_delivery_errors_total": ("counter", "Writes of an instrumented producer to the partition that failed, by librdkafka error code of the delivery report (after librdkafka's own retries), since it started.", CPROD + ("code",)),
    P + "client_produce_delivery_latency_seconds": ("histogram", "Time from an instrumented producer's produce() to the write's acknowledgement (librdkafka's message latency; with acks=all the replication commit time), since it started.", CPROD),
    P + "broker_registered": ("gauge", "1 while the broker is listed in the probe's metadata (registered and unfenced), 0 while it holds replicas and is not (stopped or fenced).", BROKER),
    P + "broker_leader_partitions": ("gauge", "Partitions the broker leads (every partition in the probe's metadata, not only the watched topics).", BROKER),
    P + "broker_replicas": ("gauge", "Partitions with a replica on the broker.", BROKER),
    P + "broker_out_of_sync_replicas": ("gauge", "Partitions with a replica on the broker whose ISR does not include it.", BROKER),
    P + "canary_produce_latency_seconds": ("histogram", "Time from a canary write (acks=all) to its acknowledgement: the replication commit time (the leader acks once every in-sync replica has the write). Cumulative since the canary started.", CANARY),
    P + "canary_end_to_end_latency_seconds": ("histogram", "Time from a canary write to its reading back by the canary's consumer.", CANARY),
    P + "canary_messages_sent_total": ("counter", "Canary writes sent to the partition.", CANARY),
    P + "canary_messages_acked_total": ("counter", "Canary writes acknowledged (acks=all).", CANARY),
    P + "canary_messages_received_total": ("counter", "Canary writes read back (each once).", CANARY),
    P + "canary_messages_lost_total": ("counter", "Acknowledged canary writes never read back within the canary's loss window.", CANARY),
    P + "canary_messages_duplicated_total": ("counter", "Canary writes read back more than once.", CANARY),
    P + "canary_messages_out_of_order_total": ("counter", "Canary writes read back after one with a higher sequence number.", CANARY),
    P + "canary_produce_errors_total": ("counter", "Canary writes that failed, by librdkafka error code.", CANARY + ("code",)),
    P + "canary_pending_messages": ("gauge", "Canary writes sent and not acknowledged yet, at the canary's last report.", CANARY),
    P + "canary_oldest_pending_seconds": ("gauge", "Age of the oldest of those at the canary's last report; 0 when none.", CANARY),
    P + "quorum_up": ("gauge", "1 while the probe's last DescribeQuorum was answered, 0 after it was not (no answer, no permission, an error): the quorum series below then keep the last answer.", QUORUM),
    P + "quorum_leader": ("gauge", "The KRaft quorum's leader: the active controller's node id; -1 while there is none (an election).", QUORUM),
    P + "quorum_leader_epoch": ("gauge", "The quorum leader's epoch: it goes up with every new leader.", QUORUM),
    P + "quorum_high_watermark": ("gauge", "The high watermark of the metadata log (__cluster_metadata).", QUORUM),
    P + "quorum_replica_lag": ("gauge", "Metadata records a voter (role voter, a controller) or an observer (role observer, a broker) is behind the leader's log end offset.", QNODE),
    P + "quorum_replica_caught_up_age_seconds": ("gauge", "Time since the voter or observer was last caught up with the leader, at the probe's answer (the leader's clock against the probe's).", QNODE),
    P + "log_dir_online": ("gauge", "1 while the broker reports the log dir online, 0 while it reports it offline (KAFKA_STORAGE_ERROR: its replicas are out of every ISR).", LOGDIR),
    P + "log_dir_total_bytes": ("gauge", "Size of the filesystem the log dir is on, as the broker reports it (Kafka 3.3+); not served while the dir is offline.", LOGDIR),
    P + "log_dir_usable_bytes": ("gauge", "Bytes still usable on that filesystem; not served while the dir is offline.", LOGDIR),
    P + "log_dir_replicas": ("gauge", "Replicas the log dir holds (an offline dir: those it held when last online).", LOGDIR),
    P + "log_dir_seconds_to_full": ("gauge", "Time until the log dir's filesystem is full at its growth over the job's growth window; served only while it grows.", LOGDIR),
    P + "transactions_open": ("gauge", "Open transactions (Ongoing, PrepareCommit, PrepareAbort) the brokers listed at the probe's last transactions answer.", CLUSTER),
    P + "transactions_hanging": ("gauge", "Of those, the hanging ones: open longer than the job's hanging_after_ms or past their own timeout, and producers holding a partition's LSO that no coordinator lists.", CLUSTER),
    P + "transaction_oldest_age_seconds": ("gauge", "Age of the oldest open transaction at the probe's last answer; 0 when none is open.", CLUSTER),
    P + "transaction_held_partitions": ("gauge", "Partitions on which an open transaction holds the last stable offset (DescribeProducers), at the probe's last answer.", CLUSTER),
    P + "ha_probes": ("gauge", "Probes of an HA group (source ha:<group>) that reported within their silence limit at the group's last report.", HA),
    P + "ha_shards": ("gauge", "Shards of an HA group's cluster (the shard topic's partitions).", HA),
    P + "ha_shards_unobserved": ("gauge", "Shards of an HA group without an observation within their owner's interval and [job.rules.source] shard_unobserved_after_ms, at the group's last report (ShardUnobserved).", HA),
    P + "ha_probe_shards": ("gauge", "Shards each live probe of an HA group holds, as the job last saw their claims.", HA_PROBE),
    P + "ha_last_handover_timestamp_seconds": ("gauge", "When a shard of the HA group last moved to another probe (a report with a larger epoch from another probe), epoch seconds.", HA),
    P + "alert_active": ("gauge", "1 while the alert is open on the entity; the series is removed when it resolves.", ALERT),
    P + "alert_opened_timestamp_seconds": ("gauge", "When the open alert opened: the event time of the observation that opened it (Unix time), kept across a job restart; removed when it resolves.", ALERT),
    P + "alert_notify_after_seconds": ("gauge", "How long an alert the job opens at once is open before its Prometheus rule fires: the job's [job.rules.notify] setting for it.", ("alert",)),
    P + "alert_transitions_total": ("counter", "Alert transitions emitted by the job.", ("alert", "action")),
    P + "events_quarantined_total": ("counter", "Events refused by the quality gate, by reason; they never reach state or alerts.", ("reason",)),
    P + "events_dropped_total": ("counter", "Valid events the state did not apply, by reason: duplicate (an event_id already applied), out_of_order (older than the last observation of its type from its source) or fenced (an HA group's shard sent with an epoch older than the newest seen: a probe that lost the shard).", ("reason",)),
    P + "quarantine_bytes": ("gauge", "Bytes of the quarantine files (one JSON-lines file per batch of refused events) kept now; at most job.quarantine_max_mb MiB, unless the newest file alone is larger.", ()),
    P + "quarantine_files_removed_total": ("counter", "Quarantine files deleted, oldest first, to keep them within job.quarantine_max_mb.", ()),
    P + "archive_rows_written_total": ("counter", "Events written to the event archive (job.archive_dir): every event the state received, once per micro-batch that committed (a batch run again after a restart rewrites its own files).", ()),
    P + "archive_files_written_total": ("counter", "Parquet files written to the event archive: one per cluster and hour of event time per micro-batch.", ()),
    P + "archive_bytes_written_total": ("counter", "Bytes of the Parquet files written to the event archive.", ()),
    P + "archive_last_write_duration_seconds": ("gauge", "Wall time the last micro-batch spent writing its events to the archive, on the driver (part of job_last_sink_duration_seconds).", ()),
    P + "archive_partitions_removed_total": ("counter", "Hour directories of the event archive deleted because they were older than job.archive_retention_h.", ()),
    P + "exporter_series_refused_total": ("counter", "Entity series not created because the exporter's series cap was reached.", ()),
    P + "job_up": ("gauge", "1 while the job runs (its streaming query starting or running), 0 after the query failed.", ()),
    P + "job_start_timestamp_seconds": ("gauge", "When the job process started serving metrics (Unix time); start-up allowances of the alert rules count from it.", ()),
    P + "job_events_behind": ("gauge", "Records in the events topic the job has not processed yet (at its last batch).", ()),
    P + "job_source_unreadable_partitions": ("gauge", "Partitions of the events topic whose offsets the job could not read at its last batch (no leader, leader down or not answering); they wait, nothing is skipped.", ()),
    P + "job_source_unreadable_seconds": ("gauge", "How long the longest-unreadable partition of the events topic has been so, at the last batch; 0 when every partition is readable.", ()),
    P + "job_state_keys": ("gauge", "Grouping keys with state in the job's state store: its buckets (job.buckets), not its entities.", ()),
    P + "job_state_entities": ("gauge", "Entities the job's state holds, by kind (partition, group, group_partition, ...), summed over its buckets as each last reported; what deleted topics and groups leave behind shows here until they are dropped.", ("kind",)),
    P + "job_state_bytes": ("gauge", "Bytes of the job's stored state (every bucket's value as last written, compressed).", ()),
    P + "entities_removed_total": ("counter", "Entities dropped from the job's state, by kind and reason: topic_deleted, group_deleted, offset_deleted (the probe found them gone) or not_observed (no observation for job.entity_ttl_s); their series go with them and their open alerts resolve.", ("kind", "reason")),
    P + "job_last_trigger_duration_seconds": ("gauge", "Wall time of the last micro-batch, read to write.", ()),
    P + "job_batches_total": ("counter", "Micro-batches the job has completed.", ()),
    P + "job_sink_rows_total": ("counter", "State-output rows the sink has applied.", ()),
    P + "job_last_sink_duration_seconds": ("gauge", "Wall time of the last micro-batch's sink.", ()),
    P + "job_last_batch_timestamp_seconds": ("gauge", "When the last micro-batch completed (Unix time).", ()),
}


#: the columns ``Exporter.apply`` reads of the row kinds that come by the 100,000 (partitions
#: and group partitions); the sink hands it only these for those kinds (``streaming.sinks.batch.sink_rows``), and
#: every column for the other kinds
ROW_COLUMNS = {
    "partition": ("kind", "action", "cluster", "topic", "partition", "high_watermark", "log_start_offset",
                  "last_stable_offset", "leader", "replicas", "isr", "report"),
    "group_partition": ("kind", "action", "cluster", "consumer_group", "topic", "partition", "committed_offset",
                        "lag", "lag_seconds", "lag_status", "read_committed_lag"),
}
