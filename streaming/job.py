"""The streaming job: events topic -> parse and quality gate -> state -> sinks.

    source (kafka-monitor-kafka) -> mapInArrow(streaming.ingest.parsing: decode, flatten, GX gate; reason or null;
         bucket = pmod(xxhash64(bucket_key), buckets), or -1 for quarantined rows; the rows of each
         bucket packed in one Arrow IPC value: streaming.ingest.packing)
      -> groupBy(bucket).applyInPandasWithState(unpack, then streaming.state.function)   [update mode,
         processing-time timeout]
      -> foreachBatch: the exporter applies the rows (and with job.archive_dir, the rows each bucket
         received, packed by the state function, are written to the event archive: docs/archive.md)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import sys
import threading
import time
import typing
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from streaming.ingest import packing, parsing
from streaming.ingest.packing import bucket_keys, spark_hash_int  # noqa: F401  (re-exported)
from streaming.rules import client as rules_client
from streaming.rules import group as rules_group
from streaming.rules import lag_config as rules_lag_config
from streaming.rules import logdirs as rules_logdirs
from streaming.rules import notify as rules_notify
from streaming.rules import partition as rules_partition
from streaming.rules import quorum as rules_quorum
from streaming.rules import source as rules_source
from streaming.rules import transactions as rules_transactions
from streaming.read import spark_kafka
from streaming.state import function as st
from streaming.state.codec import STATE_SCHEMA
from streaming.state.rows import OUTPUT_SCHEMA
from streaming.sinks.alerts import AlertsTopicSink
from streaming.sinks.archive import ArchiveFiles
from streaming.sinks.batch import ExporterSink
from streaming.sinks.catalogue import GRANULARITIES
from streaming.sinks.exporter import Exporter
from streaming.sinks.progress import ProgressListener
from streaming.sinks.quarantine import QuarantineFiles
from streaming.ingest.schema import FLAT_COLUMNS  # noqa: F401  (re-exported)
from streaming.read.source import FORMAT, KafkaEventSource
from streaming.watchdog import Watchdog

log = logging.getLogger(__name__)

STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


class JobConfigError(ValueError):
    pass


#: [job.rules.<family>] -> the settings class of that family of rules
RULE_FAMILIES = {"lag": rules_lag_config.LagConfig, "partition": rules_partition.PartitionRulesConfig,
                 "group": rules_group.GroupRulesConfig, "client": rules_client.ClientRulesConfig,
                 "source": rules_source.SourceRulesConfig, "quorum": rules_quorum.QuorumRulesConfig,
                 "log_dirs": rules_logdirs.LogDirRulesConfig, "transactions": rules_transactions.TransactionRulesConfig,
                 "notify": rules_notify.NotifyConfig}
#: the families the state function takes (notify is the exporter's: when an open alert pages)
STATE_FAMILIES = ("lag", "partition", "group", "client", "source", "quorum", "log_dirs", "transactions")
#: settings that moved to a table of their own: (old family, name) -> the families that read it
#: now.  Still read at the old place, with a warning; a value set at the new place wins.
MOVED_RULES: dict[tuple[str, str], tuple[str, ...]] = {
    ("group", "metadata_max_age_default_ms"): ("client",),
    ("group", "metadata_stale_factor"): ("client",),
    ("group", "refresh_storm_max"): ("client",),
    ("group", "refresh_storm_clear"): ("client",),
    ("group", "refresh_storm_window_ms"): ("client",),
    ("group", "refresh_history_cap"): ("client",),
    ("group", "silent_factor"): ("source",),
    ("group", "heartbeat_interval_default_ms"): ("source",),
    ("group", "silence_grace_ms"): ("client", "source"),
}


def moved_rules(rules: dict[str, Any]) -> tuple[dict[str, Any], dict[tuple[str, str], str], list[str]]:
    """``rules`` ([job.rules.*] as given) with each setting of ``MOVED_RULES`` found at its old
    place put in its new tables; where those values were set ((family, name) -> path); and a
    warning per setting found at its old place."""
    out = {f: dict(v) if isinstance(v, dict) else v for f, v in (rules or {}).items()}
    origin: dict[tuple[str, str], str] = {}
    warnings = []
    for (old, name), families in MOVED_RULES.items():
        if not isinstance(out.get(old), dict) or name not in out[old]:
            continue
        value = out[old].pop(name)
        path = f"job.rules.{old}.{name}"
        taken = [f for f in families if not (isinstance(out.get(f), dict) and name in out[f])]
        for f in taken:
            out.setdefault(f, {})[name] = value
            origin[(f, name)] = path
        given = " and ".join(f"[job.rules.{f}]" for f in families if f not in taken)
        if not given:
            then = "taken from here until then"
        elif not taken:
            then = f"ignored here: {given} sets it"
        else:
            then = f"taken from here for {' and '.join(f'[job.rules.{f}]' for f in taken)} until then; {given} sets its own"
        where = " and ".join(f"[job.rules.{f}] (KAFKA_MONITOR_JOB_RULES_{f.upper()}_{name.upper()})" for f in families)
        warnings.append(f"{path}: this setting is read from {where} now; move it there ({then})")
    return out, origin, warnings


def _rule_value(path: str, typ: Any, value: Any) -> Any:
    """A rule setting from TOML (typed already) or the environment (text), to its type."""
    optional = type(None) in typing.get_args(typ)
    base = next((a for a in typing.get_args(typ) if a is not type(None)), typ) if optional else typ
    if isinstance(value, str):
        text = value.strip().lower()
        if optional and text in ("", "none", "off"):
            return None
        try:
            return int(text) if base is int else float(text) if base is float else value
        except ValueError:
            raise JobConfigError(f"{path}: must be {'an integer' if base is int else 'a number'}"
                                 f"{' (or none to disable)' if optional else ''}, got {value!r}") from None
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


#: seconds a JVM that went away is given to turn out to be our own stop (a signal to the group)
STOP_GRACE_S = 2.0


class JobFailed(RuntimeError):
    """The streaming query failed (its exception is in the message)."""


class JobStalled(JobFailed):
    """No micro-batch completed for ``stall_timeout_s`` (``streaming.watchdog``)."""


@dataclass
class JobConfig:
    bootstrap_servers: str
    checkpoint_dir: str
    events_topic: str = "kafka-monitor.events"
    trigger_s: float = 5.0
    max_offsets_per_trigger: Optional[int] = 500_000
    starting_offsets: str = "earliest"
    #: with false, records deleted by retention before they were read are skipped instead of failing
    fail_on_data_loss: bool = True
    #: "python": our confluent-kafka data source; "spark-kafka": Spark's built-in kafka source
    #: (needs spark-sql-kafka-0-10 on the classpath, see streaming.read.spark_kafka)
    source: str = "python"
    buckets: int = 16
    entity_ttl_s: float = 900.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9465
    #: /metrics over HTTPS: PEM certificate (chain) and key files; with a client CA, scrapers must
    #: present a certificate it signed (prometheus-client's TLS; it has no basic auth)
    metrics_tls_cert: Optional[str] = None
    metrics_tls_key: Optional[str] = None
    metrics_tls_client_ca: Optional[str] = None
    #: entity series the exporter keeps at most (6 per partition, 4 per group partition, ...);
    #: what the cap refuses is counted in kafka_monitor_exporter_series_refused_total
    max_series: int = 200_000
    #: partition: every partition's and group partition's gauges; topic: only their per-topic
    #: aggregates (served at both), for a Prometheus that cannot take a series per partition
    metrics_granularity: str = "partition"
    state_store: str = "hdfs"
    shuffle_partitions: Optional[int] = None  # default: the cores Spark has
    master: Optional[str] = None               # default: local[*] unless spark-submit set one
    #: alert transitions are published here (keyed by alert id); empty: not published
    alerts_topic: str = "kafka-monitor.alerts"
    #: quarantined events (with their reason) are written here as JSON lines, one file per
    #: micro-batch; default: <checkpoint_dir>/quarantine
    quarantine_dir: Optional[str] = None
    #: the quarantine files are kept to this many MiB in all: past it the oldest batches' files
    #: are deleted (never the newest); see QuarantineFiles
    quarantine_max_mb: int = 256
    #: the event archive: every event the state receives, as parsed, in Parquet files partitioned
    #: by cluster and hour (a local path or a URI pyarrow knows: hdfs://, s3://, gs://, ...);
    #: empty: no archive (streaming.sinks.archive, docs/archive.md)
    archive_dir: Optional[str] = None
    #: the archive's hours are deleted this many hours after they end; 0: kept for ever
    archive_retention_h: int = 168
    #: a record value longer than this is quarantined (oversized) without being decoded
    max_event_bytes: int = 65_536
    #: observed_at may be this far after / before the record's Kafka timestamp (else
    #: event_time_ahead / event_time_behind); 0: not checked
    max_clock_skew_s: float = 300.0
    #: no micro-batch completed for this long: job_up 0 and the job exits (status 3); 0: off
    stall_timeout_s: float = 600.0
    kafka: dict[str, str] = field(default_factory=dict)
    #: the alert rules' thresholds: [job.rules.lag], [job.rules.partition], [job.rules.group],
    #: [job.rules.client], [job.rules.source], and when alerts opened at once notify,
    #: [job.rules.notify] (RULE_FAMILIES; docs/settings.md, "Alert rule settings")
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for warning in moved_rules(self.rules)[2]:
            log.warning("%s", warning)

    def rule_configs(self) -> dict[str, Any]:
        """The rule families' settings objects, from ``rules`` over their defaults; a wrong or
        unknown setting raises JobConfigError naming it where it was set (``job.rules.lag.window:
        ...``).  Settings at their old place are read from there (``MOVED_RULES``)."""
        rules, origin, _ = moved_rules(self.rules)
        unknown = set(rules) - set(RULE_FAMILIES)
        if unknown:
            raise JobConfigError(f"job.rules.{sorted(unknown)[0]}: unknown rule family "
                                 f"(families: {', '.join(RULE_FAMILIES)})")

        def path(family: str, name: str) -> str:
            return origin.get((family, name), f"job.rules.{family}.{name}")

        out = {}
        for family, cls in RULE_FAMILIES.items():
            given = rules.get(family) or {}
            hints = typing.get_type_hints(cls)
            names = [f.name for f in dataclasses.fields(cls)]
            kw = {}
            for name, value in given.items():
                if name not in names:
                    raise JobConfigError(f"job.rules.{family}.{name}: unknown setting (settings: {', '.join(names)})")
                kw[name] = _rule_value(path(family, name), hints[name], value)
            try:
                out[family] = cls(**kw)
            except ValueError as e:  # the class names the setting its own way: name it where it was set
                field_name = re.match(r"^\w+\.(\w+)", str(e))
                where = path(family, field_name.group(1)) if field_name else f"job.rules.{family}"
                raise JobConfigError(re.sub(r"^\w+\.\w+", where, str(e), count=1)) from None
        return out

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
        if self.source not in spark_kafka.SOURCES:
            raise JobConfigError(f"job.source: must be one of {', '.join(spark_kafka.SOURCES)}, got {self.source!r}")
        try:
            spark_kafka.parse_starting_offsets(self.starting_offsets)
        except ValueError as e:
            raise JobConfigError(str(e)) from None
        if self.state_store not in STATE_STORES:
            raise JobConfigError(f"job.state_store: must be one of {', '.join(STATE_STORES)}")
        if self.max_series < 0:
            raise JobConfigError(f"job.max_series: must be >= 0, got {self.max_series}")
        self.rule_configs()
        if self.metrics_granularity not in GRANULARITIES:
            raise JobConfigError(f"job.metrics_granularity: must be one of {', '.join(GRANULARITIES)}, "
                                 f"got {self.metrics_granularity!r}")
        if not 0 <= self.metrics_port <= 65535:
            raise JobConfigError("job.metrics_port: must be a TCP port (0 = any free port)")
        if bool(self.metrics_tls_cert) != bool(self.metrics_tls_key) or (self.metrics_tls_client_ca and not self.metrics_tls_cert):
            raise JobConfigError("job.metrics_tls_cert and job.metrics_tls_key: give both (HTTPS) or neither; "
                                 "job.metrics_tls_client_ca needs them")
        if not 1024 <= self.max_event_bytes <= (64 << 20):
            raise JobConfigError(f"job.max_event_bytes: must be in 1024..67108864, got {self.max_event_bytes}")
        if not self.quarantine_max_mb > 0:
            raise JobConfigError(f"job.quarantine_max_mb: must be > 0 (MiB of quarantine files kept; past it the "
                                 f"oldest are deleted), got {self.quarantine_max_mb}")
        if self.archive_retention_h < 0:
            raise JobConfigError(f"job.archive_retention_h: must be >= 0 (hours an archived hour is kept after it "
                                 f"ends; 0 = kept for ever), got {self.archive_retention_h}")
        if not self.max_clock_skew_s >= 0:
            raise JobConfigError(f"job.max_clock_skew_s: must be >= 0 (0 = not checked), "
                                 f"got {self.max_clock_skew_s}")
        if self.stall_timeout_s != 0 and not self.stall_timeout_s >= 3 * self.trigger_s:
            raise JobConfigError(f"job.stall_timeout_s: must be 0 (off) or at least 3 triggers "
                                 f"({3 * self.trigger_s:g}s), got {self.stall_timeout_s}")
        return self

    def limits(self) -> parsing.Limits:
        return parsing.Limits(max_event_bytes=self.max_event_bytes,
                              max_clock_skew_ms=int(self.max_clock_skew_s * 1000))


def spark_session(cfg: JobConfig, app_name: str = "kafka-monitor") -> SparkSession:
    # Workers must run this interpreter (it has pyarrow, pandas, confluent-kafka); otherwise
    # the real error surfaces only as "Python worker failed to connect back".
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))  # spark-submit started the JVM, with its --master
    if not submitted and (cfg.master or "local").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # one machine: loopback only
    # pandas warns inside PySpark's worker when it concatenates frames with all-null columns
    os.environ.setdefault("PYTHONWARNINGS", "ignore:The behavior of DataFrame concatenation:FutureWarning")
    # py4j logs every command it sends at DEBUG, the Kafka options (SASL passwords) among them
    if logging.getLogger("py4j").getEffectiveLevel() < logging.INFO:
        logging.getLogger("py4j").setLevel(logging.INFO)
    from pyspark import SparkConf, SparkContext

    # what spark-submit (--conf, --master, spark-defaults.conf) set: the operator's word wins.
    # SparkConf() reads them only from a running JVM (before, it is an empty Python dict).
    SparkContext._ensure_initialized()
    preset = SparkConf()
    b = SparkSession.builder.appName(app_name)
    if cfg.master or not submitted:
        b = b.master(cfg.master or "local[*]")
    master = cfg.master or preset.get("spark.master", "local[*]")
    defaults = {"spark.sql.shuffle.partitions": str(cfg.shuffle_partitions or os.cpu_count() or 2),
                "spark.ui.enabled": "false"}
    if master.startswith("local"):  # one machine: the driver on loopback; a cluster's executors must reach it
        defaults.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    for key, value in defaults.items():
        if not preset.contains(key) or (key == "spark.sql.shuffle.partitions" and cfg.shuffle_partitions):
            b = b.config(key, value)
    # spark-submit turns progress bars on for "pyspark-shell" (how PySpark starts its JVM): not
    # the operator's word, and bars in a long-running job's log are noise
    b = (b.config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.streaming.stateStore.providerClass", STATE_STORES[cfg.state_store])
         .config("spark.sql.execution.pyspark.udf.faulthandler.enabled", "true")
         .config("spark.python.worker.reuse", "true")
         # workers are forked with the quality gate's GX objects already built (streaming.sparkworker)
         .config("spark.python.daemon.module", "streaming.sparkworker"))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_active_spark() -> None:
    """Stop this process's active Spark session, if it has one, unless its JVM is gone already:
    a Ctrl-C in the terminal, or a SIGTERM to the process group, reaches the JVM too (asking it
    for the session then raises)."""
    from py4j.protocol import Py4JError
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or (proc is not None and proc.poll() is not None):
        return
    try:
        spark = SparkSession.getActiveSession()
    except (Py4JError, OSError):  # the JVM went away meanwhile
        return
    if spark is not None:
        stop_spark(spark)


def stop_spark(spark: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop the session and wait for its JVM to exit.  The JVM otherwise lives until this
    Python process exits (it watches our end of its stdin pipe) and is then left as a zombie
    of whoever inherits it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None or gateway is None:
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


#: contract type -> the kind of entity its state lives in
ENTITY_OF_TYPE = {
    "partition_metadata": "partition", "partition_offsets": "partition", "group_offsets": "group_partition",
    "group_state": "group", "rebalance": "group", "metadata_refresh": "client", "heartbeat": "source",
    "client_fetch": "client_fetch", "canary": "canary", "broker_state": "broker",
    "client_produce": "client_produce", "quorum_state": "quorum", "log_dirs": "log_dirs",
    "transactions": "transactions", "ha_member": "ha",
    # a deleted entity: the state function drops it (and a group's partitions with a group)
    "partition_gone": "partition", "group_gone": "group", "group_partition_gone": "group_partition",
    "partition_count_change": "topic",  # derived: one row per metadata_refresh.partition_count_changes entry
}


def parse(raw: DataFrame, cfg: Optional[JobConfig] = None) -> DataFrame:
    """Raw records (a ``value`` column of JSON text, and the record ``timestamp`` in ms when
    the frame has one) -> one flat row per observation
    (FLAT_COLUMNS), plus one per partition-count change a good metadata refresh reports, with
    ``reason`` set when the event breaks the contract (decoding, then the great-expectations
    suite): one Python pass over Arrow per task (``streaming.ingest.parsing``, with ``cfg``'s limits).
    A row with a reason keeps a sample of its raw text and its size, for the quarantine sink.

    ``entity`` is the state key (``<kind>|<cluster>/...``); ``bucket_key`` is what is hashed
    into a grouping key: a group's partitions share the group's bucket key so group rules can
    see their lags; a client and a source share theirs."""
    limits = cfg.limits() if cfg is not None else parsing.LIMITS
    return _values(raw).mapInArrow(partial(parsing.parse_batches, limits=limits), parsing.FLAT_DDL)


def _values(raw: DataFrame) -> DataFrame:
    """The columns the parse reads: ``value`` as text, and the record ``timestamp`` in ms if any."""
    cols = [F.col("value").cast("string").alias("value")]
    if "timestamp" in raw.columns:
        cols.append(F.col("timestamp").cast("long").alias("timestamp"))
    return raw.select(*cols)


def state_config(cfg: JobConfig, run_id: str, archive: bool = False) -> st.StateConfig:
    """The state function's settings from the job's: what the job runs, and what
    ``kafka-monitor replay`` runs with a job's config (one construction for both)."""
    return st.StateConfig(entity_ttl_ms=int(cfg.entity_ttl_s * 1000), run_id=run_id, archive=archive,
                          **{f: c for f, c in cfg.rule_configs().items() if f in STATE_FAMILIES})


def packed(raw: DataFrame, cfg: JobConfig) -> DataFrame:
    """Raw records -> ``parse``'s rows that the state takes (quarantined ones and those of a
    stateful type), packed: one row per bucket and chunk of a task (``packing.PACKED_DDL``)."""
    fn = partial(parsing.pack_batches, limits=cfg.limits(), keys=bucket_keys(cfg.buckets),
                 stateful=sorted(ENTITY_OF_TYPE))
    return _values(raw).mapInArrow(fn, packing.PACKED_DDL)


def stateful(packed_rows: DataFrame, cfg: JobConfig) -> DataFrame:
    fn = st.make_state_function(state_config(cfg, run_id=uuid.uuid4().hex, archive=bool(cfg.archive_dir)))

    def update_bucket(key: tuple, pdfs: Any, state: Any) -> Any:
        return fn(key, packing.unpack(pdfs), state)
    return packed_rows.groupBy("bucket").applyInPandasWithState(
        update_bucket,
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="update",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def read_events(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """The events topic as records with our source's columns (key, value, topic, partition,
    offset, timestamp ms), read by the source ``cfg.source`` names."""
    if cfg.source == "spark-kafka":
        return _read_spark_kafka(spark, cfg)
    spark.dataSource.register(KafkaEventSource)
    r = (spark.readStream.format(FORMAT)
         .option("subscribe", cfg.events_topic)
         .option("startingOffsets", cfg.starting_offsets)
         .option("failOnDataLoss", "true" if cfg.fail_on_data_loss else "false")
         # a large batch is read by up to one task per core (a small one by one task)
         .option("maxTasks", str(spark.sparkContext.defaultParallelism))
         .option("kafka.bootstrap.servers", cfg.bootstrap_servers))
    if cfg.max_offsets_per_trigger:
        r = r.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    for k, v in cfg.kafka.items():
        r = r.option(f"kafka.{k}", v)
    return r.load()


def _read_spark_kafka(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    try:
        opts = spark_kafka.options(cfg)
    except ValueError as e:
        raise JobConfigError(str(e)) from None
    owned = sorted(set(cfg.kafka) & spark_kafka.SOURCE_OWNED)
    if owned:
        log.warning("job.kafka: %s not passed to Spark's kafka source (it sets them itself)", ", ".join(owned))
    try:
        raw = spark.readStream.format(spark_kafka.FORMAT).options(**opts).load()
    except Exception as e:  # AnalysisException (KAFKA_DATA_SOURCE_NOT_ENABLED) or a missing class
        if spark_kafka.is_missing_source(e):
            raise JobConfigError(spark_kafka.missing_source_message(spark.version, e)) from None
        raise
    return spark_kafka.records(raw)


#: Spark gives a new Python worker 10 s to connect back to the JVM (a constant in Spark 4.x's
#: PythonWorkerFactory.createSimpleWorker, no setting).  Our source's runner is such a worker,
#: started when a query sets up its sources; it imports PySpark from pyspark.zip, compiled from
#: source every time (~1 CPU-s).  On a busy host that can take over 10 s, and the query fails
#: there, before its first batch, with nothing read or committed.  ``start_query`` then starts it
#: again, at most this many times in all (CI once saw three in a row fail, a test at nice 10 beside
#: a busy real-cluster test: each attempt is another 10 s, and the load comes and goes).
SOURCE_START_ATTEMPTS = 6
#: how long ``start`` waits for the query's sources to be set up (a source that takes longer is
#: left to the caller: the query runs on, and the stall watchdog watches it)
SOURCE_START_WAIT_S = 120.0
_CONNECT_BACK = "Python worker failed to connect back"


def start(spark: SparkSession, cfg: JobConfig, exporter: Exporter, query_name: str = "kafka-monitor") -> StreamingQuery:
    """Start the query and return it once its sources are set up (``start_query``)."""
    cfg.validate()
    return start_query(lambda: _start(spark, cfg, exporter, query_name), lambda q: stop_query(q, 0.0))


def start_query(begin: Callable[[], StreamingQuery],
                cleanup: Callable[[StreamingQuery], Any] = lambda q: q.stop()) -> StreamingQuery:
    """``begin()`` starts a query; return it once its sources are set up.  When it fails there
    with Spark's connect-back failure, ``cleanup`` gets it and it is started again from its
    checkpoint, SOURCE_START_ATTEMPTS in all; any other outcome is returned as it is."""
    attempt = 1
    while True:
        q = begin()
        failed = _source_start_failure(q, SOURCE_START_WAIT_S)
        if failed is None or attempt >= SOURCE_START_ATTEMPTS:
            return q
        log.warning("the query's source did not start (attempt %d of %d): %s. Spark gives a new Python "
                    "worker 10 s to connect back: this host is very busy. Starting the query again from "
                    "its checkpoint.", attempt, SOURCE_START_ATTEMPTS, failed.splitlines()[0])
        cleanup(q)
        attempt += 1


def _source_start_failure(q: StreamingQuery, timeout_s: float) -> Optional[str]:
    """Spark's connect-back failure if the query failed with it while setting up its sources;
    None once they are set up, or if it failed otherwise (the caller sees that as before)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = str(q.status.get("message") or "")
        ending = message == "Stopped" or message.startswith("Terminated with exception")
        if ending and q.isActive:
            # a failed query says so while it stops its sources, before it is inactive (seen in
            # CI on a busy host: the failure was then taken for a started query)
            with contextlib.suppress(Exception):  # its exception is read below
                q.awaitTermination(max(1, int(deadline - time.monotonic())))
        if not q.isActive:
            failed = str(q.exception() or "")
            return failed if _CONNECT_BACK in failed else None
        if not ending and message not in ("Initializing StreamExecution", "Initializing sources"):
            return None
        time.sleep(0.05)
    return None


def _start(spark: SparkSession, cfg: JobConfig, exporter: Exporter, query_name: str) -> StreamingQuery:
    out = stateful(packed(read_events(spark, cfg), cfg), cfg)
    alerts = None
    if cfg.alerts_topic:
        alerts = AlertsTopicSink({"bootstrap.servers": cfg.bootstrap_servers, **cfg.kafka}, cfg.alerts_topic,
                                 wait_query_id=True)
        alerts.recover()  # fails now, with a clear message, if the topic is missing
    quarantine = QuarantineFiles(cfg.quarantine_dir or os.path.join(cfg.checkpoint_dir, "quarantine"),
                                 cfg.quarantine_max_mb << 20)
    archive = ArchiveFiles(cfg.archive_dir, cfg.archive_retention_h) if cfg.archive_dir else None
    sink = ExporterSink(exporter, alerts, quarantine, archive)
    exporter.set_notify_holds(cfg.rule_configs()["notify"].holds_s())
    listener = ProgressListener(exporter)
    spark.streams.addListener(listener)
    q = (out.writeStream.queryName(query_name)
         .outputMode("update")
         .option("checkpointLocation", cfg.checkpoint_dir)
         .trigger(processingTime=f"{cfg.trigger_s} seconds")
         .foreachBatch(sink)
         .start())
    listener.query_id = str(q.id)
    if archive is not None:
        archive.query_id = str(q.id)  # its file names: kept across restarts from the checkpoint
    if alerts is not None:
        alerts.query_id = str(q.id)  # in its records; a new checkpoint's batch ids start again at 0
    _QUERIES[listener.query_id] = (spark, listener, sink)
    exporter.set_up(True)
    return q


#: query id -> (session, its progress listener, its sink), removed when the query is stopped
_QUERIES: dict[str, tuple[SparkSession, ProgressListener, ExporterSink]] = {}


def stop_query(q: StreamingQuery, timeout_s: float = 30.0) -> None:
    """Stop between batches where possible: a stop during a running batch interrupts it (an
    InterruptedException in the sink's collect, and in Spark 4.1 sometimes a StackOverflowError
    in the stream thread); the checkpoint makes the next start correct either way.  A busy
    query starts its next batch as soon as one ends, so wait for a batch to end and stop
    right then, rather than for an idle moment that may never come."""
    deadline = time.monotonic() + timeout_s
    def batch_id() -> Any:
        p: Any = q.lastProgress
        return p.get("batchId") if isinstance(p, dict) else getattr(p, "batchId", None)

    last = batch_id()
    while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
        if batch_id() != last:
            break  # a batch just completed
        time.sleep(0.05)
    q.stop()
    registered = _QUERIES.pop(str(q.id), None)
    if registered is not None:
        session, listener, sink = registered
        session.streams.removeListener(listener)
        if sink.alerts is not None:
            sink.alerts.close()  # its producer would otherwise live on, reconnecting to the cluster
        if sink.archive is not None:
            sink.archive.join(10.0)  # a retention pass under way


def run(cfg: JobConfig, stop_event: Any = None, on_started: Any = None, hard_exit: Any = None,
        exporter: Optional[Exporter] = None) -> None:
    """Run the job until ``stop_event`` is set (or forever); serve metrics meanwhile.  Raises
    ``JobFailed`` when the query fails and ``JobStalled`` when no batch completes for
    ``cfg.stall_timeout_s`` (``kafka_monitor_job_up`` is 0 by then).  ``hard_exit``: called if
    the process is still running a minute after a stall (the command line's ``os._exit``).
    ``exporter``: the one to serve (default: a new one)."""
    cfg.validate()
    exporter = exporter or Exporter(max_series=cfg.max_series, granularity=cfg.metrics_granularity)
    port = exporter.serve(cfg.metrics_port, cfg.metrics_host, certfile=cfg.metrics_tls_cert,
                          keyfile=cfg.metrics_tls_key, client_cafile=cfg.metrics_tls_client_ca)
    exporter.set_up(True)  # starting counts as up: a start-up that never ends is KafkaMonitorJobFallingBehind's
    log.info("metrics on %s://%s:%d/metrics", "https" if cfg.metrics_tls_cert else "http", cfg.metrics_host, port)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    spark = spark_session(cfg)
    for s, h in handlers.items():  # SparkContext replaced SIGINT with its cancel-all-jobs handler
        signal.signal(s, h)
    q = start(spark, cfg, exporter)

    def stalled(msg: str) -> None:
        exporter.set_up(False)
        log.error("%s", msg)

    watchdog = Watchdog(cfg.stall_timeout_s, stalled, hard_exit=hard_exit)
    qid = str(q.id)  # asked of the JVM: not possible once it is gone
    _QUERIES[qid][2].on_batch = watchdog.batch_done
    watchdog.start()
    if on_started:
        on_started(port)
    stuck = False
    stopping = lambda: stop_event is not None and stop_event.is_set()  # noqa: E731
    # A signal to the whole process group reaches the JVM and this process at once; the JVM's
    # shutdown hook can stop Spark before our handler has run: a JVM gone within this grace of
    # our stop is a stop, not a failure (seen with a busy CPU: "Cannot call methods on a stopped
    # SparkContext" from q.exception() after SIGTERM).
    stopped_with_us = lambda: stop_event is not None and stop_event.wait(STOP_GRACE_S)  # noqa: E731
    try:
        while not stopping():
            if watchdog.fired.wait(1.0):  # Python only: fires even if the JVM does not answer
                stuck = True
                raise JobStalled(watchdog.message)
            try:
                active = q.isActive
            except Exception as e:  # the JVM is gone: with us (a stop), or alone (a crash, the OOM killer)
                if stopped_with_us():
                    break
                exporter.set_up(False)
                raise JobFailed(f"Spark's JVM stopped answering: {e}") from None
            if not active:
                break
        try:
            failed: Any = q.exception() if not _spark_gone(spark) else \
                None if stopped_with_us() else "Spark stopped (its JVM exited or the SparkContext was stopped)"
        except Exception as e:  # the JVM went away between the two calls
            failed = None if stopped_with_us() else f"Spark's JVM stopped answering: {e}"
        if failed is not None:
            exporter.set_up(False)
            raise JobFailed(f"streaming query failed: {failed}")
    finally:
        if stuck:
            _stop_within(q, 30.0)  # the watchdog stays armed: its hard exit if this hangs
        else:
            watchdog.stop()  # a stop waits for the running batch: not a stall
            if stopping() and _spark_gone(spark):
                # SIGTERM to the whole process group (systemd's default KillMode): the JVM ran its
                # shutdown hook and stopped Spark before we could; the checkpoint holds the last
                # committed batch, the next start goes on from there
                log.info("stopped: Spark's JVM stopped with this process (the signal reached its process group)")
                registered = _QUERIES.pop(qid, None)
                if registered is not None and registered[2].alerts is not None:
                    registered[2].alerts.close()
            elif not _spark_gone(spark) and q.isActive:
                try:
                    stop_query(q)
                except Exception:
                    if not (stopping() and _spark_gone(spark)):
                        raise
                    # the shutdown hook stopped Spark while stop_query waited for the batch to end
                    # (seen in tests/e2e/test_recovery.py under load): the same clean stop as above
                    log.info("stopped: Spark's JVM stopped with this process (the signal reached its process "
                             "group) while the query was stopping")
        watchdog.stop()
        exporter.shutdown()


def _spark_gone(spark: SparkSession) -> bool:
    """True when the session's SparkContext was stopped, or its JVM no longer answers."""
    try:
        return bool(spark.sparkContext._jsc is None or spark.sparkContext._jsc.sc().isStopped())
    except Exception:
        return True


def _stop_within(q: StreamingQuery, timeout_s: float) -> None:
    """Stop a stuck query at once (no wait for its batch to end); give up after ``timeout_s``."""
    t = threading.Thread(target=stop_query, args=(q, 0.0), name="stop-stuck-query", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        log.error("the stuck query did not stop within %.0fs; leaving it to the process exit", timeout_s)
