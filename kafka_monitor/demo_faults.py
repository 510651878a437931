"""The real-cluster demo's faults (``kafka-monitor demo --real-cluster``): :class:`FaultCycle`
pauses a follower, stops a broker, then stops two, one after the other, says which alerts to
expect and waits for the recovery.  The demo's cluster runner (``kafka_monitor.demo_cluster``)
runs it."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)

#: a fault starts this often (from the start of one to the start of the next; a fault whose
#: recovery takes longer delays the next one, which then starts MIN_GAP_S after the recovery)
FAULT_EVERY_S = 120.0
#: how long each fault lasts before it is undone
PAUSE_S = 25.0        # fault 1: a follower paused (SIGSTOP)
ONE_DOWN_S = 45.0     # fault 2: a broker stopped (controlled shutdown)
TWO_DOWN_S = 30.0     # fault 3: two brokers stopped
MIN_GAP_S = 15.0


def _say(msg: str) -> None:
    print(f"[demo] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def _brokers(ids) -> str:
    ids = sorted(ids)
    return f"broker {ids[0]}" if len(ids) == 1 else "brokers " + ", ".join(map(str, ids[:-1])) + f" and {ids[-1]}"


class FaultCycle:
    """The real-cluster demo's faults on ``topic`` of a ``kafka_monitor.local.kafka_cluster.KafkaCluster``,
    one after the other: ``pause_follower``, ``stop_leader``, ``stop_two``.

    Each fault says what it does and which alerts to expect, holds for its duration (and, at
    most ``effect_timeout_s`` longer, until the cluster's own metadata shows its effect), undoes
    itself, waits until the ISR of every partition is whole again, moves leaders back to their
    preferred replicas (ElectLeaders PREFERRED) and says it recovered.  While it holds, changes
    of the topic's leaders and ISRs are printed as the cluster reports them, and recorded in
    ``history`` as ``(fault, seconds since it started, {partition: (leader, replicas, isr)})``.

    ``stop`` (Ctrl-C, --duration) ends a fault early: a paused broker is resumed at once; a
    stopped one stays stopped (the cluster is about to be stopped) and is listed in
    ``self.stopped``: ``restore()`` starts it again.  Brokers started again here die with the
    thread that starts them (kafka_monitor.local.kafka_cluster's parent-death signal is per
    thread): run the faults in the thread that owns the cluster (the demo's cluster runner runs
    them in its main thread, the test in pytest's).
    """

    def __init__(self, cluster, topic: str, stop: threading.Event, *, pause_s: float = PAUSE_S,
                 one_down_s: float = ONE_DOWN_S, two_down_s: float = TWO_DOWN_S, effect_timeout_s: float = 30.0,
                 recover_timeout_s: float = 180.0, fenced_after_s: Optional[float] = None,
                 say: Callable[[str], None] = _say):
        self.fenced_after_s = fenced_after_s
        self.cluster, self.topic, self.stop = cluster, topic, stop
        self.pause_s, self.one_down_s, self.two_down_s = pause_s, one_down_s, two_down_s
        self.effect_timeout_s, self.recover_timeout_s = effect_timeout_s, recover_timeout_s
        self.say = say
        self.paused: set = set()
        self.stopped: set = set()
        self.history: list = []
        self.faults = (self.pause_follower, self.stop_leader, self.stop_two)

    # -- the faults

    def pause_follower(self) -> Optional[int]:
        """Fault 1: SIGSTOP a broker that follows (and leads none of) the topic's partitions."""
        parts = self._partitions()
        leaders = {leader for leader, _, _ in parts.values()}
        cands = sorted({b for _, reps, _ in parts.values() for b in reps} - leaders) or \
            sorted({b for _, reps, _ in parts.values() for b in reps})
        b = cands[-1]
        mine = sorted(p for p, (_, reps, _) in parts.items() if b in reps)
        self.say(f"fault 1/3: pausing broker {b} (SIGSTOP; a follower of {self._parts(mine)}) for {self.pause_s:g} s: "
                 f"expect IsrShrink, UnderReplicated and AtMinIsr on {self._parts(mine)} (writes keep flowing; it "
                 f"leaves the ISR once it lags"
                 + (f"; fenced after {self.fenced_after_s:g} s without heartbeats" if self.fenced_after_s else "")
                 + "), resolving after it resumes")
        t0 = time.monotonic()
        self.cluster.pause_broker(b)
        self.paused.add(b)
        try:
            self._hold("pause", t0, self.pause_s,
                       lambda ps: all(b not in isr for p, (_, _, isr) in ps.items() if p in mine))
        finally:
            self.cluster.resume_broker(b)
            self.paused.discard(b)
        if self.stop.is_set():
            self.say(f"stopping: resumed broker {b} (SIGCONT)")
            return b
        self.say(f"resumed broker {b} (SIGCONT); waiting until it is back in the ISR...")
        self._recover("pause", t0, time.monotonic())
        return b

    def stop_leader(self) -> Optional[int]:
        """Fault 2: stop (controlled shutdown) the broker leading the most partitions, start it
        again, then a preferred leader election moves the leaders back to it."""
        parts = self._partitions()
        led: dict = {}
        for p, (leader, _, _) in sorted(parts.items()):
            led.setdefault(leader, []).append(p)
        b = max(sorted(led), key=lambda x: len(led[x]))
        self.say(f"fault 2/3: stopping broker {b} (controlled shutdown; leader of {self._parts(led[b])}) for "
                 f"{self.one_down_s:g} s: expect LeaderChanged (its leaderships move), IsrShrink, UnderReplicated "
                 f"and AtMinIsr on {self.topic}; after it is back in the ISR, a preferred leader election moves the "
                 f"leaders back (LeaderChanged again; PreferredLeaderImbalance would open only after 5 minutes "
                 f"off the preferred leader)")
        t0 = time.monotonic()
        self._stop_brokers([b])
        self._hold("stop-1", t0, self.one_down_s,
                   lambda ps: all(b not in isr and leader != b for leader, _, isr in ps.values()))
        if self.stop.is_set():
            self.say(f"stopping: broker {b} stays stopped, the cluster is stopped")
            return b
        t_undo = time.monotonic()
        self._start_brokers([b])
        self._recover("stop-1", t0, t_undo)
        return b

    def stop_two(self) -> Optional[list]:
        """Fault 3: stop two brokers, keeping the first partition's preferred leader: every
        partition is down to one in-sync replica, under min.insync.replicas.  The faults before
        end with the leaders back on their preferred replicas, so it leads that partition; its
        leader as just read could be a broker's metadata a moment behind that election (seen in a
        full run: brokers 1 and 3 stopped, where the test expects 2 and 3)."""
        parts = self._partitions()
        keep = parts[min(parts)][1][0]
        down = sorted({b for _, reps, _ in parts.values() for b in reps} - {keep})[:2]
        self.say(f"fault 3/3: stopping {_brokers(down)} for {self.two_down_s:g} s: the ISR of {self.topic} drops "
                 f"to [{keep}], below min.insync.replicas: expect UnderMinIsr (critical; acks=all writes fail and "
                 f"the producer retries), IsrShrink, UnderReplicated and LeaderChanged, resolving after both return")
        t0 = time.monotonic()
        self._stop_brokers(down)
        self._hold("stop-2", t0, self.two_down_s,
                   lambda ps: all(not set(down) & set(isr) for _, _, isr in ps.values()))
        if self.stop.is_set():
            self.say(f"stopping: {_brokers(down)} stay stopped, the cluster is stopped")
            return down
        t_undo = time.monotonic()
        self._start_brokers(down)
        self._recover("stop-2", t0, t_undo)
        return down

    # -- the loop

    def run(self, every_s: float = FAULT_EVERY_S, first_after_s: float = 30.0,
            ready: Optional[threading.Event] = None, max_faults: Optional[int] = None,
            min_gap_s: float = MIN_GAP_S) -> None:
        """Inject the faults in turn until ``stop`` (or ``max_faults``): the first
        ``first_after_s`` after ``ready`` is set, the next ones ``every_s`` apart (at least
        ``min_gap_s`` after the previous recovery)."""
        try:
            while ready is not None and not ready.is_set():
                if self.stop.wait(0.5):
                    return
            next_at = time.monotonic() + first_after_s
            if first_after_s > 0:
                self.say(f"first fault in {first_after_s:g} s (a healthy baseline first)")
            n = 0
            while not self.stop.wait(max(0.0, next_at - time.monotonic())):
                if max_faults is not None and n >= max_faults:
                    return
                t0 = time.monotonic()
                fault = self.faults[n % len(self.faults)]
                n += 1
                try:
                    fault()
                except Exception as e:  # one failed fault must not end the demo: undo it, go on
                    if self.stop.is_set():
                        return
                    self.say(f"fault {fault.__name__} failed: {e}; restoring the cluster")
                    try:
                        self.restore()
                    except Exception as e2:
                        self.say(f"could not restore the cluster ({e2}); no more faults")
                        return
                if self.stop.is_set() or (max_faults is not None and n >= max_faults):
                    return
                next_at = max(t0 + every_s, time.monotonic() + min_gap_s)
                self.say(f"next fault in {max(0.0, next_at - time.monotonic()):.0f} s")
        finally:
            self.undo_pauses()

    def undo_pauses(self) -> None:
        for b in sorted(self.paused):
            try:
                self.cluster.resume_broker(b)
            except Exception as e:  # already stopped with the cluster
                log.debug("resume broker %s: %s", b, e)
            self.paused.discard(b)

    def restore(self) -> None:
        """Undo every fault: resume paused brokers, start stopped ones, wait until the ISR is whole."""
        self.undo_pauses()
        for b in sorted(self.stopped):
            self.cluster.start_broker(b)
            self.stopped.discard(b)
        self._wait(self._isr_whole, self.recover_timeout_s, f"the ISR of {self.topic} whole", stoppable=False)

    # -- internals

    def _parts(self, ps) -> str:
        return f"{self.topic} " + ",".join(map(str, sorted(ps)))

    def _partitions(self) -> dict:
        return self._wait(lambda: self._try_partitions(), 30, f"metadata of {self.topic}", stoppable=False)

    def _try_partitions(self) -> Optional[dict]:
        try:
            return self.cluster.partitions(self.topic, timeout=2.0) or None
        except Exception:
            return None

    def _stop_brokers(self, ids) -> None:
        for b in ids:
            self.stopped.add(b)
            self.cluster.stop_broker(b)

    def _start_brokers(self, ids) -> None:
        self.say(f"starting {_brokers(ids)} again...")
        for b in ids:
            self.cluster.start_broker(b)
            self.stopped.discard(b)

    def _hold(self, fault: str, t0: float, seconds: float, effect: Callable[[dict], bool]) -> None:
        """Keep the fault on for ``seconds`` and until ``effect`` holds on the topic's metadata
        (at most ``effect_timeout_s`` longer), printing the leader/ISR changes meanwhile."""
        last, seen = None, False
        end = t0 + seconds
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= end and (seen or now >= end + self.effect_timeout_s):
                if not seen:
                    self.say(f"(the cluster did not show the fault's full effect within {now - t0:.0f} s)")
                return
            parts = self._try_partitions()
            if parts is not None:
                self.history.append((fault, now - t0, parts))
                view = self._view(parts)
                if view != last:
                    self.say(f"  +{now - t0:4.1f}s {view}")
                    last = view
                seen = seen or effect(parts)
            self.stop.wait(1.0)

    def _recover(self, fault: str, t0: float, t_undo: float) -> None:
        # the metadata that showed the recovery is recorded, not a later read: brokers apply the
        # controller's changes at their own pace, and a later read may come from one still behind
        parts = self._wait(self._isr_whole, self.recover_timeout_s, f"the ISR of {self.topic} whole")
        if not parts or self.stop.is_set():
            return
        self.history.append((fault, time.monotonic() - t0, parts))
        off = sorted((self.topic, p) for p, (leader, reps, _) in parts.items() if leader != reps[0])
        msg = f"ISR whole again {time.monotonic() - t_undo:.0f} s after the fault was undone"
        if off:
            self.say(f"{msg}; preferred leader election for {self._parts(p for _, p in off)}...")
            self.cluster.elect_leaders("preferred", off)
            parts = self._wait(self._preferred, self.recover_timeout_s, f"preferred leaders of {self.topic}")
            if not parts:  # stopped
                return
            self.history.append((fault, time.monotonic() - t0, parts))
            msg = f"leaders back on their preferred replicas {time.monotonic() - t_undo:.0f} s after the fault was undone"
        self.say(f"recovered ({time.monotonic() - t0:.0f} s after the fault began): {msg}: {self._view(parts)}; "
                 "the alerts resolve within a few observations (LeaderChanged after 5 quiet minutes)")

    def _preferred(self) -> Optional[dict]:
        """The topic's partitions when every leader is its preferred replica, else None."""
        parts = self._try_partitions()
        return parts if parts and all(leader == reps[0] for leader, reps, _ in parts.values()) else None

    def _isr_whole(self) -> Optional[dict]:
        """The topic's partitions when every ISR is whole and every partition led, else None."""
        parts = self._try_partitions()
        return parts if parts and all(set(isr) == set(reps) and leader >= 0
                                      for leader, reps, isr in parts.values()) else None

    def _view(self, parts: dict) -> str:
        return f"{self.topic}: " + " | ".join(f"p{p} leader {leader} isr {sorted(isr)}"
                                              for p, (leader, _, isr) in sorted(parts.items()))

    def _wait(self, cond, timeout: float, what: str, stoppable: bool = True):
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v or (stoppable and self.stop.is_set()):
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.5)

