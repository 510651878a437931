"""``kafka-monitor replay``: its flags, and the run (docs/replay.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

DESCRIPTION = """\
Run the job's alert rules again, with a given config, over a time range of the event archive
(the job's --archive-dir), and compare the alert transitions they would have made with what the
job published on the alerts topic over that range: per alert, the episodes that are the same,
added (the replay alone), removed (the job alone) and shifted in time, with their entities.

Writes a table to stdout, a JSON file (--out) and a self-contained HTML page with a timeline of
both (--html). Before changing a threshold: replay last week with the changed config, and see
what it would have paged and what it would have missed.

How it runs: the job's own state function, bucket by bucket and micro-batch by micro-batch, in
the order the job ran them, each bucket evaluated at the moments the job evaluated it (the
archive records its batches and its timeouts' moments). Replaying with the job's own config
reproduces its published transitions exactly. So settings that decide those moments are not
replayed: a changed job.buckets, job.trigger_s or the state's 30 s tick is evaluated at the
recorded moments all the same. State at the range's start is unknown: the replay starts
--warmup earlier and compares only inside the range. Where the archive does not reach,
--source events-topic replays the events topic instead, APPROXIMATELY (batches, buckets and
timeouts of its own).

The config is the job's (--config: the same TOML file, [job] and [job.rules.*]; then the
KAFKA_MONITOR_JOB_* environment, as for `kafka-monitor job`), with --rule to change one
threshold without editing it. Only the rules' settings and job.entity_ttl_s change what is
replayed.

Times: ISO 8601 (2025-11-29T21:00:00Z; no zone = UTC), Unix seconds, now, or relative to now
(-7d, -2h, -90m).

Exit status: 0 written; 1 written, but not compared (the alerts topic could not be read: the
error says why); 2 nothing written (a bad flag, nothing archived in the range, an unreadable
archive).

examples:
  kafka-monitor replay --archive /var/lib/kafka-monitor/archive --from -7d --config job.toml \\
      --rule lag.lag_high_seconds=120
  kafka-monitor replay --config job.toml --from 2025-11-29T00:00Z --to 2025-11-30T00:00Z --cluster prod-eu-1
  kafka-monitor replay --archive s3://bucket/archive --from -2h --no-compare
"""

#: the job config's required settings, when the file leaves them out (the replay needs neither)
_UNUSED = "(not used by replay)"
#: the alerts topic is read from this long before the replay's first moment (clocks of the probe
#: and the job's hosts differ; a record's timestamp is when it was published, after its ``at``)
ALERTS_SLACK_MS = 600_000


class ReplayError(Exception):
    """Something the user can fix (the message says what); nothing is written; exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", choices=["archive", "events-topic"], default="archive",
                   help="archive (default): exact, at the job's own batches and moments; events-topic: the events "
                        "topic over its retention, APPROXIMATE (batches cut every job.trigger_s by the records' "
                        "timestamps, buckets and timeouts of its own: time-driven alerts can move by a trigger or a "
                        "tick); for a range the archive does not cover")
    p.add_argument("--events-topic", metavar="TOPIC",
                   help="with --source events-topic: default job.events_topic of --config (kafka-monitor.events)")
    p.add_argument("--archive", metavar="DIR",
                   help="the event archive: the job's --archive-dir (a path, hdfs://, s3://, gs://...); default: "
                        "job.archive_dir of --config")
    p.add_argument("--from", dest="start", required=True, metavar="TIME",
                   help="start of the range compared (ISO 8601, Unix seconds, or relative: -7d, -2h)")
    p.add_argument("--to", dest="end", default="now", metavar="TIME", help="end of the range (default now)")
    p.add_argument("--config", metavar="FILE",
                   help="the job's TOML config ([job], [job.rules.*], [job.kafka]): the rules' thresholds to replay "
                        "with, and where the alerts topic is; default: the defaults and KAFKA_MONITOR_JOB_*")
    p.add_argument("--rule", action="append", metavar="FAMILY.NAME=VALUE",
                   help="one rule setting over --config, e.g. lag.lag_high_seconds=120 or partition.hw_stall_ms=60000 "
                        "(families: lag, partition, group, client, source; docs/settings.md); repeatable")
    p.add_argument("--cluster", action="append", metavar="NAME",
                   help="compare and report only this cluster's alerts (repeatable; default every archived one). "
                        "All clusters are still replayed: a bucket holds several, and its moments depend on all")
    p.add_argument("--warmup", default="2h", metavar="DURATION",
                   help="read this long before --from, so the rules' state (lag history, open alerts, timers) is "
                        "built when the range starts (default 2h; at most what the archive keeps)")
    p.add_argument("--bootstrap-servers", metavar="HOSTS",
                   help="the cluster holding the alerts topic (default: job.bootstrap_servers of --config)")
    p.add_argument("--alerts-topic", metavar="TOPIC", help="default: job.alerts_topic of --config "
                                                           "(kafka-monitor.alerts)")
    p.add_argument("-X", dest="kafka", action="append", metavar="KEY=VALUE",
                   help="librdkafka property for reading the alerts topic, over [job.kafka] (SASL/SSL...); repeatable")
    p.add_argument("--no-compare", action="store_true",
                   help="only replay: write the transitions the rules would have made, without reading the alerts "
                        "topic")
    p.add_argument("--out", default="replay.json", metavar="FILE",
                   help="the JSON report: range, coverage, the replay's transitions, the comparison with every "
                        "differing episode (default %(default)s)")
    p.add_argument("--html", default="replay.html", metavar="FILE",
                   help="the HTML page: summary, a timeline of both sides' episodes where they differ, the "
                        "differences (default %(default)s; '' for none)")
    p.add_argument("--rows", type=int, default=20, metavar="N",
                   help="differing episodes listed on the terminal (default 20; the files have them all)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="report progress on stderr every few seconds: batches done and left, events/s, time left "
                        "(default on)")


#: flags whose value may start with "-" (a time relative to now)
_TIME_FLAGS = ("--from", "--to")


def relative_times(argv: list[str]) -> list[str]:
    """``--from -7d`` as ``--from=-7d``: argparse takes a value starting with ``-`` for a flag."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _TIME_FLAGS and i + 1 < len(argv) and argv[i + 1][:1] == "-" and argv[i + 1][1:2].isdigit():
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def parse_when(text: str, flag: str, now_s: float) -> int:
    """A time flag -> ms since the epoch."""
    from kafka_monitor.snapshot.common import SnapshotError, parse_duration, parse_time

    t = (text or "").strip()
    try:
        if t.startswith("-"):
            return int((now_s - parse_duration(t[1:], flag)) * 1000)
        if t == "now":
            return int(now_s * 1000)
        return int(parse_time(t, flag) * 1000)
    except SnapshotError as e:
        raise ReplayError(str(e).replace("(now, Unix seconds", "(now, -7d, -2h, Unix seconds")) from None


def _kv(pairs: Optional[list[str]], flag: str) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise ReplayError(f"{flag}: expects key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def load_config(path: Optional[str], rules: Optional[list[str]], env: Optional[dict[str, str]] = None) -> Any:
    """The job's config as ``kafka-monitor job`` reads it (file, environment), with ``--rule``
    settings over it; the settings only the job needs get a placeholder."""
    from kafka_monitor.config import ConfigError, build, read_file
    from streaming.job import JobConfig

    over: dict[str, dict[str, str]] = {}
    for k, v in _kv(rules, "--rule").items():
        family, _, name = k.partition(".")
        if not family or not name:
            raise ReplayError(f"--rule: expects FAMILY.NAME=VALUE (e.g. lag.lag_high_seconds=120), got {k!r}")
        over.setdefault(family, {})[name] = v
    try:
        data = read_file(path)
        job = dict(data.get("job") or {})
        for name in ("bootstrap_servers", "checkpoint_dir"):
            job.setdefault(name, _UNUSED)
        return build(JobConfig, "job", file_data={**data, "job": job}, env=os.environ if env is None else env,
                     flags={"rules": over} if over else None)
    except ConfigError as e:
        msg = str(e)
        for family, names in over.items():  # a --rule's error names the flag
            for name in names:
                msg = msg.replace(f"job.rules.{family}.{name}", f"--rule {family}.{name}")
        raise ReplayError(msg) from None


def rules_changed(cfg: Any) -> dict[str, Any]:
    """The settings that change what is replayed and differ from their defaults: ``family.name``
    -> value (and ``entity_ttl_s``)."""
    from streaming.job import RULE_FAMILIES, STATE_FAMILIES, JobConfig

    out: dict[str, Any] = {}
    for family, got in cfg.rule_configs().items():
        if family not in STATE_FAMILIES:
            continue
        default = RULE_FAMILIES[family]()
        for f in dataclasses.fields(got):
            if getattr(got, f.name) != getattr(default, f.name):
                out[f"{family}.{f.name}"] = getattr(got, f.name)
    if cfg.entity_ttl_s != JobConfig.entity_ttl_s:
        out["entity_ttl_s"] = cfg.entity_ttl_s
    return out


class ProgressLine:
    """Progress on stderr, at most every ``every_s`` seconds, once the replay has run ``after_s``."""

    def __init__(self, out: TextIO, every_s: float = 5.0, after_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.out, self.every_s, self.after_s, self.clock = out, every_s, after_s, clock
        self.t0 = clock()
        self.last: Optional[float] = None

    def __call__(self, p: Any) -> None:
        from kafka_monitor.snapshot.common import fmt_duration

        now = self.clock()
        done = p.batches_done == p.batches_total
        if now - self.t0 < self.after_s and not (done and self.last is not None):
            return
        if not done and self.last is not None and now - self.last < self.every_s:
            return
        self.last = now
        rate = p.rows / p.elapsed_s if p.elapsed_s > 0 else 0.0
        left = p.elapsed_s / p.batches_done * (p.batches_total - p.batches_done) if p.batches_done else 0.0
        self.out.write(f"replay: {p.batches_done:,}/{p.batches_total:,} batches "
                       f"({100 * p.batches_done / max(p.batches_total, 1):.0f}%), {rate:,.0f} events/s, "
                       + (f"done in {fmt_duration(p.elapsed_s)}\n" if done else f"about {fmt_duration(left)} left\n"))
        self.out.flush()


def _write(path: Path, text: str, flag: str) -> None:
    from kafka_monitor.snapshot.command import replace_file

    try:
        if path.is_dir():
            raise ReplayError(f"{flag}: {path} is a directory; name a file")
        replace_file(path, text)
    except OSError as err:
        raise ReplayError(f"{flag}: cannot write {path}: {err.strerror or err}") from None


def _archived_text(hours: dict[str, list[int]]) -> str:
    from streaming.sinks.archive import hour_label

    return "; ".join(f"cluster {c}: {hour_label(hs[0])} .. {hour_label(hs[-1])} ({len(hs)} hours)"
                     for c, hs in sorted(hours.items())) or "nothing"


def run(args: argparse.Namespace, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
        read_published: Optional[Callable[..., list[dict]]] = None, now_s: Optional[float] = None,
        read_records: Optional[Callable[..., Any]] = None) -> int:
    """The command.  ``read_published``, ``read_records``: the alerts topic's and the events
    topic's readers (tests pass fakes)."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        return _run(args, stdout, stderr, read_published, time.time() if now_s is None else now_s, read_records)
    except ReplayError as e:
        print(f"error: {e}", file=stderr)
        return 2


def _from_archive(uri: str, only: Optional[list[str]], start: int, end: int, read_start: int, scfg: Any,
                  progress: Any, stderr: TextIO) -> tuple[Any, list[str], list[dict], dict[str, dict]]:
    """The replay over the archive: (its result, the clusters reported, the spans not covered,
    what the archive holds per cluster)."""
    from kafka_monitor.replay import report
    from streaming.replay.engine import replay
    from streaming.replay.source import ArchiveReader, ArchiveReadError, coverage, first_event_ms, hour_span

    try:
        reader = ArchiveReader(uri)
        hours = reader.hours()
    except (ArchiveReadError, OSError) as e:
        raise ReplayError(str(e)) from None
    if not hours:
        raise ReplayError(f"--archive: {uri} holds no archived events (is it the job's --archive-dir, and has the job "
                          f"run with it?)")
    unknown = [c for c in only or [] if c not in hours]
    if unknown:
        raise ReplayError(f"--cluster: nothing archived for {', '.join(unknown)}; the archive has: "
                          f"{_archived_text(hours)}")
    clusters = list(only or sorted(hours))
    in_range = hour_span(start, end)
    if not any(h in in_range for c in clusters for h in hours[c]):
        raise ReplayError(f"nothing archived between {report.iso(start)} and {report.iso(end)} for "
                          f"{', '.join(clusters)}; the archive has: {_archived_text(hours)}")
    first = first_event_ms(reader, {c: hours[c] for c in clusters})
    uncovered = [_span(g.cluster, g.start_ms, g.end_ms, start, g.why)
                 for g in coverage(hours, read_start, end, clusters, first)]
    for line in report.coverage_lines(uncovered):
        print(line, file=stderr)
    try:
        res = replay(reader, reader.batches(read_start, end), scfg, progress=progress)
    except (ArchiveReadError, OSError) as e:
        raise ReplayError(f"reading the archive: {e}") from None
    archived = {c: {"first_hour": report.iso(hs[0] * 3_600_000), "last_hour": report.iso(hs[-1] * 3_600_000),
                    "hours": len(hs)} for c, hs in sorted(hours.items())}
    return res, clusters, uncovered, archived


def _span(cluster: str, lo: int, hi: int, start: int, why: str) -> dict:
    from kafka_monitor.replay import report

    return {"cluster": cluster, "from": report.iso(lo), "to": report.iso(hi), "from_ms": lo, "to_ms": hi,
            "in_range": hi > start, "why": why}


def _from_topic(read_records: Optional[Callable[..., Any]], kafka: dict[str, str], topic: str, cfg: Any,
                only: Optional[list[str]], start: int, end: int, read_start: int, scfg: Any, progress: Any,
                stderr: TextIO) -> tuple[Any, list[str], list[dict], dict[str, dict]]:
    """The approximate replay over the events topic (streaming/replay/topic.py)."""
    from kafka_monitor.replay import report
    from streaming.job import ENTITY_OF_TYPE
    from streaming.replay import topic as tp
    from streaming.replay.engine import run as run_replay

    reader = read_records if read_records is not None else tp.read_records
    try:
        records, first_ms = reader(kafka, topic, read_start, end)
        head = next(records, None)
    except Exception as e:  # a broker unreachable, a missing topic, an ACL
        raise ReplayError(f"reading the events topic {topic!r} on {kafka.get('bootstrap.servers')}: {e}") from None
    if head is None:
        raise ReplayError(f"the events topic {topic!r} has no records between {report.iso(read_start)} and "
                          f"{report.iso(end)} (its retention, or the range)")
    if first_ms is not None and first_ms >= end:
        raise ReplayError(f"the events topic {topic!r} keeps records from {report.iso(first_ms)} only, after the "
                          f"range")
    print(f"note: replaying from the events topic {topic!r} is APPROXIMATE: batches cut every "
          f"{cfg.trigger_s:g} s by the records' timestamps, buckets and timeouts of its own; time-driven alerts can "
          f"move by up to a trigger or a tick (docs/replay.md)", file=stderr)

    def chained() -> Any:
        yield head
        yield from records

    uncovered = []
    if first_ms is not None and first_ms > read_start:
        uncovered.append(_span("(all)", read_start, first_ms, start,
                               f"before the events topic's oldest retained record, at {report.iso(first_ms)}"))
    for line in report.coverage_lines(uncovered):
        print(line, file=stderr)
    trigger_ms = int(cfg.trigger_s * 1000)
    batches = tp.window_batches(chained(), read_start, end, trigger_ms, cfg.buckets, ENTITY_OF_TYPE, cfg.limits())
    try:
        res = run_replay(batches, tp.windows(read_start, end, trigger_ms), scfg, progress)
    except RuntimeError as e:
        raise ReplayError(f"reading the events topic {topic!r}: {e}") from None
    return res, list(only or []), uncovered, {}


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, read_published: Optional[Callable[..., list[dict]]],
         now_s: float, read_records: Optional[Callable[..., Any]] = None) -> int:
    from kafka_monitor.replay import report
    from kafka_monitor.replay.diff import diff, episodes
    from kafka_monitor.snapshot.common import SnapshotError, parse_duration
    from streaming.job import state_config

    start = parse_when(args.start, "--from", now_s)
    end = parse_when(args.end, "--to", now_s)
    if end <= start:
        raise ReplayError(f"--to ({report.iso(end)}) must be after --from ({report.iso(start)})")
    try:
        warmup = int(parse_duration(args.warmup, "--warmup") * 1000) if str(args.warmup).strip() not in ("0", "") else 0
    except SnapshotError as e:
        raise ReplayError(str(e)) from None
    if args.rows < 1:
        raise ReplayError(f"--rows: must be at least 1, got {args.rows}")
    cfg = load_config(args.config, args.rule)
    uri = args.archive or cfg.archive_dir
    if args.source == "archive" and not uri:
        raise ReplayError("--archive: required (or job.archive_dir in --config): the job's --archive-dir")
    kafka = {**cfg.kafka, **_kv(args.kafka, "-X")}
    bootstrap = args.bootstrap_servers or (cfg.bootstrap_servers if cfg.bootstrap_servers != _UNUSED else None)
    topic = cfg.alerts_topic if args.alerts_topic is None else args.alerts_topic
    if (not args.no_compare or args.source == "events-topic") and not bootstrap:
        what = "the events topic" if args.source == "events-topic" else "the alerts topic"
        raise ReplayError(f"--bootstrap-servers: required to read {what} (or job.bootstrap_servers in --config)"
                          + ("" if args.source == "events-topic" else "; --no-compare only replays"))
    if not args.no_compare and not topic:
        raise ReplayError("--alerts-topic: the job publishes no alerts topic ('' in its config): nothing to compare "
                          "with; give one, or --no-compare")

    read_start = start - warmup
    progress = ProgressLine(stderr) if args.progress else None
    scfg = state_config(cfg, run_id="replay")
    if args.source == "archive":
        res, clusters, uncovered, archived = _from_archive(uri, args.cluster, start, end, read_start, scfg, progress,
                                                           stderr)
    else:
        assert bootstrap
        res, clusters, uncovered, archived = _from_topic(
            read_records, {**kafka, "bootstrap.servers": bootstrap}, args.events_topic or cfg.events_topic, cfg,
            args.cluster, start, end, read_start, scfg, progress, stderr)
    if res.incomplete:
        print(f"warning: {res.incomplete} buckets' rows of a batch are incomplete (a file of the batch is gone: "
              f"deleted by the retention or by hand), e.g. (query, batch, bucket) {res.incomplete_examples[:3]}; "
              f"the replay may differ from the job around them", file=stderr)

    def ours(r: dict) -> bool:  # no clusters named (from the topic, without --cluster): all of them
        return read_start <= r["at"] <= end and (not clusters or (r.get("labels") or {}).get("cluster") in clusters)

    replayed = [r for r in res.transitions if ours(r)]
    compared: Optional[dict[str, Any]] = None
    diffs = None
    compare_error = None
    if not args.no_compare:
        if read_published is None:
            from streaming.sinks.alerts import read_published as read_topic
        else:
            read_topic = read_published
        assert bootstrap and topic  # refused above without them
        try:
            published = read_topic({**kafka, "bootstrap.servers": bootstrap}, topic,
                                   since_ms=read_start - ALERTS_SLACK_MS)
        except Exception as e:  # a broker unreachable, a missing topic, an ACL: written without the comparison
            compare_error = f"reading the alerts topic {topic!r} on {bootstrap}: {e}"
            print(f"error: {compare_error}", file=stderr)
        else:
            job_side = [r for r in published if ours(r)]
            compared = {"topic": topic, "bootstrap_servers": bootstrap, "records_read": len(published),
                        "records_compared": len(job_side)}
            diffs = diff(episodes(job_side), episodes(replayed), start, end)
    rep = report.build(
        start_ms=start, end_ms=end, warmup_ms=warmup, config=args.config, rules_changed=rules_changed(cfg),
        read_from=uri if args.source == "archive" else f"{args.events_topic or cfg.events_topic} on {bootstrap}",
        clusters=clusters, uncovered=uncovered,
        archived=archived, source=args.source,
        replay={"batches": res.batches, "rows": res.rows, "ticks": res.ticks, "ticks_skipped": res.ticks_skipped,
                "incomplete": res.incomplete, "incomplete_examples": res.incomplete_examples,
                "queries": res.queries, "seconds": round(res.seconds, 3)},
        transitions=replayed, compared=compared, diffs=diffs, compare_error=compare_error)
    out = Path(args.out)
    _write(out, json.dumps(rep, indent=1, default=str) + "\n", "--out")
    files = str(out)
    if args.html:
        page = Path(args.html)
        _write(page, report.render_html(rep, diffs, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now_s))), "--html")
        files += f", {page}"
    stdout.write(report.render_text(rep, diffs, args.rows, files))
    stdout.flush()
    return 1 if compare_error else 0
