"""Leader epochs, which librdkafka reports only in its statistics: each partition's leader and
leader epoch read from the metadata client's latest statistics document (``epochs_from_stats``,
a text scan rather than a parse), and the wait after a metadata response for a document that
describes it (``LeaderEpochs.leader_epochs``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Callable, Optional

from confluent_kafka import KafkaException

from monitor.contract import NO_LEADER
from monitor.probe_config import ProbeConfig

log = logging.getLogger("monitor.probe")  # the probe's log, whichever of its parts writes

#: a metadata refresh waits for its leader epochs (the client's statistics) at most this share of
#: the interval (and 2.5 statistics intervals): past it they come from the statistics before
EPOCH_WAIT_SHARE = 0.25
#: the timestamp near the start of a statistics document: ``{ "name": ..., "ts":12345, ...``
_STATS_TS = re.compile(r', "ts":\s*(\d+)\s*,')
_STATS_TOPIC = '{ "topic":"'
_STATS_PARTITION = re.compile(r'"partition":(-?\d+), "broker":-?\d+, "leader":(-?\d+),')
_STATS_EPOCH = re.compile(r'"leader_epoch":(-?\d+)')


def epochs_from_stats(raw: str) -> dict[tuple[str, int], tuple[Optional[int], int]]:
    """(topic, partition) -> (leader, leader epoch) for every partition of a librdkafka statistics
    document that has an epoch — what ``json.loads(raw)["topics"][t]["partitions"][p]`` says,
    without building the whole document (a 75 MB one at 100,000 partitions takes ~0.6 s to
    parse, this ~0.2 s).  It reads the layout librdkafka writes (each topic object opens with
    ``{ "topic":"<name>"``, each partition with ``"partition":N, "broker":B, "leader":L,`` and has
    one ``"leader_epoch":E``); where a topic does not look like that it parses the document."""
    out: dict[tuple[str, int], tuple[Optional[int], int]] = {}
    start = raw.find('"topics":{')
    if start < 0:
        return _epochs_from_json(raw)
    bounds = []
    i = raw.find(_STATS_TOPIC, start)
    while i >= 0:
        bounds.append(i)
        i = raw.find(_STATS_TOPIC, i + len(_STATS_TOPIC))
    bounds.append(len(raw))
    find_parts, find_epochs, count = _STATS_PARTITION.findall, _STATS_EPOCH.findall, raw.count
    for b, e in zip(bounds, bounds[1:]):
        name_at = b + len(_STATS_TOPIC)
        name = raw[name_at:raw.index('"', name_at)]
        parts, epochs = find_parts(raw, b, e), find_epochs(raw, b, e)
        if "\\" in name or not len(parts) == len(epochs) == count('"partition":', b, e):
            return _epochs_from_json(raw)
        for (pid, leader), epoch in zip(parts, epochs):
            if pid[0] != "-" and epoch[0] != "-":
                out[(name, int(pid))] = (int(leader), int(epoch))
    return out


def _epochs_from_json(raw: str) -> dict[tuple[str, int], tuple[Optional[int], int]]:
    out: dict[tuple[str, int], tuple[Optional[int], int]] = {}
    for tname, t in json.loads(raw).get("topics", {}).items():
        for pid, p in t.get("partitions", {}).items():
            epoch = p.get("leader_epoch")
            if int(pid) >= 0 and isinstance(epoch, int) and epoch >= 0:
                out[(tname, int(pid))] = (p.get("leader"), epoch)
    return out


class LeaderEpochs:
    """The statistics of the probe's metadata client (its ``stats_cb``), kept until a refresh
    reads them, and what they said of each partition's leader and leader epoch."""

    def __init__(self, cfg: ProbeConfig, warn_once: Callable[..., None]):
        self._cfg = cfg
        self._warn_once = warn_once
        self.interval_s = cfg.stats_interval()
        #: the time between two statistics documents as seen (librdkafka restarts its timer after
        #: writing one, so it is the interval plus the writing)
        self.period = self.interval_s
        #: from the statistics a refresh used to its end (their writing, reading them, the view)
        self.after_s = 0.5
        self._used_ts: Optional[float] = None
        #: (topic, partition) -> (leader, leader epoch) as the last statistics document read said
        self.seen: dict[tuple[str, int], tuple[Optional[int], int]] = {}
        self.ts = 0.0              # librdkafka's monotonic clock of the last statistics, s
        self.raw: Optional[str] = None  # the last statistics document, until it is read
        self.supported: Optional[bool] = None
        self._registered: set[str] = set()

    def on_stats(self, raw: str) -> None:
        """stats_cb of the admin client: keep the document, unread, and its timestamp.  It holds
        every partition of every registered topic (~750 bytes each: 75 MB at 100,000
        partitions, every statistics interval); only a refresh needs it, and then only its
        latest one (``read``)."""
        m = _STATS_TS.search(raw, 0, 4096)
        if m is None:
            try:
                ts = json.loads(raw).get("ts", 0)
            except (ValueError, AttributeError) as e:
                self._warn_once("stats", "unreadable client statistics: %s", e)
                return
        else:
            ts = int(m.group(1))
        previous, self.ts = self.ts, ts / 1e6
        self.raw = raw
        gap = self.ts - previous
        if previous > 0 and 0.5 * self.interval_s < gap < 2 * self.interval_s:
            self.period += 0.2 * (gap - self.period)

    def read(self) -> None:
        """Take each partition's leader and leader epoch from the latest statistics document, if
        it has not been read yet."""
        raw, self.raw = self.raw, None
        if raw is None:
            return
        try:
            self.seen.update(epochs_from_stats(raw))
        except (ValueError, AttributeError, TypeError) as e:
            self._warn_once("stats", "unreadable client statistics: %s", e)

    def leader_epochs(self, admin: Any, topics: list[str],
                      leaders: Optional[dict[tuple[str, int], int]] = None) -> dict[tuple[str, int], int]:
        """Leader epochs as of the metadata response just received.

        librdkafka reports a partition's leader epoch only in its statistics, only for topics
        the client (``admin``, the metadata client) holds a handle for (``list_topics(topic)``
        creates one), and only in statistics produced after the metadata response.  So: register
        new topics once, then wait (at most 2.5 statistics intervals and EPOCH_WAIT_SHARE of the
        interval) for statistics stamped after now — librdkafka's
        ``ts`` and ``time.monotonic()`` both read CLOCK_MONOTONIC.  A broker whose statistics
        carry no epochs at all (seen once) is not waited for again; epochs then stay null.
        Only that one document is read (``epochs_from_stats``), not every one the client sends.

        On a real cluster the statistics can still describe the partition as it was before the
        response (seen: a leader moved 2 -> 3, the first statistics after the response still said
        leader 2, epoch 0).  An epoch counts only where the statistics name the response's leader
        (``leaders``: each partition of the response's watched topics -> its leader, -1 where it
        has none; a partition without a leader takes the statistics' epoch as it is); the probe
        waits a little longer for those, then reports the rest as unknown (None) rather than the
        previous leader's epoch."""
        if self.supported is False:
            return {}
        for t in topics:
            if t not in self._registered:
                try:
                    admin.list_topics(topic=t, timeout=self._cfg.request_timeout_s)
                    self._registered.add(t)
                except KafkaException as e:
                    self._warn_once("register", "topic %s: %s", t, e)
        mark = time.monotonic()
        # bounded by a share of the interval too: the refresh holds up the next observation
        # (seen on the real cluster: 4-5 s of a 5 s interval while the refresh's timing was off)
        deadline = mark + min(2.5 * self.interval_s, max(0.5, EPOCH_WAIT_SHARE * self._cfg.interval_s))
        while self.ts < mark and time.monotonic() < deadline:
            admin.poll(0.05)
        if self.ts == 0.0:
            self.supported = False  # this client produces no statistics at all
            log.info("no client statistics: partition_metadata.leader_epoch stays null")
            return {}
        if self.ts < mark:
            self._warn_once("stats_late", "client statistics late: leader epochs may be one refresh old")
        self.read()
        self._used_ts = self.ts
        stats = self.seen
        if leaders is None:
            wanted = set(topics)
            leaders = {k: NO_LEADER for k in stats if k[0] in wanted}

        def agreeing(keys: Any) -> dict[tuple[str, int], int]:
            out = {}
            for k in keys:
                e = stats.get(k)
                if e is not None:
                    leader = leaders[k]
                    if leader < 0 or e[0] == leader:
                        out[k] = e[1]
            return out

        epochs = agreeing(leaders)
        if self.ts >= mark and len(epochs) < len(leaders):
            missing = [k for k in leaders if k in stats and k not in epochs]
            deadline = max(deadline, time.monotonic() + min(5 * self.interval_s,
                                                            EPOCH_WAIT_SHARE * self._cfg.interval_s))
            while missing and time.monotonic() < deadline:
                admin.poll(0.05)
                if self.raw is not None:
                    self.read()
                    epochs.update(agreeing(missing))
                    missing = [k for k in missing if k not in epochs]
            if missing:
                self._warn_once("stats_leader", "client statistics disagree with the metadata on %d partition(s)' "
                                "leader (e.g. %s): their leader epochs are reported as unknown", len(missing),
                                missing[0])
        if self.supported is None and topics and self.ts >= mark:
            self.supported = bool(epochs)
            if not epochs:
                log.info("the brokers report no leader epochs; partition_metadata.leader_epoch stays null")
        return epochs


    def refresh_done(self) -> None:
        """At the end of a successful refresh: how long it took from the statistics it used."""
        if self._used_ts is not None:
            after = time.monotonic() - self._used_ts
            if 0 <= after < self.interval_s:
                self.after_s += 0.3 * (after - self.after_s)
            self._used_ts = None
