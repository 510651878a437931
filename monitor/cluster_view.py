"""The immutable cluster view: what one MetadataResponse said (Java's ``Cluster``), and what
changed between two of them.

Frozen dataclasses, tuples and ``MappingProxyType``: a view is never mutated, only replaced,
so readers take it without a lock (``monitor.metadata.MetadataCache.cluster``).  A partition
leader of ``-1`` (:data:`monitor.contract.NO_LEADER`) means "no leader"; ``controller_id`` is
``None`` when the response names none.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Optional

from monitor.contract import NO_LEADER

#: Topics a MetadataResponse flags ``is_internal`` (librdkafka does not expose the flag).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


# ---------------------------------------------------------------------------------------------
# The immutable cluster view
# ---------------------------------------------------------------------------------------------


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(map(int, values))


def _confluent_partition_type() -> Optional[type]:
    try:
        from confluent_kafka.admin import PartitionMetadata
    except ImportError:  # pragma: no cover - the project depends on confluent-kafka
        return None
    return PartitionMetadata


#: confluent_kafka's partition metadata class: ints and lists of ints, no leader epoch, no
#: offline replicas (ClusterView.from_confluent reads it without per-attribute probing)
_CONFLUENT_PARTITION = _confluent_partition_type()


def _error_name(error: Any) -> Optional[str]:
    """``KafkaError`` -> its name; ``None`` stays ``None``; anything else -> ``str``."""
    if error is None:
        return None
    name = getattr(error, "name", None)
    return str(name()) if callable(name) else str(error)


@dataclass(frozen=True)
class PartitionView:
    """One partition of a MetadataResponse."""

    topic: str
    partition: int
    leader: int  # -1 (NO_LEADER): no leader
    leader_epoch: Optional[int] = None  # not in librdkafka's metadata: see from_confluent
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()
    error: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("replicas", "isr", "offline_replicas"):
            object.__setattr__(self, name, _ints(getattr(self, name)))


@dataclass(frozen=True)
class TopicView:
    """One topic of a MetadataResponse; ``partitions`` sorted by partition index."""

    name: str
    partitions: tuple[PartitionView, ...] = ()
    error: Optional[str] = None
    is_internal: bool = False

    def __post_init__(self) -> None:
        parts = tuple(sorted(self.partitions.values() if isinstance(self.partitions, Mapping) else self.partitions,
                             key=lambda p: p.partition))
        seen: set[int] = set()
        for p in parts:
            if p.topic != self.name:
                raise ValueError(f"topic {self.name!r}: partition {p.partition} belongs to topic {p.topic!r}")
            if p.partition in seen:
                raise ValueError(f"topic {self.name!r}: partition {p.partition} listed twice")
            seen.add(p.partition)
        object.__setattr__(self, "partitions", parts)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @functools.cached_property
    def leader_ids(self) -> frozenset[int]:
        """Every partition's leader id (-1 included): lets ClusterView.leaderless() skip a topic
        whose leaders are all live brokers without looking at its partitions."""
        return frozenset(p.leader for p in self.partitions)


class BrokerView(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: Optional[str] = None


@dataclass(frozen=True)
class ClusterView:
    """What one successful MetadataResponse said: Java's ``Cluster``.  Never mutated; replaced."""

    cluster_id: Optional[str]
    controller_id: Optional[int]
    brokers: tuple[BrokerView, ...]
    topics: Mapping[str, TopicView] = field(default_factory=lambda: types.MappingProxyType({}))

    def __post_init__(self) -> None:
        brokers = tuple(sorted((BrokerView(*b) for b in self.brokers), key=lambda b: b.node_id))
        object.__setattr__(self, "brokers", brokers)
        if isinstance(self.topics, Mapping):
            for key, t in self.topics.items():
                if key != t.name:
                    raise ValueError(f"topics[{key!r}] holds topic {t.name!r}")
            items = list(self.topics.values())
        else:
            items = list(self.topics)
        topics = {t.name: t for t in sorted(items, key=lambda t: t.name)}
        if len(topics) != len(items):
            raise ValueError("a topic is listed twice")
        object.__setattr__(self, "topics", types.MappingProxyType(topics))

    @classmethod
    def from_confluent(cls, md: Any, leader_epochs: Optional[Mapping[tuple[str, int], int]] = None,
                       previous: Optional["ClusterView"] = None) -> "ClusterView":
        """Build a view from confluent_kafka's ``ClusterMetadata`` (``AdminClient.list_topics()``).

        librdkafka's metadata objects carry no leader epoch, rack, offline replicas or
        ``is_internal``: they become the epoch below, ``None``, the replicas on brokers the response
        does not list (Kafka lists only live, unfenced brokers, and its offline replicas are
        those on brokers that are not alive, or on an offline log dir, which this cannot see)
        and "name is a known internal topic".  Errors keep their name.

        The controller: a KRaft cluster's MetadataResponse names a random live broker, not its
        active controller (which is not a broker at all where controllers run apart), so
        ``controller_id`` is ``None``: no answer rather than a wrong one.

        ``previous``: the view of the previous response.  A partition that says exactly what it
        said there is that same (immutable) :class:`PartitionView` object, and a topic all of
        whose partitions are is the same :class:`TopicView`: the view is equal to one built
        without ``previous``, and comparing it with ``previous`` (``diff_views``, the probe's
        "changed since sent") costs an identity test where nothing changed.

        Leader epochs: ``leader_epochs`` holds what the leaders of ``previous`` answered (the
        probe's ListOffsets, whose LATEST answer carries the leader's current epoch).  A partition
        whose leader is the one in ``previous`` takes that epoch, or keeps the one it had there
        when its leader did not answer; a partition with a new leader, or new itself, has none
        (``None``) until a refresh after its leader answered."""
        epochs = leader_epochs or {}
        brokers = tuple(BrokerView(int(b.id), str(b.host), int(b.port), getattr(b, "rack", None))
                        for b in md.brokers.values())
        live = {b.node_id for b in brokers}
        all_live = live.issuperset
        prev_topics = previous.topics if previous is not None else {}
        fast_type: Any = _CONFLUENT_PARTITION

        def offline(pmd: Any) -> tuple[int, ...]:
            reported = getattr(pmd, "offline_replicas", None)
            if reported is not None:
                return _ints(reported)
            return tuple(r for r in _ints(pmd.replicas) if r not in live)

        def build(name: str, pmd: Any, o: Optional[PartitionView]) -> PartitionView:
            pid, leader = int(pmd.id), int(pmd.leader)
            epoch = getattr(pmd, "leader_epoch", None)
            if epoch is None and o is not None and o.leader == leader:
                epoch = epochs.get((name, pid), o.leader_epoch)
            return PartitionView(topic=name, partition=pid, leader=leader, leader_epoch=epoch,
                                 replicas=_ints(pmd.replicas), isr=_ints(pmd.isrs),
                                 offline_replicas=offline(pmd),
                                 error=_error_name(pmd.error))

        topics: list[TopicView] = []
        for name, tmd in md.topics.items():
            name = getattr(tmd, "topic", None) or name
            old_topic = prev_topics.get(name)
            old_parts = old_topic.partitions if old_topic is not None else ()
            n_old = len(old_parts)
            by_id: Optional[dict[int, PartitionView]] = None
            parts = []
            same = 0  # partitions that are the previous view's objects
            for pmd in tmd.partitions.values():
                if not n_old:
                    parts.append(build(name, pmd, None))
                    continue
                pid = int(pmd.id)
                o = old_parts[pid] if 0 <= pid < n_old and old_parts[pid].partition == pid else None
                if o is None:
                    if by_id is None:
                        by_id = {p.partition: p for p in old_parts}
                    o = by_id.get(pid)
                if type(pmd) is not fast_type:
                    parts.append(build(name, pmd, o))
                    continue
                reps = pmd.replicas
                if (o is not None and pmd.error is None and o.error is None and o.leader == pmd.leader
                        and o.leader_epoch == epochs.get((name, pid), o.leader_epoch) and o.replicas == tuple(reps)
                        and o.isr == tuple(pmd.isrs)
                        and o.offline_replicas == (() if all_live(reps) else tuple(r for r in reps if r not in live))):
                    parts.append(o)
                    same += 1
                else:
                    parts.append(build(name, pmd, o))
            error = _error_name(tmd.error)
            internal = bool(getattr(tmd, "is_internal", name in INTERNAL_TOPICS))
            if (old_topic is not None and same == len(parts) == n_old and old_topic.error == error
                    and old_topic.is_internal == internal):
                topics.append(old_topic)
            else:
                topics.append(TopicView(name=name, partitions=tuple(parts), error=error, is_internal=internal))
        return cls(cluster_id=md.cluster_id, controller_id=None, brokers=brokers,
                   topics={t.name: t for t in topics})

    @classmethod
    def from_metadata_response(cls, resp: Any, named: Iterable[str], previous: Optional["ClusterView"]
                               ) -> "ClusterView":
        """Build a view from kafka-python's decoded ``MetadataResponse`` to a request naming the
        topics ``named`` (``monitor.named_metadata``), over ``previous``.

        The answer replaces the named topics; every other topic of ``previous`` is carried over as
        it was (an HA probe names only its own shards' topics, and reports nothing of the others).
        A named topic answered UNKNOWN_TOPIC_OR_PARTITION or UNKNOWN_TOPIC_ID is gone, as it would
        be from a whole listing.  Leader epochs come with the answer (Metadata v7 and later).  As
        in ``from_confluent``, a partition or topic that says what it said in ``previous`` is
        that same object, and ``controller_id`` is ``None``."""
        from kafka import errors as kerrors

        def err(code: int) -> Optional[str]:
            return None if not code else str(getattr(kerrors.for_code(code), "message", code))

        brokers = tuple(BrokerView(int(b.node_id), str(b.host), int(b.port), b.rack) for b in resp.brokers)
        live = {b.node_id for b in brokers}
        prev_topics = previous.topics if previous is not None else {}
        topics: dict[str, TopicView] = dict(prev_topics)
        for name in named:
            topics.pop(name, None)
        for t in resp.topics:
            name = t.name
            if t.error_code in (3, 100) or not name:  # gone
                topics.pop(name, None)
                continue
            old_topic = prev_topics.get(name)
            old_parts = {p.partition: p for p in old_topic.partitions} if old_topic is not None else {}
            parts, same = [], 0
            for p in t.partitions:
                epoch = p.leader_epoch if p.leader_epoch is not None and p.leader_epoch >= 0 else None
                reps, isr = tuple(p.replica_nodes), tuple(p.isr_nodes)
                # as from_confluent: the replicas on brokers the answer does not list (the answer's own
                # offline_replicas also names those on an offline log dir: the ELR look adds them)
                offline = tuple(r for r in reps if r not in live)
                o = old_parts.get(p.partition_index)
                if (o is not None and not p.error_code and o.error is None and o.leader == p.leader_id
                        and o.leader_epoch == epoch and o.replicas == reps and o.isr == isr
                        and o.offline_replicas == offline):
                    parts.append(o)
                    same += 1
                    continue
                parts.append(PartitionView(topic=name, partition=int(p.partition_index), leader=int(p.leader_id),
                                           leader_epoch=epoch, replicas=reps, isr=isr, offline_replicas=offline,
                                           error=err(p.error_code)))
            error, internal = err(t.error_code), bool(t.is_internal)
            if (old_topic is not None and same == len(parts) == len(old_topic.partitions)
                    and old_topic.error == error and old_topic.is_internal == internal):
                topics[name] = old_topic
            else:
                topics[name] = TopicView(name=name, partitions=tuple(parts), error=error, is_internal=internal)
        return cls(cluster_id=resp.cluster_id, controller_id=None, brokers=brokers, topics=topics)

    @property
    def broker_ids(self) -> frozenset[int]:
        return frozenset(b.node_id for b in self.brokers)

    def partitions(self) -> Iterator[PartitionView]:
        for t in self.topics.values():
            yield from t.partitions

    def leaderless(self) -> tuple[tuple[str, int], ...]:
        """Partitions with no known leader: ``leader == -1``, or a leader id that is not among the
        brokers (Java's ``Cluster`` then has no leader ``Node`` for the partition either)."""
        ids = self.broker_ids
        out: list[tuple[str, int]] = []
        for t in self.topics.values():
            if NO_LEADER not in t.leader_ids and t.leader_ids <= ids:
                continue
            out.extend((p.topic, p.partition) for p in t.partitions if p.leader == NO_LEADER or p.leader not in ids)
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# What changed from one view to the next
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaderChange:
    topic: str
    partition: int
    old_leader: int
    new_leader: int
    old_epoch: Optional[int]
    new_epoch: Optional[int]


@dataclass(frozen=True)
class PartitionCount:
    """A topic's partition count as the metadata cache knows it.  ``changed_at_ms`` is the ``now`` of the
    update that first saw the current count differ from the previous one (``None``: never changed
    since the topic was first seen) — the caller subtracts the real change time to get how long
    this client took to notice (KAFKA-INTERNALS §2)."""

    count: int
    changed_at_ms: Optional[int] = None
    previous: Optional[int] = None
    #: consecutive updates that answered fewer partitions than ``count`` (see track_partition_counts)
    lower_seen: int = 0


#: a topic's partition count only grows; a smaller count is believed after this many updates in a
#: row say so (a deleted and re-created topic), not from one broker whose view lags behind
DECREASE_CONFIRMATIONS = 3


def diff_views(previous: Optional[ClusterView], current: ClusterView) -> tuple[
        tuple[str, ...], tuple[str, ...], tuple[LeaderChange, ...]]:
    """(new topics, removed topics, leader / leader-epoch changes) from ``previous`` to ``current``."""
    old_topics = previous.topics if previous is not None else {}
    new_topics = tuple(sorted(set(current.topics) - set(old_topics)))
    removed = tuple(sorted(set(old_topics) - set(current.topics)))
    leaders = []
    for name, t in current.topics.items():
        old = old_topics.get(name)
        if old is None or old is t:  # a new topic, or one the view took over unchanged
            continue
        old_parts = {o.partition: o for o in old.partitions}
        for p in t.partitions:
            o = old_parts.get(p.partition)
            if o is not None and o is not p and (o.leader, o.leader_epoch) != (p.leader, p.leader_epoch):
                leaders.append(LeaderChange(p.topic, p.partition, o.leader, p.leader, o.leader_epoch, p.leader_epoch))
    return new_topics, removed, tuple(leaders)


def track_partition_counts(counts: Mapping[str, PartitionCount], current: ClusterView, now: int) -> tuple[
        dict[str, PartitionCount], dict[str, tuple[int, int]]]:
    """New per-topic partition counts and the changes seen at ``now``.

    Counts come from topics without an error; a topic that reports an error keeps its last known
    count (so a change across a transient error is still seen); a topic absent from the view is
    forgotten (bounded state).  Each broker applies the cluster's metadata on its own, so right
    after partitions are added one may still answer the old count (seen on a loaded real
    cluster): a smaller count counts only after DECREASE_CONFIRMATIONS updates in a row."""
    out: dict[str, PartitionCount] = {}
    changes: dict[str, tuple[int, int]] = {}
    for name, t in current.topics.items():
        old = counts.get(name)
        if t.error is not None:
            if old is not None:
                out[name] = old
            continue
        n = t.partition_count
        if old is None:
            out[name] = PartitionCount(n)
        elif n < old.count and old.lower_seen + 1 < DECREASE_CONFIRMATIONS:
            out[name] = dataclasses.replace(old, lower_seen=old.lower_seen + 1)
        elif old.count != n:
            out[name] = PartitionCount(n, changed_at_ms=now, previous=old.count)
            changes[name] = (old.count, n)
        else:
            out[name] = dataclasses.replace(old, lower_seen=0) if old.lower_seen else old
    return out, changes
