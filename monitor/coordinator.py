"""The probe's group-coordinator requests -- committed offsets (ListConsumerGroupOffsets) and
group descriptions (DescribeConsumerGroups) -- asked through an admin client in a child process.

librdkafka 2.16 kills the process whose admin client meets a coordinator going away: a NULL read
(SIGSEGV) when ListConsumerGroupOffsets is answered NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE,
an assertion (SIGABRT, ``eonce->refcnt > 0``) when a coordinator request's connection drops.  A
coordinator's broker stopping does both (docs/settings.md, "The coordinator's requests and
librdkafka's crashes").  In a child, a crash costs the child: it is started again and the groups asked once
more."""

from __future__ import annotations

import concurrent.futures
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

from monitor.access import timed_out
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


def _send_committed(admin: Any, requests: Requests, timeout_s: float) -> dict[str, Any]:
    """One ListConsumerGroupOffsets per group (the admin API takes one group per call), all sent
    before any is waited for: group -> its future, or the error that refused it."""
    out: dict[str, Any] = {}
    for gid, tps in requests.items():
        req = ConsumerGroupTopicPartitions(gid, [TopicPartition(t, p) for t, p in tps] if tps is not None else None)
        try:
            out[gid] = admin.list_consumer_group_offsets([req], request_timeout=timeout_s)[gid]
        except Exception as e:
            out[gid] = _plain(e)
    return out


def _send_described(admin: Any, groups: list[str], timeout_s: float) -> dict[str, Any]:
    """Every group in one DescribeConsumerGroups call: group -> its future, or the error."""
    try:
        return dict(admin.describe_consumer_groups(groups, request_timeout=timeout_s))
    except Exception as e:
        return dict.fromkeys(groups, _plain(e))


def _committed_answer(res: Any, names: dict[str, str]) -> Raw:
    return [(names.setdefault(tp.topic, tp.topic), tp.partition, tp.offset, tp.error) for tp in res.topic_partitions]


_SEND: dict[str, Callable[[Any, Any, float], dict[str, Any]]] = {"committed": _send_committed,
                                                                  "described": _send_described}


class Asker:
    """The requests of one admin client (the child's), each group's waited for until a deadline.

    A group whose coordinator does not answer by the deadline is answered ``_TIMED_OUT`` and its
    request left running (librdkafka ends it by its request timeout); until it ends, that group
    is not asked again (answered "still waiting"), so a paused coordinator never holds more than
    one request per group and kind, and never holds up the other groups' answers."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin
        #: (kind, group) -> (the request's future, when it was sent, monotonic s)
        self.pending: dict[tuple[str, str], tuple[Any, float]] = {}

    def ask(self, asks: dict[str, Any], timeout_s: float, wait_s: float) -> dict[str, dict[str, Raw]]:
        """``asks``: kind ("committed" / "described") -> what to ask; answers per kind and group,
        within ``wait_s`` seconds."""
        now = time.monotonic()
        deadline = now + wait_s
        sent: dict[str, dict[str, Any]] = {}
        out: dict[str, dict[str, Raw]] = {}
        for kind, what in asks.items():
            groups = list(what)
            answers = out[kind] = {}
            fresh = []
            for gid in groups:
                held = self.pending.get((kind, gid))
                if held is not None and not held[0].done():
                    answers[gid] = KafkaError(KafkaError._TIMED_OUT, f"{kind}: its coordinator has not answered the "
                                              f"request sent {now - held[1]:.0f}s ago (asked again once it does)")
                    continue
                self.pending.pop((kind, gid), None)
                fresh.append(gid)
            if fresh:
                chosen = {g: what[g] for g in fresh} if isinstance(what, dict) else fresh
                sent[kind] = _SEND[kind](self.admin, chosen, timeout_s)
        names: dict[str, str] = {}  # one string per topic name, pickled once
        for kind, futures in sent.items():
            answers = out[kind]
            for gid, fut in futures.items():
                if not hasattr(fut, "result"):
                    answers[gid] = fut  # refused when sent
                    continue
                try:
                    res = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    self.pending[(kind, gid)] = (fut, now)
                    answers[gid] = KafkaError(KafkaError._TIMED_OUT, f"{kind}: no answer from its coordinator "
                                              f"within {wait_s:.1f}s")
                    continue
                except Exception as e:
                    answers[gid] = _plain(e)
                    continue
                answers[gid] = _committed_answer(res, names) if kind == "committed" else group_state_from(gid, res)
        return out


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
    asker = Asker(AdminClient(_recv(0)))
    while True:
        try:
            asks, timeout_s, wait_s = _recv(0)
        except EOFError:
            return
        _send(out, asker.ask(asks, timeout_s, wait_s))


#: how much longer than a request's wait the probe waits for the child's answer (the child's
#: start, the pickling)
CHILD_MARGIN_S = 10.0
#: a child whose coordinator requests time out for this many request timeouts in a row is replaced
STUCK_AFTER_TIMEOUTS = 3


class CoordinatorClient:
    """The probe's coordinator requests through an admin client in a child process, started on
    first use and again after it dies; with ``admin`` (tests' fakes), through that client here."""

    def __init__(self, conf: Optional[dict[str, Any]], request_timeout_s: float, *, admin: Any = None) -> None:
        if admin is None and conf is None:
            raise ValueError("CoordinatorClient needs a client configuration or an admin client")
        # the child's client: no callbacks (they would run in the child)
        self._conf = {k: v for k, v in (conf or {}).items() if not callable(v)}
        self._timeout_s = request_timeout_s
        self._proc: Optional[subprocess.Popen] = None
        self._local = Asker(admin) if admin is not None else None
        #: the last send(): (what was asked, wait_s, its deadline), until collect()
        self._sent: Optional[tuple[dict[str, Any], float, float]] = None
        self._written = False  # whether the child has the last send()'s request
        #: since when every collect() has had a timed-out group (monotonic s), and children
        #: replaced for it
        self._timing_out_since: Optional[float] = None
        self.replaced = 0
        #: how many times the child died while asking (each is logged)
        self.deaths = 0

    def committed(self, requests: Requests) -> dict[str, Answer]:
        """group -> its partitions' committed offsets, or the exception that answered it."""
        return self.ask({"committed": requests}, self._timeout_s)["committed"]

    def described(self, groups: list[str]) -> dict[str, Union[GroupState, Exception]]:
        """group -> its state, members and coordinator, or the exception that answered it."""
        return self.ask({"described": groups}, self._timeout_s)["described"]

    def ask(self, asks: dict[str, Any], wait_s: float) -> dict[str, dict[str, Any]]:
        """``send`` then ``collect``."""
        self.send(asks, wait_s)
        return self.collect()

    def send(self, asks: dict[str, Any], wait_s: float) -> None:
        """Ask, without waiting: ``asks`` maps a kind ("committed": ``Requests``, "described": a
        list of groups) to its groups; each group's answer is waited for at most ``wait_s``
        seconds (``collect``).  The probe sends these first and then its ListOffsets, so that
        both wait at once."""
        asks = {k: v for k, v in asks.items() if v}
        self._sent = (asks, wait_s, time.monotonic() + wait_s)
        if asks and self._local is None:
            try:
                self._write(asks, wait_s)
            except (BrokenPipeError, OSError):
                self._written = False  # the child is gone: collect() starts another

    def collect(self) -> dict[str, dict[str, Any]]:
        """The answers to the last ``send``: kind -> group -> its answer or the exception that
        answered it."""
        if self._sent is None:
            raise RuntimeError("collect() without send()")
        (asks, wait_s, deadline), self._sent = self._sent, None
        raw: Optional[dict[str, dict[str, Raw]]] = None
        if not asks:
            raw = {}
        elif self._local is not None:
            raw = self._local.ask(asks, self._timeout_s, wait_s)
        else:
            for attempt in (1, 2):
                try:
                    if not self._written:
                        self._write(asks, max(1.0, deadline - time.monotonic()))
                    proc = self._proc
                    assert proc is not None and proc.stdout is not None
                    # the child answers by its deadline; the margin covers its start and the pickling
                    raw = _recv(proc.stdout.fileno(), max(deadline, time.monotonic()) + CHILD_MARGIN_S)
                    break
                except (EOFError, BrokenPipeError, OSError):
                    self.deaths += 1
                    self._written = False
                    log.warning("the child process asking group coordinators died (%s; %d so far): librdkafka 2.16 "
                                "crashes when a coordinator goes away mid-request, as when its broker stops; %s",
                                self._reap(5), self.deaths,
                                "asking again from a new one" if attempt == 1 else "those groups wait for the next cycle")
                except TimeoutError:
                    self._reap(0)
                    self._written = False
                    return _failed(asks, KafkaError._TIMED_OUT, "no answer from the child process asking coordinators")
            if raw is None:
                return _failed(asks, KafkaError._TRANSPORT, "the child process asking coordinators died twice")
        self._written = False
        out = {kind: {g: _exception(a) for g, a in answers.items()} for kind, answers in raw.items()}
        for kind in ("committed", "described"):
            out.setdefault(kind, {})
        self._check_stuck(out)
        return out

    def _check_stuck(self, out: dict[str, dict[str, Any]]) -> None:
        """A child whose coordinator requests have timed out for ``STUCK_AFTER_TIMEOUTS`` request
        timeouts in a row is replaced.  Seen on the real cluster: after a coordinator's broker was
        paused and resumed, the child's client went on timing out every request for that group
        (for minutes, while the broker answered every other client); a new client asks
        FindCoordinator afresh and is answered at once."""
        now = time.monotonic()
        if not any(timed_out(a) for answers in out.values() for a in answers.values()):
            self._timing_out_since = None
            return
        if self._timing_out_since is None:
            self._timing_out_since = now
        elif self._proc is not None and now - self._timing_out_since > STUCK_AFTER_TIMEOUTS * self._timeout_s:
            self.replaced += 1
            log.warning("coordinator requests unanswered for %.0fs: replacing the child process that asks them "
                        "(%d so far; librdkafka 2.16 can keep timing out a coordinator that answers other clients)",
                        now - self._timing_out_since, self.replaced)
            self._reap(0)
            self._timing_out_since = None

    def _write(self, asks: dict[str, Any], wait_s: float) -> None:
        proc = self._child()
        assert proc.stdin is not None
        _send(proc.stdin, (asks, self._timeout_s, wait_s))
        self._written = True

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


def _failed(asks: dict[str, Any], code: int, why: str) -> dict[str, dict[str, Any]]:
    """Every group asked answered by one error."""
    return {kind: dict.fromkeys(what, KafkaException(KafkaError(code, f"{kind}: {why}"))) for kind, what in asks.items()}


def _exception(a: Raw) -> Union[list[Committed], GroupState, Exception]:
    if isinstance(a, KafkaError):
        return KafkaException(a)
    if isinstance(a, str):
        return RuntimeError(a)
    return a


if __name__ == "__main__":
    _child()
