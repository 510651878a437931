"""The probe's group-coordinator requests -- committed offsets (ListConsumerGroupOffsets) and
group descriptions (DescribeConsumerGroups) -- asked through an admin client in a child process.

librdkafka 2.16 kills the process whose admin client meets a coordinator going away: a NULL read
(SIGSEGV) when ListConsumerGroupOffsets is answered NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE,
an assertion (SIGABRT, ``eonce->refcnt > 0``) when a coordinator request's connection drops.  A
coordinator's broker stopping does both (README, "The coordinator's requests and librdkafka's
crashes").  In a child, a crash costs the child: it is started again and the groups asked once
more."""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from typing import IO, Any, Callable, Optional, Union

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from monitor.contract import GroupMember, GroupState

log = logging.getLogger(__name__)

#: (topic, partition, committed offset, error or None) of one group's partition
Committed = tuple[str, int, int, Optional[KafkaError]]
#: group -> the partitions to ask for (None: all the group has committed offsets for)
Requests = dict[str, Optional[list[tuple[str, int]]]]
Answer = Union[list[Committed], Exception]
Raw = Union[list[Committed], GroupState, KafkaError, str]


#: ConsumerGroupState names as the brokers' protocol spells them
_GROUP_STATES = {"EMPTY": "Empty", "PREPARING_REBALANCING": "PreparingRebalance", "PREPARING_REBALANCE": "PreparingRebalance",
                 "COMPLETING_REBALANCING": "CompletingRebalance", "COMPLETING_REBALANCE": "CompletingRebalance",
                 "STABLE": "Stable", "DEAD": "Dead", "UNKNOWN": "Unknown"}


def group_state_name(state: Any) -> str:
    """confluent-kafka's ConsumerGroupState enum -> the name Kafka uses (Stable, Empty, ...)."""
    name = getattr(state, "name", str(state)).upper()
    return _GROUP_STATES.get(name, name.title())


def group_protocol(d: Any) -> str:
    """classic, consumer (KIP-848) or simple, from a ConsumerGroupDescription."""
    if d.is_simple_consumer_group:
        return "simple"
    return "consumer" if getattr(getattr(d, "type", None), "name", "") == "CONSUMER" else "classic"


def describe_group_state(d: Any) -> str:
    """The group's state as Kafka names it.  librdkafka has no names for the consumer protocol's
    Assigning and Reconciling and reports both as UNKNOWN; a consumer-protocol group reported so
    is Reconciling when a member's assignment differs from its target, else Assigning (the new
    target assignment is being computed)."""
    name = group_state_name(d.state)
    if name != "Unknown" or group_protocol(d) != "consumer":
        return name

    def parts(a: Any) -> set:
        return {(tp.topic, tp.partition) for tp in (a.topic_partitions if a else [])}

    reconciling = any(parts(m.assignment) != parts(getattr(m, "target_assignment", None))
                      for m in d.members if getattr(m, "target_assignment", None) is not None)
    return "Reconciling" if reconciling else "Assigning"


def group_state_from(gid: str, d: Any) -> GroupState:
    """A ``group_state`` event's data from a ConsumerGroupDescription."""
    members = [GroupMember(member_id=m.member_id, client_id=m.client_id, host=m.host,
                           assignment=[f"{tp.topic}/{tp.partition}" for tp in
                                       (m.assignment.topic_partitions if m.assignment else [])])
               for m in d.members]
    return GroupState(group=gid, state=describe_group_state(d), protocol=group_protocol(d),
                      assignor=d.partition_assignor or None,
                      coordinator=d.coordinator.id if d.coordinator is not None else None, members=members)


def ask_committed(admin: Any, requests: Requests, timeout_s: float) -> dict[str, Raw]:
    """One request per group (the admin API takes one group per call), all sent before any is
    waited for: a coordinator that does not answer costs one request timeout, not one per group.
    The answer is plain data, so that it crosses a process boundary."""
    out: dict[str, Raw] = {}
    asked = {}
    for gid, tps in requests.items():
        req = ConsumerGroupTopicPartitions(gid, [TopicPartition(t, p) for t, p in tps] if tps is not None else None)
        try:
            asked[gid] = admin.list_consumer_group_offsets([req], request_timeout=timeout_s)[gid]
        except Exception as e:
            out[gid] = _plain(e)
    names: dict[str, str] = {}  # one string per topic name, pickled once
    for gid, fut in asked.items():
        try:
            res = fut.result()
        except Exception as e:
            out[gid] = _plain(e)
            continue
        out[gid] = [(names.setdefault(tp.topic, tp.topic), tp.partition, tp.offset, tp.error)
                    for tp in res.topic_partitions]
    return out


def ask_described(admin: Any, groups: list[str], timeout_s: float) -> dict[str, Raw]:
    """Every group in one DescribeConsumerGroups call; each answered by its state or its error."""
    out: dict[str, Raw] = {}
    try:
        futs = admin.describe_consumer_groups(groups, request_timeout=timeout_s)
    except Exception as e:
        return dict.fromkeys(groups, _plain(e))
    for gid, fut in futs.items():
        try:
            out[gid] = group_state_from(gid, fut.result())
        except Exception as e:
            out[gid] = _plain(e)
    return out


_ASK: dict[str, Callable[[Any, Any, float], dict[str, Raw]]] = {"committed": ask_committed, "described": ask_described}


def _plain(e: Exception) -> Union[KafkaError, str]:
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0]
    return f"{type(e).__name__}: {e}"


def _send(f: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack(">Q", len(data)) + data)
    f.flush()


def _read(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = None if deadline == float("inf") else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([fd], [], [], left)[0]):
            raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(fd: int, deadline: float = float("inf")) -> Any:
    (n,) = struct.unpack(">Q", _read(fd, 8, deadline))
    return pickle.loads(_read(fd, n, deadline))


def _child() -> None:
    """The child: a configuration, then requests, answered until its stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the probe, which ends this child
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the answers
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(_recv(0))
    while True:
        try:
            kind, what, timeout_s = _recv(0)
        except EOFError:
            return
        _send(out, _ASK[kind](admin, what, timeout_s))


class CoordinatorClient:
    """The probe's coordinator requests through an admin client in a child process, started on
    first use and again after it dies; with ``admin`` (tests' fakes), through that client here."""

    def __init__(self, conf: Optional[dict[str, Any]], request_timeout_s: float, *, admin: Any = None) -> None:
        if admin is None and conf is None:
            raise ValueError("CoordinatorClient needs a client configuration or an admin client")
        # the child's client: no callbacks (they would run in the child)
        self._conf = {k: v for k, v in (conf or {}).items() if not callable(v)}
        self._timeout_s = request_timeout_s
        self._admin = admin
        self._proc: Optional[subprocess.Popen] = None
        #: how many times the child died while asking (each is logged)
        self.deaths = 0

    def committed(self, requests: Requests) -> dict[str, Answer]:
        """group -> its partitions' committed offsets, or the exception that answered it."""
        return self._ask("committed", requests, list(requests))

    def described(self, groups: list[str]) -> dict[str, Union[GroupState, Exception]]:
        """group -> its state, members and coordinator, or the exception that answered it."""
        return self._ask("described", groups, groups)

    def _ask(self, kind: str, what: Any, groups: list[str]) -> dict[str, Any]:
        if not groups:
            return {}
        if self._admin is not None:
            return {g: _exception(a) for g, a in _ASK[kind](self._admin, what, self._timeout_s).items()}
        for attempt in (1, 2):
            try:
                proc = self._child()
                assert proc.stdin is not None and proc.stdout is not None
                _send(proc.stdin, (kind, what, self._timeout_s))
                raw = _recv(proc.stdout.fileno(), time.monotonic() + self._timeout_s * 2 + 30)
                return {g: _exception(a) for g, a in raw.items()}
            except (EOFError, BrokenPipeError):
                self.deaths += 1
                log.warning("the child process asking group coordinators (%s) died (%s; %d so far): librdkafka 2.16 "
                            "crashes when a coordinator goes away mid-request, as when its broker stops; %s",
                            kind, self._reap(5), self.deaths,
                            "asking again from a new one" if attempt == 1 else "those groups wait for the next cycle")
            except TimeoutError:
                self._reap(0)
                err = KafkaError(KafkaError._TIMED_OUT, f"{kind}: no answer from the child process asking coordinators")
                return dict.fromkeys(groups, KafkaException(err))
        err = KafkaError(KafkaError._TRANSPORT, f"{kind}: the child process asking coordinators died twice")
        return dict.fromkeys(groups, KafkaException(err))

    def _child(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `monitor` is
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen([sys.executable, "-m", "monitor.coordinator"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdin is not None
        _send(self._proc.stdin, self._conf)
        return self._proc

    def _reap(self, wait_s: float) -> str:
        """End the child: its input closed, then killed if it has not exited within ``wait_s``;
        how it ended, e.g. "signal 11"."""
        proc, self._proc = self._proc, None
        if proc is None:
            return "not started"
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()  # the child ends when its input does
            except OSError:
                pass
        try:
            code = proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        return f"signal {-code}" if code < 0 else f"exit code {code}"

    def close(self) -> None:
        self._reap(self._timeout_s + 5)


def _exception(a: Raw) -> Union[list[Committed], GroupState, Exception]:
    if isinstance(a, KafkaError):
        return KafkaException(a)
    if isinstance(a, str):
        return RuntimeError(a)
    return a


if __name__ == "__main__":
    _child()
