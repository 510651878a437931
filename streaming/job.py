"""The streaming job: events topic -> parse -> quality gate -> state -> sinks.

    source (kafka-monitor-kafka) -> from_json(EVENT_SCHEMA) -> gate (reason or null)
      -> bucket = pmod(xxhash64(entity), buckets), or -1 for quarantined rows
      -> groupBy(bucket).applyInPandasWithState(streaming.state)   [update mode, processing-time timeout]
      -> foreachBatch: the exporter applies the rows
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from monitor.contract import EVENT_TYPES, SUPPORTED_SCHEMAS
from streaming import state as st
from streaming.exporter import Exporter
from streaming.schema import EVENT_SCHEMA
from streaming.source import FORMAT, KafkaEventSource

log = logging.getLogger(__name__)

STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


class JobConfigError(ValueError):
    pass


@dataclass
class JobConfig:
    bootstrap_servers: str
    checkpoint_dir: str
    events_topic: str = "kafka-monitor.events"
    trigger_s: float = 5.0
    max_offsets_per_trigger: Optional[int] = 500_000
    starting_offsets: str = "earliest"
    buckets: int = 16
    entity_ttl_s: float = 900.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9465
    state_store: str = "hdfs"
    shuffle_partitions: Optional[int] = None  # default: the cores Spark has
    master: Optional[str] = None               # default: local[*] unless spark-submit set one
    kafka: dict[str, str] = field(default_factory=dict)

    def validate(self) -> "JobConfig":
        if not self.bootstrap_servers:
            raise JobConfigError("job.bootstrap_servers: required")
        if not self.checkpoint_dir:
            raise JobConfigError("job.checkpoint_dir: required (a durable directory; the job resumes from it)")
        if not self.trigger_s > 0:
            raise JobConfigError(f"job.trigger_s: must be > 0, got {self.trigger_s}")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger <= 0:
            raise JobConfigError("job.max_offsets_per_trigger: must be > 0")
        if not 1 <= self.buckets <= 4096:
            raise JobConfigError(f"job.buckets: must be in 1..4096, got {self.buckets}")
        if not self.entity_ttl_s > 0:
            raise JobConfigError("job.entity_ttl_s: must be > 0")
        if self.state_store not in STATE_STORES:
            raise JobConfigError(f"job.state_store: must be one of {', '.join(STATE_STORES)}")
        if not 0 <= self.metrics_port <= 65535:
            raise JobConfigError("job.metrics_port: must be a TCP port (0 = any free port)")
        return self


def spark_session(cfg: JobConfig, app_name: str = "kafka-monitor") -> SparkSession:
    # Workers must run this interpreter (it has pyarrow, pandas, confluent-kafka); otherwise
    # the real error surfaces only as "Python worker failed to connect back".
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # pandas warns inside PySpark's worker when it concatenates frames with all-null columns
    os.environ.setdefault("PYTHONWARNINGS", "ignore:The behavior of DataFrame concatenation:FutureWarning")
    b = SparkSession.builder.appName(app_name)
    # Under spark-submit the JVM already runs with its --master (and it set PYSPARK_GATEWAY_PORT).
    if cfg.master or not os.environ.get("PYSPARK_GATEWAY_PORT"):
        b = b.master(cfg.master or "local[*]")
    cores = os.cpu_count() or 2
    b = (b.config("spark.sql.shuffle.partitions", str(cfg.shuffle_partitions or cores))
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.streaming.stateStore.providerClass", STATE_STORES[cfg.state_store])
         .config("spark.sql.execution.pyspark.udf.faulthandler.enabled", "true")
         .config("spark.python.worker.reuse", "true"))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_spark(spark: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop the session and wait for its JVM to exit.  The JVM otherwise lives until this
    Python process exits (it watches our end of its stdin pipe) and is then left as a zombie
    of whoever inherits it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None:
        return
    try:
        gateway.shutdown()
    except Exception:  # already gone
        pass
    SparkContext._gateway = None
    SparkContext._jvm = None
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout_s)
    except Exception:
        proc.kill()
        proc.wait(10)


def parse(raw: DataFrame) -> DataFrame:
    """Raw records -> one flat row per event with ``reason`` (null when the event is good)."""
    ev = raw.select(F.col("value").alias("raw"), F.from_json("value", EVENT_SCHEMA).alias("e"))
    d = "e.data."
    required_by_type = {
        "partition_metadata": ["topic", "partition", "leader", "replicas", "isr"],
        "partition_offsets": ["topic", "partition", "high_watermark"],
        "group_offsets": ["group", "topic", "partition"],
        "heartbeat": ["interval_ms"],
    }
    missing_payload = F.lit(False)
    for etype, fields in required_by_type.items():
        cond = F.lit(False)
        for f in fields:
            cond = cond | F.col(d + f).isNull()
        missing_payload = missing_payload | ((F.col("e.type") == etype) & cond)
    reason = (F.when(F.col("e").isNull() | F.col("e.schema").isNull() & F.col("e.type").isNull(), "malformed_json")
              .when(~F.col("e.schema").isin(*SUPPORTED_SCHEMAS) | F.col("e.schema").isNull(), "unknown_schema")
              .when(~F.col("e.type").isin(*EVENT_TYPES) | F.col("e.type").isNull(), "unknown_type")
              .when(F.col("e.event_id").isNull() | F.col("e.cluster").isNull() | F.col("e.source").isNull()
                    | F.col("e.seq").isNull() | F.col("e.observed_at").isNull(), "missing_envelope")
              .when(F.col("e.data").isNull() | missing_payload, "missing_field")
              .when((F.col("e.data.partition") < 0) | (F.col("e.data.high_watermark") < 0)
                    | (F.col("e.data.committed_offset") < 0), "out_of_range"))
    entity = (F.when(F.col("e.type").isin("partition_metadata", "partition_offsets"),
                     F.concat_ws("/", "e.cluster", d + "topic", F.col(d + "partition").cast("string")))
              .when(F.col("e.type") == "group_offsets",
                    F.concat_ws("/", "e.cluster", d + "group", d + "topic", F.col(d + "partition").cast("string")))
              .otherwise(F.concat_ws("/", "e.cluster", "e.source")))
    return ev.select(
        reason.alias("reason"), "raw", entity.alias("entity"),
        F.col("e.type").alias("type"), F.col("e.cluster").alias("cluster"), F.col("e.source").alias("source"),
        F.col("e.seq").alias("seq"), F.col("e.observed_at").alias("observed_at"),
        F.col(d + "topic").alias("topic"), F.col(d + "partition").alias("partition"),
        F.col(d + "group").alias("group"), F.col(d + "leader").alias("leader"),
        F.col(d + "leader_epoch").alias("leader_epoch"), F.col(d + "replicas").alias("replicas"),
        F.col(d + "isr").alias("isr"), F.col(d + "offline_replicas").alias("offline_replicas"),
        F.col(d + "min_insync_replicas").alias("min_insync_replicas"),
        F.col(d + "high_watermark").alias("high_watermark"), F.col(d + "log_start_offset").alias("log_start_offset"),
        F.col(d + "last_stable_offset").alias("last_stable_offset"),
        F.col(d + "committed_offset").alias("committed_offset"), F.col(d + "interval_ms").alias("interval_ms"),
        F.col(d + "events_dropped").alias("events_dropped"),
    )


STATEFUL_TYPES = ("partition_metadata", "partition_offsets", "group_offsets", "heartbeat")


def stateful(parsed: DataFrame, cfg: JobConfig) -> DataFrame:
    keep = (parsed.where(F.col("reason").isNotNull() | F.col("type").isin(*STATEFUL_TYPES))
            # only a quarantined row needs its raw text (as a sample in the quarantine count)
            .withColumn("raw", F.when(F.col("reason").isNotNull(), F.substring("raw", 1, 300))))
    bucket = F.when(F.col("reason").isNotNull(), F.lit(st.QUARANTINE_BUCKET)).otherwise(
        F.pmod(F.xxhash64("entity"), F.lit(cfg.buckets)).cast("int"))
    return keep.withColumn("bucket", bucket).groupBy("bucket").applyInPandasWithState(
        st.make_state_function(int(cfg.entity_ttl_s * 1000)),
        outputStructType=st.OUTPUT_SCHEMA,
        stateStructType=st.STATE_SCHEMA,
        outputMode="update",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def read_events(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    spark.dataSource.register(KafkaEventSource)
    r = (spark.readStream.format(FORMAT)
         .option("subscribe", cfg.events_topic)
         .option("startingOffsets", cfg.starting_offsets)
         .option("kafka.bootstrap.servers", cfg.bootstrap_servers))
    if cfg.max_offsets_per_trigger:
        r = r.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    for k, v in cfg.kafka.items():
        r = r.option(f"kafka.{k}", v)
    return r.load()


class ExporterSink:
    """foreachBatch target: applies each batch's rows to the exporter."""

    def __init__(self, exporter: Exporter):
        self.exporter = exporter

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        rows = [r.asDict() for r in df.collect()]
        n = self.exporter.apply(rows, batch_id=batch_id)
        self.exporter.batch_done(n, time.monotonic() - t0, time.time())


def start(spark: SparkSession, cfg: JobConfig, exporter: Exporter, query_name: str = "kafka-monitor") -> StreamingQuery:
    cfg.validate()
    out = stateful(parse(read_events(spark, cfg)), cfg)
    q = (out.writeStream.queryName(query_name)
         .outputMode("update")
         .option("checkpointLocation", cfg.checkpoint_dir)
         .trigger(processingTime=f"{cfg.trigger_s} seconds")
         .foreachBatch(ExporterSink(exporter))
         .start())
    exporter.set_up(True)
    return q


def stop_query(q: StreamingQuery, timeout_s: float = 60.0) -> None:
    """Stop between batches where possible: a stop during a running batch can kill the stream
    thread mid-batch (seen as a StackOverflowError in Spark 4.1); the checkpoint makes the next
    start correct either way."""
    deadline = time.monotonic() + timeout_s
    while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    q.stop()


def run(cfg: JobConfig, stop_event: Any = None, on_started: Any = None) -> None:
    """Run the job until ``stop_event`` is set (or forever); serve metrics meanwhile."""
    cfg.validate()
    exporter = Exporter()
    port = exporter.serve(cfg.metrics_port, cfg.metrics_host)
    log.info("metrics on http://%s:%d/metrics", cfg.metrics_host, port)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    spark = spark_session(cfg)
    for s, h in handlers.items():  # SparkContext replaced SIGINT with its cancel-all-jobs handler
        signal.signal(s, h)
    q = start(spark, cfg, exporter)
    if on_started:
        on_started(port)
    try:
        while q.isActive and not (stop_event is not None and stop_event.is_set()):
            q.awaitTermination(1)
        if q.exception() is not None:
            exporter.set_up(False)
            raise RuntimeError(f"streaming query failed: {q.exception()}")
    finally:
        if q.isActive:
            stop_query(q)
        exporter.shutdown()
