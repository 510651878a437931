"""Spark's own ``kafka`` source as an alternative to ours (job setting ``source = "spark-kafka"``).

Needs org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version> and its dependencies on the
classpath (``spark-submit --packages ...``).  This module maps the job's settings to that source's
options (a pure function) and casts its records to the columns our source gives, so parse() and
everything after it are the same whichever source is chosen.

The ``[job.kafka]`` table is shared with librdkafka (the alerts producer), while Spark's source
hands ``kafka.*`` options to the Java client.  Most names are the same (bootstrap.servers,
security.protocol, sasl.mechanism, client.id, *.ms timeouts); a few librdkafka-only ones are
translated here: ``sasl.username``/``sasl.password`` -> ``sasl.jaas.config`` (PLAIN, SCRAM-SHA-*),
``sasl.mechanisms`` -> ``sasl.mechanism``, ``ssl.ca.location`` -> a PEM truststore,
``ssl.endpoint.identification.algorithm = none`` -> empty.  Properties only one client knows are
passed anyway: the Java client logs and ignores the ones it does not know.  The properties a
source sets itself (group.id, auto.offset.reset, enable.auto.commit, de/serializers, interceptors)
are left out (our source overrides them likewise).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streaming.read import source

FORMAT = "kafka"
SOURCES = ("python", "spark-kafka")
SCALA_BINARY = "2.13"  # Spark 4 is built for Scala 2.13 only
#: Kafka consumer properties the source sets itself; Spark refuses most of them as options
SOURCE_OWNED = frozenset({"group.id", "auto.offset.reset", "enable.auto.commit", "key.deserializer",
                          "value.deserializer", "interceptor.classes"})
#: error conditions Spark raises at load() when no "kafka" data source is on the classpath
NOT_FOUND_CONDITIONS = frozenset({"KAFKA_DATA_SOURCE_NOT_ENABLED", "DATA_SOURCE_NOT_FOUND"})
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def package(spark_version: str) -> str:
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{spark_version}"


def parse_starting_offsets(value: str) -> Any:
    """``earliest``, ``latest`` or our JSON ``{"<partition>": offset}`` (as a dict), parsed as our
    source parses it; ValueError naming the setting otherwise.  Both sources take these."""
    try:
        return source.parse_starting_offsets(value)
    except ValueError as e:
        raise ValueError(f"job.starting_offsets: must be earliest, latest or JSON {{\"<partition>\": offset}}, "
                         f"got {value!r} ({e})") from None


def starting_offsets(topic: str, value: str) -> str:
    """``earliest``/``latest`` as they are; our ``{"<partition>": offset}`` becomes Spark's
    ``{"<topic>": {"<partition>": offset}}`` (Spark requires every partition in it; -2 is the
    earliest offset, -1 the latest)."""
    offsets = parse_starting_offsets(value)
    if isinstance(offsets, str):
        return offsets
    if not offsets:
        raise ValueError('job.starting_offsets: Spark\'s kafka source needs every partition in it '
                         '({"<partition>": offset, ...}; -2 = earliest, -1 = latest)')
    return json.dumps({topic: offsets}, separators=(",", ":"))


def _jaas_quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_client_properties(kafka: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties -> the Java client's (see the module doc)."""
    out = {k: v for k, v in kafka.items() if k not in SOURCE_OWNED}
    if "sasl.mechanisms" in out and "sasl.mechanism" not in out:
        out["sasl.mechanism"] = out["sasl.mechanisms"]
    mech = out.get("sasl.mechanism", "GSSAPI").upper()  # both clients default to GSSAPI
    if ("sasl.username" in out and "sasl.password" in out and "sasl.jaas.config" not in out
            and mech in _LOGIN_MODULES):
        out["sasl.jaas.config"] = (f"{_LOGIN_MODULES[mech]} required username={_jaas_quote(out['sasl.username'])} "
                                   f"password={_jaas_quote(out['sasl.password'])};")
    if "ssl.ca.location" in out and "ssl.truststore.location" not in out:
        out["ssl.truststore.location"] = out["ssl.ca.location"]
        out["ssl.truststore.type"] = "PEM"
    if out.get("ssl.endpoint.identification.algorithm", "").lower() == "none":
        out["ssl.endpoint.identification.algorithm"] = ""
    return out


def options(cfg: Any) -> dict[str, str]:
    """The JobConfig's settings as options of Spark's kafka source (pure: no Spark, no Kafka)."""
    out = {
        "subscribe": cfg.events_topic,
        "startingOffsets": starting_offsets(cfg.events_topic, cfg.starting_offsets),
        "failOnDataLoss": "true" if cfg.fail_on_data_loss else "false",
        "kafka.bootstrap.servers": cfg.bootstrap_servers,
    }
    if cfg.max_offsets_per_trigger:
        out["maxOffsetsPerTrigger"] = str(cfg.max_offsets_per_trigger)
    for k, v in java_client_properties(cfg.kafka).items():
        out[f"kafka.{k}"] = v
    return out


def records(df: DataFrame) -> DataFrame:
    """Spark's kafka records (binary key/value, timestamp as a timestamp, timestampType) -> the
    columns of our source: key string, value string, topic, partition, offset, timestamp (ms)."""
    return df.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
                     F.col("topic").cast("string").alias("topic"), F.col("partition").cast("int").alias("partition"),
                     F.col("offset").cast("long").alias("offset"), F.unix_millis("timestamp").alias("timestamp"))


def is_missing_source(exc: BaseException) -> bool:
    """Whether Spark's error says the kafka data source (or a class it needs) is not on the classpath."""
    get = getattr(exc, "getCondition", None)
    try:
        cond = get() if callable(get) else None
    except Exception:
        cond = None
    if cond in NOT_FOUND_CONDITIONS:
        return True
    text = str(exc)
    return (("NoClassDefFoundError" in text or "ClassNotFoundException" in text)
            and ("org/apache/kafka" in text or "org.apache.kafka" in text
                 or "org/apache/spark/sql/kafka010" in text or "org.apache.spark.sql.kafka010" in text))


def missing_source_message(spark_version: str, exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return (f'job.source = "spark-kafka": Spark\'s kafka source is not on the classpath ({first}). '
            f"Add its jars: spark-submit --jars \"$(kafka-monitor spark-jars)\" (fetches them with mvn, the "
            f"connector of this Spark or 4.2.0 where Maven Central has none), or --packages {package(spark_version)} "
            f"(spark.jars.packages), or set job.source = \"python\" "
            f"(--source python, KAFKA_MONITOR_JOB_SOURCE=python) to read with the built-in confluent-kafka source.")
