"""The probe's observation of offsets: ``ProbeOffsetsMixin``, the part of ``monitor.probe.Probe``
that lists the consumer groups, takes their committed offsets and states from the coordinator
child's answers, and reads every watched partition's watermarks.

Watermarks come from one of two places (``offsets_via``):
- ``list_offsets`` (default): ListOffsets earliest/latest through the admin client — cheap,
  right on Apache Kafka;
- ``fetch``: a tail consumer assigned to every watched partition keeps fetching and the HW is
  taken from the fetch responses (``get_watermark_offsets(cached=True)``).  It reads every new
  record once, so it costs the topic's throughput, but it is right on brokers whose ListOffsets
  is not — Tansu answers "latest" with the base offset of the last record batch + 1, so a
  partition whose last batch holds several records looks shorter than it is.  The embedded
  default uses ``fetch`` for that reason.

A broker that does not answer (paused, overloaded) must not blind the probe to the others: an
observation sends the committed-offset and group requests (through the coordinator child) and
the ListOffsets (one request per leader) at once and waits for them until one deadline,
``observe_wait_s()`` (half the interval, at least 2 s, at most the request timeout); the group
listing, which every broker answers, gets a third of it, and a late or incomplete one keeps the
groups listed before.  What is late is missing from that cycle, its brokers are named in the
heartbeat (``unanswered_brokers``), and a broker or group with a request still out is not sent
another until it ends, so a silent broker never holds more than one cycle's requests.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from confluent_kafka import (OFFSET_END, Consumer, IsolationLevel, KafkaError, KafkaException,
                             TopicPartition)
from confluent_kafka.admin import ListOffsetsResultInfo, OffsetSpec

import confluent_kafka.admin as _ck_admin
from monitor.access import missing_acl, timed_out
from monitor.contract import kafka_offset
from monitor.shards import HA_DISCOVERY_S

if TYPE_CHECKING:
    from monitor.emitter import EventEmitter
    from monitor.gone import GoneTracker
    from monitor.metadata import MetadataCache
    from monitor.probe_config import ProbeConfig, ProbeScope

log = logging.getLogger("monitor.probe")  # the probe's log, whichever of its parts writes

#: the C implementation under AdminClient.list_offsets: one future per request, not per
#: partition (present in every confluent-kafka with list_offsets)
_AdminClientImpl: Any = getattr(_ck_admin, "_AdminClientImpl", None)

#: partitions per ListOffsets request (see _send_list_offsets)
LIST_OFFSETS_BATCH = 500
#: a group missing from incomplete group listings is still observed for this long, s
GROUPS_KEPT_S = 600.0


class ProbeOffsetsMixin:
    """``Probe``'s observation of groups and offsets (mixed into it; not used on its own)."""

    if TYPE_CHECKING:  # provided by Probe
        cfg: ProbeConfig
        metadata: MetadataCache
        _ops: Any
        _emitter: EventEmitter
        _scope: ProbeScope
        _gone: GoneTracker
        membership: Any
        _watched_leaders: list[int]

        def _now_ms(self) -> int: ...

        def _warn_once(self, kind: str, msg: str, *args: Any) -> None: ...

        def invalidate(self, error: Any, where: str) -> Optional[str]: ...

        def _on_client_error(self, err: KafkaError) -> None: ...

        def observe_wait_s(self) -> float: ...

    def _init_offsets(self) -> None:
        #: the tail consumer of offsets_via = "fetch", and the partitions assigned to it
        self._tail: Optional[Consumer] = None
        self._tail_assigned: set[tuple[str, int]] = set()
        #: ListOffsets requests for _watched_partitions (and the leaders they were built for),
        #: built again only when those change
        self._lo_for: Optional[list[tuple[str, int]]] = None
        self._lo_leaders: list[int] = []
        self._lo_requests: tuple[list, list, list] = ([], [], [])
        self._lo_owners: list[int] = []
        #: leader -> its ListOffsets requests the probe stopped waiting for (_collect_list_offsets)
        self._lo_out: dict[int, list[concurrent.futures.Future]] = {}
        #: each watched partition's log start offset as last answered (ListOffsets earliest is
        #: asked every ``log_start_interval_s``); when it was asked; whether to ask at the next one
        self._log_starts: dict[tuple[str, int], Optional[int]] = {}
        self._log_starts_at = float("-inf")
        self._log_starts_due = True
        self._log_starts_for: Optional[list[tuple[str, int]]] = None
        #: each partition's leader epoch as its leader's latest ListOffsets answer said, and the view
        #: those requests were sent under (whose leaders they went to): the next refresh's epochs
        self._answered_epochs: dict[tuple[str, int], int] = {}
        self._answered_view: Any = None
        #: the group listing, while it is out (_listed_groups); the watched groups it named, and when
        self._listing: Optional[concurrent.futures.Future] = None
        self._groups_seen: dict[str, float] = {}
        #: group -> its coordinator as last described; the brokers this observation found silent
        self._group_coordinators: dict[str, int] = {}
        self._unanswered: set[int] = set()
        #: with an HA group: group -> the partitions of its last answer that asked them all (which
        #: of them are this probe's?), the groups asked for some partitions only this time, the
        #: requests built for a group (until the shards move), and when the last discovery began
        self._group_parts: dict[str, frozenset[tuple[str, int]]] = {}
        self._partial: set[str] = set()
        self._asks: dict[str, Optional[list[tuple[str, int]]]] = {}
        self._asks_for = -1
        self._discovered_at = float("-inf")
        self._discovering = True
        self._groups_listed = False

    def _discovery_round(self) -> bool:
        """Whether this observation lists the groups and asks every group's committed offsets:
        always without an HA group; with one, every ``HA_DISCOVERY_S`` and at every observation
        until a listing first comes back complete (the cluster shard's holder lists the groups
        every time, ``_listed_groups``)."""
        if self.membership is None:
            return True
        now = time.monotonic()
        if now - self._discovered_at >= HA_DISCOVERY_S:
            self._discovered_at = now
            return True
        return not self._groups_listed

    def _groups_to_ask(self, groups: list[str], discovering: bool) -> dict[str, Optional[list[tuple[str, int]]]]:
        """The committed offsets this observation asks: every partition of every group (None) in a
        discovery round and without an HA group; else, per group, its partitions on the topics this
        probe watches as its last whole answer named them, all of a group not asked yet, and
        nothing of a group with none here."""
        self._partial = set()
        if discovering:
            if self.membership is not None:
                listed = set(groups)
                self._group_parts = {g: t for g, t in self._group_parts.items() if g in listed}
                self._asks = {}
            return dict.fromkeys(groups)
        if self._asks_for != self._scope.version:
            self._asks, self._asks_for = {}, self._scope.version
        known, asks, watched = self._group_parts, self._asks, self._scope.watched
        out: dict[str, Optional[list[tuple[str, int]]]] = {}
        for g in groups:
            parts = known.get(g)
            if parts is None:
                out[g] = None
                continue
            mine = asks.get(g)
            if mine is None:
                mine = asks[g] = sorted(tp for tp in parts if watched(tp[0]))
            if mine:
                out[g] = mine
                self._partial.add(g)
        return out

    def _listed_groups(self, deadline: float) -> list[str]:
        """The consumer groups to observe: the watched ones the last group listing named.

        ListGroups goes to every broker, and each lists the groups it coordinates: one broker
        that does not answer holds the listing until its request timeout, and then leaves its
        groups out.  So the listing is waited for until ``deadline`` only, and is not sent again
        while one is out; a listing that is late or incomplete (an error from some broker) keeps
        the groups listed before (for ``GROUPS_KEPT_S``), and a complete one replaces them."""
        fut = self._listing
        if fut is None and not self._discovering and not self._scope.cluster_wide():
            return sorted(self._groups_seen)  # an HA group's probe: the last discovery's listing
        if fut is None:
            try:
                fut = self._listing = self._ops.list_consumer_groups(request_timeout=self.cfg.request_timeout_s)
            except Exception as e:
                self._warn_once("list_groups", "listing consumer groups failed: %s", e)
        listing = None
        if fut is not None:
            try:
                listing = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                self._listing = None
            except concurrent.futures.TimeoutError:
                self._warn_once("list_groups_late", "the consumer group listing was not answered within %.1fs (a "
                                "broker not answering): the groups listed before are observed meanwhile",
                                self.observe_wait_s())
            except Exception as e:
                self._listing = None
                log.warning("listing consumer groups failed: %s%s", e,
                            missing_acl(e, cluster=("DESCRIBE", "kafka-cluster")))
        now = time.monotonic()
        if listing is not None:
            valid = [g.group_id for g in listing.valid]
            wanted = self._scope.watched_groups(valid)
            errors = getattr(listing, "errors", None)
            if errors:
                self._warn_once("list_groups_partial", "the consumer group listing is incomplete (%s): the groups "
                                "listed before are kept for %.0fs", errors[0], GROUPS_KEPT_S)
            elif not wanted:
                self._warn_once("no_groups", "no consumer group matching groups_include %r / groups_exclude %r is "
                                "listed: none exists, or the probe's user may not see them (ListGroups leaves out "
                                "the groups a user lacks DESCRIBE on) -- permission missing?: DESCRIBE on "
                                "Group:<name>", self.cfg.groups_include, self.cfg.groups_exclude)
            if not errors:
                self._groups_listed = True
                self._groups_seen = dict.fromkeys(wanted, now)
                for g in self._gone.note_groups(wanted):  # deleted
                    self._group_coordinators.pop(g, None)
                return sorted(wanted)
            self._groups_seen.update(dict.fromkeys(wanted, now))
        self._groups_seen = {g: t for g, t in self._groups_seen.items() if now - t <= GROUPS_KEPT_S}
        return sorted(self._groups_seen)

    def _committed_offsets(self, answers: dict[str, Any]) -> dict[str, dict[tuple[str, int], Optional[int]]]:
        """Each group's committed offsets on watched topics, from the coordinators' answers."""
        out: dict[str, dict[tuple[str, int], Optional[int]]] = {}
        for gid, res in answers.items():
            if isinstance(res, Exception):
                self._unanswered_group(gid, res)
                log.warning("committed offsets of group %s: %s%s", gid, res,
                            missing_acl(res, group=("DESCRIBE", gid), topic=("DESCRIBE", "<the group's topics>")))
                continue
            known = self.metadata.cluster.topics if self.metadata.cluster is not None else {}
            tps: dict[tuple[str, int], Optional[int]] = {}
            errored: list[tuple[str, int]] = []
            watched = self._scope.watched
            partial = gid in self._partial
            if self.membership is not None and not partial:
                self._group_parts[gid] = frozenset((t, p) for t, p, _, _ in res)
                self._asks.pop(gid, None)
            for topic, partition, off, error in res:
                if partial and error is None and (off is None or off < 0):
                    continue  # named, never committed (or no longer): as absent from a whole answer
                if error is not None:
                    errored.append((topic, partition))
                    if self.invalidate(error, f"committed offsets of {gid}") is None:
                        self._warn_once(f"offsets:{gid}", "committed offsets of group %s on %s/%d: %s%s", gid, topic,
                                        partition, error, missing_acl(error, topic=("DESCRIBE", topic)))
                    continue
                if not watched(topic):
                    continue
                if topic not in known:
                    # a topic this client has not seen yet (created, or deleted under the group):
                    # Kafka's add(topic) forces a metadata update
                    self.metadata.add_topic(topic)
                tps[(topic, partition)] = off if off is not None and off >= 0 else None  # kafka_offset()
            self._gone.note_offsets(gid, tps, errored)
            if tps or self._scope.owns(gid):  # sharing: its offsets on this share's topics, or its state
                out[gid] = tps
        return out

    def _unanswered_group(self, gid: str, error: Exception) -> None:
        """A group request that timed out: its coordinator (as last described) did not answer."""
        if timed_out(error):
            node = self._group_coordinators.get(gid)
            if node is not None:
                self._unanswered.add(node)

    def _group_states(self, answers: dict[str, Any]) -> None:
        """One ``group_state`` per group from the coordinator's DescribeGroups answer.  The
        generation is not exposed by DescribeGroups (nor by the admin API), so it stays null."""
        at = self._now_ms()
        coordinators = self._group_coordinators
        for gid, d in answers.items():
            if isinstance(d, Exception):
                self._unanswered_group(gid, d)
                self._warn_once("describe_group", "describing group %s: %s%s", gid, d,
                                missing_acl(d, group=("DESCRIBE", gid)))
                continue
            if d.coordinator is not None:
                if len(coordinators) > 100_000:
                    coordinators.clear()
                coordinators[gid] = d.coordinator
            self._gone.seen_group(gid)  # its state sent: seen (if only partial listings named it)
            self._emitter.emit(d, observed_at=at)

    def _watermarks(self, partitions: list[tuple[str, int]], sent: Any = None, deadline: Optional[float] = None,
                    ) -> tuple[dict[tuple[str, int], tuple[Optional[int], int, Optional[int]]], int]:
        """(log start, high watermark, last stable offset) per partition that answered, and the
        observation's time.  ``sent``: the ListOffsets already sent (``_send_list_offsets``),
        waited for until ``deadline``."""
        if self.cfg.offsets_via == "fetch":
            return self._watermarks_from_fetch(partitions)
        if sent is None:
            sent = self._send_list_offsets(partitions)
        return self._watermarks_from_list_offsets(partitions, sent, deadline)

    def _watermarks_from_list_offsets(self, partitions, sent, deadline):
        out = {}
        if not partitions:
            return out, self._now_ms()
        try:
            at, latest, earliest, stable = self._collect_list_offsets(sent, deadline)
        except KafkaException as e:
            self.invalidate(e.args[0] if e.args else e, "list_offsets")
            self._warn_once("list_offsets", "list_offsets failed: %s", e)
            return out, self._now_ms()
        if earliest is None:  # not asked this time: the last answers
            return self._with_log_starts(partitions, latest, stable), at
        get_hi, get_lo, get_lso, ok = latest.get, earliest.get, stable.get, ListOffsetsResultInfo
        starts = {}  # (topic, partition) -> log start or None
        epochs = self._new_answers()
        self._log_starts_due = False
        for tp, key in zip(self._lo_requests[0], partitions):
            hi, lo = get_hi(tp), get_lo(tp)
            if type(lo) is ok:
                starts[key] = lo.offset if lo.offset is not None and lo.offset >= 0 else None
            elif key in self._log_starts:  # no answer this time (its broker was late): the last one
                starts[key] = self._log_starts[key]
            if type(hi) is ok and type(lo) is ok:  # the common case, without the checks below
                h, lo, lso = hi.offset, lo.offset, get_lso(tp)
                if hi.leader_epoch is not None:  # LATEST answers with the leader's current epoch
                    epochs[key] = hi.leader_epoch
                if h is not None and h >= 0:
                    # LSO: the read_committed "latest"; an error or a broker without it leaves it unknown
                    lso = lso.offset if type(lso) is ok and lso.offset is not None and lso.offset >= 0 else None
                    out[key] = (lo if lo is not None and lo >= 0 else None, h, lso)  # kafka_offset(lo)
                continue
            if hi is None or lo is None:  # its broker did not answer in time (_collect_list_offsets)
                continue
            err = hi if not hasattr(hi, "offset") else lo if not hasattr(lo, "offset") else None
            if err is not None:
                self._partition_offsets_error(key, err)
                continue
            hi, lo = hi.offset, lo.offset
            if hi is not None and hi >= 0:
                out[key] = (kafka_offset(lo), hi, None)
        self._log_starts = starts
        return out, at

    def _with_log_starts(self, partitions: list[tuple[str, int]], latest: dict, stable: dict
                         ) -> dict[tuple[str, int], tuple[Optional[int], int, Optional[int]]]:
        """``_watermarks_from_list_offsets`` between two rounds of log start offsets: each
        partition's HW and LSO, with its log start as last answered.  One whose HW is now below
        that (a topic deleted and created again, a log truncated) has none, and the log starts
        are asked again at the next observation."""
        out = {}
        get_hi, get_lso, ok, starts = latest.get, stable.get, ListOffsetsResultInfo, self._log_starts
        epochs = self._new_answers()
        for tp, key in zip(self._lo_requests[0], partitions):
            hi = get_hi(tp)
            if type(hi) is ok:
                h, lso = hi.offset, get_lso(tp)
                if hi.leader_epoch is not None:
                    epochs[key] = hi.leader_epoch
                if h is not None and h >= 0:
                    lso = lso.offset if type(lso) is ok and lso.offset is not None and lso.offset >= 0 else None
                    lo = starts.get(key)
                    if key not in starts or (lo is not None and lo > h):  # unknown, or out of date
                        lo, self._log_starts_due = None, True
                    out[key] = (lo, h, lso)
                continue
            if hi is not None and not hasattr(hi, "offset"):
                self._partition_offsets_error(key, hi)
        return out

    def _new_answers(self) -> dict[tuple[str, int], int]:
        """The leader epochs of this round of ListOffsets answers, to be filled: they replace the
        last round's, under the view the requests were sent with."""
        self._answered_epochs, self._answered_view = {}, self.metadata.cluster
        return self._answered_epochs

    def _partition_offsets_error(self, key: tuple[str, int], err: Any) -> None:
        """A partition's ListOffsets answered with an error: the metadata invalidated where the
        error says so, otherwise a warning (naming the ACL when it is one)."""
        topic, part = key
        if self.invalidate(err, f"offsets of {topic}/{part}") is None:
            self._warn_once("list_offsets", "offsets of %s/%d: %s%s", topic, part, err,
                            missing_acl(err, topic=("DESCRIBE", topic)))

    def _send_list_offsets(self, partitions: list[tuple[str, int]]) -> Any:
        """ListOffsets latest, earliest and latest with read_committed isolation (the last stable
        offset: what a read_committed consumer can read up to) for ``partitions``, sent and not
        waited for (``_collect_list_offsets``).

        Two costs are avoided here.  AdminClient.list_offsets makes a future per partition and
        settles each from a Python callback (~25 us a partition); the probe hands its request
        lists to the C implementation under it, with one future per request, and builds those
        lists only when the watched partitions change.  And librdkafka merges the answers of a
        request's brokers by a linear search per partition (``rd_kafka_ListOffsets_response_merge``),
        so a request's cost grows with the square of its partitions (20,000 in one request:
        1.5 CPU-s; in requests of 500: 0.1): the probe sends requests of ``LIST_OFFSETS_BATCH``
        partitions, all at once, each to one leader (a request spanning brokers is answered when
        its slowest broker answers).  A leader whose requests of an earlier cycle are still out
        (it has not answered them, and librdkafka has not timed them out yet) is not sent more:
        its partitions go unobserved, so a silent broker never holds more than one cycle's
        requests.  An injected admin (tests) goes through its list_offsets."""
        leaders = self._watched_leaders if len(self._watched_leaders) == len(partitions) else [-1] * len(partitions)
        if self._lo_for is not partitions or self._lo_leaders is not leaders:
            latest, earliest = OffsetSpec.latest()._value, OffsetSpec.earliest()._value
            keys = [TopicPartition(t, p) for t, p in partitions]
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp, leader in zip(partitions, leaders):
                by_leader.setdefault(leader, []).append(tp)
            batches, owners = [], []
            for leader, tps in sorted(by_leader.items()):
                for i in range(0, len(tps), LIST_OFFSETS_BATCH):
                    batches.append(tps[i:i + LIST_OFFSETS_BATCH])
                    owners.append(leader)
            self._lo_requests = (keys, [[TopicPartition(t, p, latest) for t, p in b] for b in batches],
                                 [[TopicPartition(t, p, earliest) for t, p in b] for b in batches])
            self._lo_owners = owners
            self._lo_for, self._lo_leaders = partitions, leaders
        keys, latest_reqs, earliest_reqs = self._lo_requests
        timeout = self.cfg.request_timeout_s
        committed = IsolationLevel.READ_COMMITTED
        if _AdminClientImpl is not None and isinstance(self._ops, _AdminClientImpl):
            busy = {owner for owner, futures in self._lo_out.items() if any(not f.done() for f in futures)}
            now = time.monotonic()
            if partitions is not self._log_starts_for:  # new partitions are asked at once
                self._log_starts_for = partitions
                self._log_starts_due |= any(tp not in self._log_starts for tp in partitions)
            ask_starts = self._log_starts_due or now - self._log_starts_at >= self.cfg.log_start_interval_s
            if ask_starts:
                self._log_starts_at = now
            sent: list[Optional[list[Optional[concurrent.futures.Future]]]] = []
            kinds: tuple[tuple[Any, dict[str, Any]], ...] = ((latest_reqs, {}), (earliest_reqs, {}), (latest_reqs, {"isolation_level_value": committed.value}))
            for k, (reqs, extra) in enumerate(kinds):
                futures: list[Optional[concurrent.futures.Future]] = []
                if k == 1 and not ask_starts:
                    sent.append(None)
                    continue
                for req, owner in zip(reqs, self._lo_owners):
                    if owner in busy:
                        futures.append(None)
                        continue
                    f: concurrent.futures.Future = concurrent.futures.Future()
                    f.set_running_or_notify_cancel()
                    _AdminClientImpl.list_offsets(self._ops, req, f, request_timeout=timeout, **extra)
                    futures.append(f)
                sent.append(futures)
            return ("impl", self._now_ms(), kinds, sent, busy)
        futs = [self._ops.list_offsets({tp: spec for tp in keys}, request_timeout=timeout, **extra)
                for spec, extra in ((OffsetSpec.latest(), {}), (OffsetSpec.earliest(), {}),
                                    (OffsetSpec.latest(), {"isolation_level": committed}))]
        return ("api", self._now_ms(), futs)

    def _collect_list_offsets(self, sent: Any, deadline: Optional[float]) -> tuple[int, dict, Optional[dict], dict]:
        """The answers to ``_send_list_offsets``, waited for until ``deadline``, and when the
        requests were sent (the observation's time); the log starts' answers are None when they
        were not asked.  Each result: TopicPartition ->
        ListOffsetsResultInfo, or the error of that partition; a request that fails is an error
        for each of its partitions, as AdminClient.list_offsets reports it; the partitions of a
        request not answered in time are left out (their leader is in ``_unanswered``)."""
        if deadline is None:
            deadline = time.monotonic() + self.observe_wait_s()
        if sent[0] == "impl":
            _, at, kinds, requests, busy = sent
            results: list[Optional[dict]] = []
            late = set(busy)
            for (reqs, _), futures in zip(kinds, requests):
                if futures is None:  # the log starts, not asked this time
                    results.append(None)
                    continue
                merged: dict = {}
                for req, f, owner in zip(reqs, futures, self._lo_owners):
                    if f is None:
                        continue
                    try:
                        merged.update(f.result(timeout=max(0.0, deadline - time.monotonic())))
                    except concurrent.futures.TimeoutError:
                        late.add(owner)
                    except KafkaException as e:  # the request failed: each of its partitions did
                        err = e.args[0] if e.args else e
                        merged.update(dict.fromkeys(req, err))
                results.append(merged)
            # requests not waited for stay with their client until they end (close() waits for
            # them: librdkafka crashes the process when a client goes with requests in flight)
            out = self._lo_out
            for futures in requests:
                for f, owner in zip(futures or (), self._lo_owners):
                    if f is not None and not f.done():
                        out.setdefault(owner, []).append(f)
            self._lo_out = {o: kept for o, fs in out.items() if (kept := [f for f in fs if not f.done()])}
            late.discard(-1)
            if late:
                self._unanswered.update(late)
                self._warn_once(f"list_offsets_late_{sorted(late)}", "offsets from broker(s) %s not answered within "
                                "%.1fs: their partitions are not observed until they answer", sorted(late),
                                self.observe_wait_s())
            return at, results[0] or {}, results[1], results[2] or {}
        _, at, futs = sent

        def settled(fmap: dict) -> dict:
            out = {}
            for tp, f in fmap.items():
                try:
                    out[tp] = f.result()
                except KafkaException as e:
                    out[tp] = e.args[0] if e.args else e
            return out
        return at, settled(futs[0]), settled(futs[1]), settled(futs[2])

    # -- fetch mode: a tail consumer ------------------------------------------------------------

    def _ensure_tail(self, partitions: list[tuple[str, int]]) -> Consumer:
        if self._tail is None:
            self._tail = Consumer({
                **self.cfg.client_conf(),
                "group.id": f"kafka-monitor-probe-{self.cfg.source}",  # never joins nor commits
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": 250,
                "error_cb": self._on_client_error,
            })
        new = [tp for tp in partitions if tp not in self._tail_assigned]
        if new:
            self._tail.incremental_assign([TopicPartition(t, p, OFFSET_END) for t, p in new])
            self._tail_assigned.update(new)
        gone = self._tail_assigned - set(partitions)
        if gone:
            self._tail.incremental_unassign([TopicPartition(t, p) for t, p in gone])
            self._tail_assigned -= gone
        return self._tail

    def _watermarks_from_fetch(self, partitions):
        tail = self._ensure_tail(partitions)
        self._drain_tail(0)
        at = self._now_ms()
        out = {}
        for t, p in partitions:
            lo, hi = tail.get_watermark_offsets(TopicPartition(t, p), cached=True)
            if hi is None or hi < 0:
                continue  # no fetch response yet for this partition
            # The LSO is not exposed with the cached watermarks (statistics carry it, but from an
            # older moment than the HW); null rather than a value from another observation.
            out[(t, p)] = (kafka_offset(lo), hi, None)
        return out, at

    def _drain_tail(self, timeout: float) -> None:
        """Consume (and discard) what the tail consumer fetched, for up to ``timeout`` seconds;
        its fetch queue must not fill up, or fetching — and so the HW — would stop."""
        if self._tail is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            for m in self._tail.consume(num_messages=10_000, timeout=max(0.0, min(0.5, remaining))):
                err = m.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    if self.invalidate(err, "tail consumer fetch") is None:
                        self._warn_once(f"tail:{err.name()}", "tail consumer: %s%s", err, missing_acl(
                            err, topic=("READ", m.topic() or "<watched topics>"),
                            group=("DESCRIBE", f"kafka-monitor-probe-{self.cfg.source}")))
            if remaining <= 0:
                return
