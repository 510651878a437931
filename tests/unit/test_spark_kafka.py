"""The switch to Spark's built-in kafka source: the job's settings as that source's options (a
pure function, as a table), the missing-jar predicate, and events-behind from both sources'
offsets in the progress report."""

from __future__ import annotations

import json

import pytest

from streaming.read import spark_kafka
from streaming.job import JobConfig, JobConfigError
from streaming.sinks.progress import report_progress, source_offsets

BASE = {"subscribe": "kafka-monitor.events", "startingOffsets": "earliest", "failOnDataLoss": "true",
        "kafka.bootstrap.servers": "b1:9092,b2:9092", "maxOffsetsPerTrigger": "500000"}


def cfg(**kw) -> JobConfig:
    return JobConfig(bootstrap_servers="b1:9092,b2:9092", checkpoint_dir="/c", **kw)


@pytest.mark.parametrize("settings, expected", [
    ({}, BASE),
    ({"starting_offsets": "latest", "max_offsets_per_trigger": None, "fail_on_data_loss": False},
     {**{k: v for k, v in BASE.items() if k != "maxOffsetsPerTrigger"}, "startingOffsets": "latest",
      "failOnDataLoss": "false"}),
    ({"events_topic": "ev", "starting_offsets": '{"0": 15, "2": -2}', "max_offsets_per_trigger": 100},
     {**BASE, "subscribe": "ev", "startingOffsets": '{"ev":{"0":15,"2":-2}}', "maxOffsetsPerTrigger": "100"}),
    # properties with the same name in both clients pass through, each as kafka.<key>
    ({"kafka": {"security.protocol": "SSL", "client.id": "km", "request.timeout.ms": "30000"}},
     {**BASE, "kafka.security.protocol": "SSL", "kafka.client.id": "km", "kafka.request.timeout.ms": "30000"}),
    # the source owns these (Spark refuses most of them as options): left out
    ({"kafka": {"group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                "session.timeout.ms": "6000"}},
     {**BASE, "kafka.session.timeout.ms": "6000"}),
    # a later bootstrap.servers in the table wins, as with our source
    ({"kafka": {"bootstrap.servers": "other:9093"}}, {**BASE, "kafka.bootstrap.servers": "other:9093"}),
    # librdkafka's SCRAM credentials -> the Java client's JAAS config (quotes escaped)
    ({"kafka": {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "mon",
                "sasl.password": 'p"w\\d'}},
     {**BASE, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanisms": "SCRAM-SHA-512",
      "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "mon", "kafka.sasl.password": 'p"w\\d',
      "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                'username="mon" password="p\\"w\\\\d";'}),
    ({"kafka": {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}},
     {**BASE, "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "u", "kafka.sasl.password": "p",
      "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                'username="u" password="p";'}),
    # a JAAS config given explicitly is kept; no mechanism means GSSAPI (both clients): nothing derived
    ({"kafka": {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p", "sasl.jaas.config": "X;"}},
     {**BASE, "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "u", "kafka.sasl.password": "p",
      "kafka.sasl.jaas.config": "X;"}),
    ({"kafka": {"sasl.username": "u", "sasl.password": "p"}},
     {**BASE, "kafka.sasl.username": "u", "kafka.sasl.password": "p"}),
    # TLS: librdkafka's CA file -> a PEM truststore; "none" -> no host name check
    ({"kafka": {"ssl.ca.location": "/etc/ca.pem", "ssl.endpoint.identification.algorithm": "none"}},
     {**BASE, "kafka.ssl.ca.location": "/etc/ca.pem", "kafka.ssl.truststore.location": "/etc/ca.pem",
      "kafka.ssl.truststore.type": "PEM", "kafka.ssl.endpoint.identification.algorithm": ""}),
])
def test_options_table(settings, expected):
    assert spark_kafka.options(cfg(**settings)) == expected


@pytest.mark.parametrize("value", ['{"0": "x"}', "[1, 2]", "{nope", '{"a": 1}', "earlist"])
def test_bad_starting_offsets_name_the_setting(value):
    with pytest.raises(ValueError, match="job.starting_offsets: must be earliest, latest or JSON"):
        spark_kafka.options(cfg(starting_offsets=value))
    with pytest.raises(JobConfigError, match="job.starting_offsets: must be earliest, latest or JSON"):
        cfg(starting_offsets=value).validate()  # refused before Spark starts, whichever the source


def test_empty_starting_offsets_only_for_our_source():
    assert cfg(starting_offsets="{}").validate()  # ours: every partition from its earliest offset
    with pytest.raises(ValueError, match="job.starting_offsets: Spark's kafka source needs every partition"):
        spark_kafka.options(cfg(starting_offsets="{}"))


def test_source_setting_is_validated():
    assert cfg(source="spark-kafka").validate().source == "spark-kafka"
    with pytest.raises(JobConfigError, match="job.source: must be one of python, spark-kafka"):
        cfg(source="kafka").validate()


class FakeSparkError(Exception):
    def __init__(self, message, condition=None):
        super().__init__(message)
        self.condition = condition

    def getCondition(self):
        return self.condition


@pytest.mark.parametrize("exc, missing", [
    (FakeSparkError("[KAFKA_DATA_SOURCE_NOT_ENABLED] Failed to find data source: kafka.",
                    "KAFKA_DATA_SOURCE_NOT_ENABLED"), True),
    (FakeSparkError("[DATA_SOURCE_NOT_FOUND] Failed to find the data source: kafka.", "DATA_SOURCE_NOT_FOUND"), True),
    # the connector jar without kafka-clients
    (RuntimeError("An error occurred while calling o42.load.\n: java.lang.NoClassDefFoundError: "
                  "org/apache/kafka/common/serialization/ByteArraySerializer"), True),
    (FakeSparkError("[UNRESOLVED_COLUMN] ...", "UNRESOLVED_COLUMN"), False),
    (RuntimeError("java.lang.IllegalArgumentException: Kafka option 'auto.offset.reset' is not supported"), False),
])
def test_missing_source_predicate(exc, missing):
    assert spark_kafka.is_missing_source(exc) is missing


def test_missing_source_message_says_what_to_do():
    msg = spark_kafka.missing_source_message("4.3.0", FakeSparkError("[KAFKA_DATA_SOURCE_NOT_ENABLED] no\nmore"))
    assert msg.startswith('job.source = "spark-kafka": Spark\'s kafka source is not on the classpath '
                          "([KAFKA_DATA_SOURCE_NOT_ENABLED] no).")
    assert "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0" in msg
    assert "spark.jars.packages" in msg and 'job.source = "python"' in msg


class Recorder:
    def __init__(self):
        self.calls = []

    def progress(self, **kw):
        self.calls.append(kw)


OURS = {"latestOffset": json.dumps({"topic": "ev", "offsets": {"0": 120, "1": 40, "2": 7}}),
        "endOffset": json.dumps({"topic": "ev", "offsets": {"0": 100, "1": 40}})}
SPARKS = {"latestOffset": json.dumps({"ev": {"0": 120, "1": 40, "2": 7}}),
          "endOffset": json.dumps({"ev": {"0": 100, "1": 40}})}


@pytest.mark.parametrize("source", [OURS, SPARKS], ids=["python-source", "spark-kafka-source"])
@pytest.mark.parametrize("as_dict", [True, False], ids=["dict", "object"])
def test_events_behind_from_either_sources_offsets(source, as_dict):
    p = {"batchId": 3, "numInputRows": 60, "sources": [dict(source)],
         "stateOperators": [{"numRowsTotal": 11}], "durationMs": {"triggerExecution": 1500}}
    if not as_dict:  # a StreamingQueryProgress: attributes; offsets are JSON strings
        class Obj:
            def __init__(self, d):
                self.__dict__.update({k: [Obj(x) if isinstance(x, dict) else x for x in v] if isinstance(v, list)
                                      else v for k, v in d.items()})
        p = Obj(p)
    rec = Recorder()
    report_progress(p, rec)
    assert rec.calls == [{"events_behind": 20 + 0 + 7, "state_keys": 11, "duration_s": 1.5, "unreadable": 0,
                          "unreadable_s": 0.0}]


def test_unreadable_partitions_of_our_source_are_counted_with_the_longest_wait():
    import time
    now_ms = int(time.time() * 1000)
    latest = {"topic": "ev", "offsets": {"0": 5, "1": 9},
              "unreadable": {"0": {"since": now_ms - 30_000, "reason": "no leader"},
                             "1": {"since": now_ms - 5_000, "reason": "leader 2 answered no offset (-1001)"}}}
    rec = Recorder()
    report_progress({"batchId": 4, "sources": [{"latestOffset": json.dumps(latest),
                                                "endOffset": json.dumps({"topic": "ev", "offsets": {"0": 5, "1": 9}})}]},
                    rec)
    call = rec.calls[0]
    assert call["unreadable"] == 2 and 29.0 <= call["unreadable_s"] <= 40.0 and call["events_behind"] == 0


def test_source_offsets_shapes():
    assert source_offsets({"topic": "ev", "offsets": {"0": 5}}) == {("ev", "0"): 5}
    assert source_offsets({"ev": {"0": 5, "1": 6}, "other": {"0": 1}}) == {("ev", "0"): 5, ("ev", "1"): 6,
                                                                          ("other", "0"): 1}
    # a topic that happens to be called "topic" is still Spark's shape
    assert source_offsets({"topic": {"3": 9}}) == {("topic", "3"): 9}
    assert source_offsets(None) == {} and source_offsets({}) == {}


def test_unreadable_offsets_are_skipped():
    rec = Recorder()
    report_progress({"batchId": 1, "sources": [{"latestOffset": "not json", "endOffset": None},
                                               dict(SPARKS)]}, rec)
    assert rec.calls[0]["events_behind"] == 27
