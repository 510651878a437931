"""Saying when a watched entity is gone (``GoneTracker``).

The probe says when a watched entity is gone, so that the job drops it (and resolves its alerts)
at once rather than after its TTL: a topic, a group or a group's committed offset on a partition
that it saw before and that ``GONE_AFTER`` (2) successive complete answers leave out — metadata
responses, group listings, answers of the group's coordinator; a failed, late or partial answer
counts neither way — gets one ``partition_gone`` per partition, one ``group_gone`` (from the
probe that reports the group's state) or one ``group_partition_gone``, and is forgotten.  A
topic's first absence asks for metadata again (cause ``topic_missing``), so the second comes one
refresh backoff later.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from monitor.cluster_view import ClusterView
from monitor.contract import GroupGone, GroupPartitionGone, PartitionGone
from monitor.metadata import Cause

log = logging.getLogger("monitor.probe")  # the probe's log, whichever of its parts writes

#: a topic, group or group's committed offset seen before is gone when this many successive complete
#: answers leave it out (a failed or partial answer counts neither way): then one partition_gone,
#: group_gone or group_partition_gone, and it is forgotten (see GoneTracker)
GONE_AFTER = 2


class GoneTracker:
    """What the probe saw of each watched topic, group and group partition, and how many
    complete answers in a row left each out; it sends the ``*_gone`` events."""

    def __init__(self, emit_rows: Callable[[type, Sequence[tuple], int], list[int]], now_ms: Callable[[], int],
                 owns: Callable[[str], bool], request_update: Callable[[str], int]):
        """``emit_rows``: the probe's bulk emit (returns the rows not enqueued); ``owns``: whether
        a group is in this probe's share; ``request_update``: the metadata cache's."""
        self._emit_rows = emit_rows
        self._now_ms = now_ms
        self._owns = owns
        self._request_update = request_update
        #: each watched topic's partitions (the most seen) and, for those absent from the last
        #: complete metadata, how many in a row
        self.topic_parts: dict[str, int] = {}
        self.topic_misses: dict[str, int] = {}
        #: every watched group seen -> complete listings in a row without it (0: in the last one)
        self.group_misses: dict[str, int] = {}
        #: group -> its partitions (on watched topics) reported in group_offsets; of those its
        #: coordinator left out of its last answers, how many answers in a row
        self.gp_known: dict[str, set[tuple[str, int]]] = {}
        self.gp_misses: dict[str, dict[tuple[str, int], int]] = {}

    def forget_unowned(self) -> None:
        """An HA group moved shards (monitor.shards): the topics and group partitions this probe
        no longer owns are forgotten, never said gone (their new owner tracks them)."""
        for t in [t for t in self.topic_parts if not self._owns(t)]:
            del self.topic_parts[t]
            self.topic_misses.pop(t, None)
        for g, known in list(self.gp_known.items()):
            moved = {k for k in known if not self._owns(k[0])}
            if not moved:
                continue
            known.difference_update(moved)
            misses = self.gp_misses.get(g)
            if misses:
                for k in moved:
                    misses.pop(k, None)
                if not misses:
                    del self.gp_misses[g]
            if not known:
                del self.gp_known[g]

    def note_topics(self, view: ClusterView, topics: list[str], now: int) -> None:
        """After each successful metadata refresh (a complete response: ``view``; ``topics``: the
        watched ones it answered without an error): a watched topic seen before and absent from
        ``GONE_AFTER`` responses in a row is deleted, one ``partition_gone`` per partition it had.
        Its first absence asks for metadata again (cause ``topic_missing``), so that the second
        comes one refresh backoff later, not a refresh interval.  A topic the response names with
        an error counts neither way; one that comes back before is seen again.  Per topic, not
        per partition: a topic's partitions are 0..n-1 (a smaller count, which Kafka does not do,
        keeps the larger)."""
        parts, misses, listed = self.topic_parts, self.topic_misses, view.topics
        for name in topics:
            n = listed[name].partition_count
            if parts.get(name, 0) < n:
                parts[name] = n
        if misses:  # seen again (an error in the response: not seen, not missed either)
            for name in [t for t in misses if t in listed and listed[t].error is None]:
                del misses[name]
        absent = parts.keys() - listed.keys()
        if not absent:
            return
        gone: list[str] = []
        first: list[str] = []
        for name in sorted(absent):
            n = misses.get(name, 0) + 1
            if n >= GONE_AFTER:
                gone.append(name)
            else:
                misses[name] = n
                if n == 1:
                    first.append(name)
        if first:
            self._request_update(Cause.TOPIC_MISSING)
            log.info("topic(s) missing from the metadata, asked again to confirm: %s", first[:10])
        if gone:
            rows = [(t, p, "topic deleted") for t in gone for p in range(parts[t])]
            unsent = {rows[i][0] for i in self._emit_rows(PartitionGone, rows, now)}
            for t in gone:
                if t in unsent:  # not enqueued: sent again at the next complete response without it
                    misses[t] = GONE_AFTER - 1
                else:
                    del parts[t]
                    misses.pop(t, None)
            log.info("topic(s) deleted (absent from %d metadata responses in a row): %s", GONE_AFTER, gone[:10])

    def note_groups(self, listed: list[str]) -> list[str]:
        """After each complete group listing (``listed``: the watched groups it named): a group
        seen before (listed, or answered by its coordinator) and absent from ``GONE_AFTER``
        complete listings in a row is deleted: one ``group_gone`` when this probe reports its
        state (its share), and its committed-offset bookkeeping goes with it (the job drops a
        deleted group's partitions with it: no ``group_partition_gone`` for them).  Returns the
        groups forgotten."""
        misses = self.group_misses
        seen = dict.fromkeys(listed, 0)
        gone: list[str] = []
        for g in misses.keys() - seen.keys():
            n = misses[g] + 1
            if n >= GONE_AFTER:
                gone.append(g)
            else:
                seen[g] = n
        self.group_misses = seen
        if not gone:
            return []
        gone.sort()
        owned = [g for g in gone if self._owns(g)]
        rows = [(g, "group deleted") for g in owned]
        unsent = {rows[i][0] for i in self._emit_rows(GroupGone, rows, self._now_ms())}
        forgotten = []
        for g in gone:
            if g in unsent:  # not enqueued: sent again at the next complete listing without it
                seen[g] = GONE_AFTER - 1
                continue
            self.gp_known.pop(g, None)
            self.gp_misses.pop(g, None)
            forgotten.append(g)
        if owned:
            log.info("consumer group(s) deleted (absent from %d complete listings in a row): %s", GONE_AFTER,
                     owned[:10])
        return forgotten

    def note_offsets(self, gid: str, tps: dict[tuple[str, int], Optional[int]],
                     errored: list[tuple[str, int]]) -> None:
        """After each answer of a group's coordinator (``tps``: its committed offsets on watched
        topics; ``errored``: the partitions its answer carried an error for): a partition reported
        before and left out of ``GONE_AFTER`` answers in a row has lost its committed offset (the
        group still exists): one ``group_partition_gone``.  An errored partition counts neither
        way; a coordinator that did not answer is not here at all.  Set operations over the
        group's partitions (in C), Python work only for what is missing."""
        known = self.gp_known.get(gid)
        if known is None:
            if tps:
                self.gp_known[gid] = set(tps)
                self.group_misses.setdefault(gid, 0)  # seen: a later complete listing without it counts
            return
        absent = known.difference(tps)
        if len(known) - len(absent) != len(tps):  # partitions not reported before
            known.update(tps)
        misses = self.gp_misses.get(gid)
        if misses:  # answered again
            for k in [k for k in misses if k in tps]:
                del misses[k]
        if absent and errored:
            absent.difference_update(errored)
        if absent:
            if misses is None:
                misses = self.gp_misses[gid] = {}
            gone: list[tuple[str, int]] = []
            for k in absent:
                n = misses.get(k, 0) + 1
                if n >= GONE_AFTER:
                    gone.append(k)
                else:
                    misses[k] = n
            if gone:
                gone.sort()
                rows = [(gid, t, p, "committed offset deleted") for t, p in gone]
                unsent = {rows[i][1:3] for i in self._emit_rows(GroupPartitionGone, rows, self._now_ms())}
                for k in gone:
                    if k in unsent:  # not enqueued: sent again at the next answer without it
                        misses[k] = GONE_AFTER - 1
                    else:
                        known.discard(k)
                        misses.pop(k, None)
                log.info("committed offsets of group %s deleted (absent from %d answers in a row): %s", gid,
                         GONE_AFTER, gone[:10])
        if misses is not None and not misses:
            del self.gp_misses[gid]
        if not known:
            del self.gp_known[gid]

    def seen_group(self, gid: str) -> None:
        """A group seen other than in a complete listing (its state or committed offsets sent): a
        later complete listing without it counts."""
        self.group_misses.setdefault(gid, 0)
