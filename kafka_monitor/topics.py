"""``kafka-monitor topics``: create the monitor's own topics as the README says, or check them.

The events topic (what the probes observe) and the alerts topic (the job's transitions, keyed by
alert id), each with replication factor 3 and ``min.insync.replicas=1``: the monitor's own writes
must go on while the cluster is down to one broker, when they matter most (README, "Pointing it
at a real cluster").  Topics that exist are left as they are and checked: a setting that holds the
monitor's writes up in the failures it must report is named.  docker-compose.yml runs this command
once the brokers answer, instead of Kafka's shell scripts.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Optional

#: what the README tells a user to create (tests/integration/test_dashboards.py holds them together)
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 1
EVENTS_PARTITIONS = 6
ALERTS_PARTITIONS = 3
EVENTS_RETENTION_MS = 6 * 3600 * 1000       # hours are plenty: the job reads them within seconds
ALERTS_RETENTION_MS = 7 * 24 * 3600 * 1000  # a week of transitions for replay's comparison

DESCRIPTION = f"""\
Create the monitor's topics on the cluster of the events topic, if they do not exist:
  the events topic  {EVENTS_PARTITIONS} partitions, retention {EVENTS_RETENTION_MS // 3_600_000} h
  the alerts topic  {ALERTS_PARTITIONS} partitions, retention {ALERTS_RETENTION_MS // 86_400_000} days
both with replication factor {REPLICATION_FACTOR} and min.insync.replicas={MIN_INSYNC_REPLICAS}, so the
monitor's own writes go on while the cluster is down to one broker. Existing topics are not changed;
their replication factor and min.insync.replicas are checked and a risky one is named.

Waits up to --wait seconds for the cluster to answer with at least --replication-factor brokers
(a cluster still starting). Exit status 0 when both topics exist afterwards, 1 when the cluster
did not answer in time, 2 when a topic cannot be created (too few brokers, permission refused).
"""


class TopicsError(RuntimeError):
    """What stops the topics from being created, said for the operator."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    retention_ms: int

    def config(self) -> dict[str, str]:
        return {"min.insync.replicas": str(MIN_INSYNC_REPLICAS), "retention.ms": str(self.retention_ms)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bootstrap-servers", required=True, help="the cluster that holds (or will hold) the topics")
    ap.add_argument("--events-topic", default="kafka-monitor.events", help="default kafka-monitor.events")
    ap.add_argument("--alerts-topic", default="kafka-monitor.alerts", help="default kafka-monitor.alerts")
    ap.add_argument("--replication-factor", type=int, default=REPLICATION_FACTOR,
                    help=f"default {REPLICATION_FACTOR}; fewer only on a cluster that has fewer brokers")
    ap.add_argument("--wait", type=float, default=120.0, metavar="S",
                    help="seconds to wait for the cluster to answer with enough brokers (default 120)")
    ap.add_argument("-X", dest="kafka", action="append", metavar="KEY=VALUE",
                    help="librdkafka property for the admin client (SASL/SSL...); repeatable")


def _brokers(admin, timeout: float) -> int:
    return len(admin.list_topics(timeout=timeout).brokers)


def wait_for_brokers(admin, want: int, wait_s: float, say=print) -> int:
    """Until the cluster lists ``want`` brokers, at most ``wait_s``; the count seen last."""
    deadline, seen, told = time.monotonic() + wait_s, -1, 0.0
    while True:
        try:
            seen = _brokers(admin, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
        except Exception as e:  # noqa: BLE001 - not answering yet: the cluster may still be starting
            last = str(e)
        else:
            last = f"{seen} broker(s) registered"
            if seen >= want:
                return seen
        if time.monotonic() >= deadline:
            raise TopicsError(f"the cluster did not answer with {want} brokers within {wait_s:.0f}s ({last})")
        if time.monotonic() - told >= 10:
            say(f"waiting for {want} brokers: {last}")
            told = time.monotonic()
        time.sleep(1.0)


def describe(admin, names: list[str]) -> dict[str, tuple[int, int, Optional[int]]]:
    """name -> (partitions, replication factor, min.insync.replicas) of those that exist."""
    from confluent_kafka.admin import ConfigResource

    md = admin.list_topics(timeout=10).topics
    out = {}
    for name in names:
        t = md.get(name)
        if t is None or t.error is not None or not t.partitions:
            continue
        rf = min(len(p.replicas) for p in t.partitions.values())
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        cfg = admin.describe_configs([res])[res].result(timeout=10)
        entry = cfg.get("min.insync.replicas")
        out[name] = (len(t.partitions), rf, int(entry.value) if entry is not None and entry.value else None)
    return out


def ensure_topics(admin, specs: list[TopicSpec], replication_factor: int, say=print) -> list[str]:
    """Create the topics of ``specs`` that do not exist; check the others.  Returns warnings."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from monitor.access import kafka_error, missing_acl

    existing = describe(admin, [s.name for s in specs])
    missing = [s for s in specs if s.name not in existing]
    warnings = []
    for name, (parts, rf, min_isr) in existing.items():
        say(f"{name}: exists ({parts} partitions, replication factor {rf}, min.insync.replicas {min_isr}); left as is")
        if min_isr is not None and min_isr > 1:
            warnings.append(f"{name}: min.insync.replicas={min_isr} holds the monitor's writes up when the cluster is "
                            f"down to {min_isr - 1} broker(s); set it to 1 (kafka-configs --alter --add-config "
                            "min.insync.replicas=1)")
        if rf < replication_factor:
            warnings.append(f"{name}: replication factor {rf} < {replication_factor}: one broker lost can take the "
                            "monitor's own topic offline")
    if missing:
        futures = admin.create_topics([NewTopic(s.name, num_partitions=s.partitions, replication_factor=replication_factor,
                                                config=s.config()) for s in missing], request_timeout=30)
        for s in missing:
            try:
                futures[s.name].result(timeout=60)
            except KafkaException as e:
                err = kafka_error(e)
                if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    say(f"{s.name}: created meanwhile by someone else; left as is")
                    continue
                raise TopicsError(f"{s.name}: not created: {err.str() if err is not None else e}"
                                  + missing_acl(e, topic=("CREATE", s.name), cluster=("CREATE", "kafka-cluster"))) from None
            say(f"{s.name}: created ({s.partitions} partitions, replication factor {replication_factor}, "
                f"min.insync.replicas {MIN_INSYNC_REPLICAS}, retention {s.retention_ms // 1000} s)")
    return warnings


def run(args: argparse.Namespace, kafka: dict[str, str]) -> int:
    from confluent_kafka.admin import AdminClient

    if args.replication_factor < 1:
        print(f"error: --replication-factor must be >= 1, got {args.replication_factor}", file=sys.stderr)
        return 2
    admin = AdminClient({**kafka, "bootstrap.servers": args.bootstrap_servers, "log_level": 3})
    specs = [TopicSpec(args.events_topic, EVENTS_PARTITIONS, EVENTS_RETENTION_MS),
             TopicSpec(args.alerts_topic, ALERTS_PARTITIONS, ALERTS_RETENTION_MS)]
    try:
        wait_for_brokers(admin, args.replication_factor, args.wait, say=lambda m: print(m, flush=True))
    except TopicsError as e:
        print(f"error: {e}; is --bootstrap-servers right, and is the cluster up? (a cluster with fewer brokers: "
              "lower --replication-factor)", file=sys.stderr)
        return 1
    try:
        warnings = ensure_topics(admin, specs, args.replication_factor, say=lambda m: print(m, flush=True))
    except TopicsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0
