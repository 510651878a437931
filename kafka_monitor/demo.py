"""The embedded default: everything on one machine, no Docker.

A Tansu broker on a free loopback port, the topics, a small workload, the probe, and the
Spark job in local mode with the exporter on 127.0.0.1.  Ctrl-C (or SIGTERM) stops it all:
query, Spark, probe, workload, broker — nothing is left running.

With ``real_cluster`` (``kafka-monitor demo --real-cluster``) the workload runs on a real
Apache Kafka cluster (kafka_monitor.local.kafka_cluster: a KRaft controller and 3 brokers on
loopback), the probe (its own process) watches that cluster, and ``FaultCycle`` injects a fault every
``fault_every_s``: a paused follower, a stopped broker (then a preferred leader election), two
stopped brokers.  The cluster and its faults run in a process of their own (the cluster runner,
below); the monitor's events and alerts topics stay on Tansu.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Callable, Optional

from kafka_monitor.local import workload
from kafka_monitor.local.broker import TansuBroker, create_topics

log = logging.getLogger(__name__)

#: how the demo runs the probe and the job (tests/e2e/test_quiet_when_healthy.py runs the same)
PROBE_INTERVAL_S = 2.0
TRIGGER_S = 2.0
#: the alerts the demo's workload raises on purpose -> why; any other alert is unexpected
#: (tests/e2e/test_quiet_when_healthy.py allows exactly these)
ON_PURPOSE: dict[str, str] = {}  # the consumer's pauses (8 s every 30 s) are OK by the lag rules

# -- the real-cluster demo (--real-cluster) ------------------------------------------------------

#: a fault starts this often (from the start of one to the start of the next; a fault whose
#: recovery takes longer delays the next one, which then starts MIN_GAP_S after the recovery)
FAULT_EVERY_S = 120.0
#: how long each fault lasts before it is undone
PAUSE_S = 25.0        # fault 1: a follower paused (SIGSTOP)
ONE_DOWN_S = 45.0     # fault 2: a broker stopped (controlled shutdown)
TWO_DOWN_S = 30.0     # fault 3: two brokers stopped
MIN_GAP_S = 15.0
#: min.insync.replicas of the workload topic (replication factor 3): one broker away is
#: AtMinIsr, two are UnderMinIsr
REAL_MIN_ISR = 2
#: the workload topic's replica lists on brokers 1, 2, 3: the first replica is the preferred
#: leader; broker 3 leads nothing, so pausing it is a follower's fault only
REAL_ASSIGNMENT = [[1, 2, 3], [2, 1, 3], [1, 2, 3]]
#: the alerts the real-cluster demo's faults raise on purpose -> when; the plain demo's
#: ON_PURPOSE above does not apply (its consumer does not pause here)
REAL_CLUSTER_ON_PURPOSE = {
    "IsrShrink": ("every fault: the paused or stopped broker(s) leave the ISR of the demo.orders partitions "
                  "they replicate; resolved when they are back in it"),
    "UnderReplicated": "with every IsrShrink (ISR smaller than the replicas); resolved with it",
    "AtMinIsr": (f"faults 1 and 2 (one broker away): ISR 2 = min.insync.replicas {REAL_MIN_ISR}; resolved when "
                 "the broker is back in the ISR"),
    "UnderMinIsr": ("fault 3 (two brokers stopped, critical): ISR 1 < min.insync.replicas, acks=all writes fail "
                    "and the producer retries; resolved when they are back in the ISR"),
    "LeaderChanged": ("info, faults 2 and 3: leaders move off the stopped broker(s), and the preferred leader "
                      "election after the recovery moves them back; it resolves after 5 quiet minutes, so while "
                      "faults keep coming it mostly stays open"),
    "ConsumerLagStatus": (f"may open (WARN) on partitions of {workload.GROUP} for some seconds around a fault: its "
                          "fetches or its group coordinator wait on a paused or stopped broker, so its lag rises; "
                          "resolved when it has caught up"),
}


def _wait_first_metric(url: str, stop: threading.Event, t_start: float,
                       ready: Optional[threading.Event] = None) -> None:
    """Tell the person when the first partition metric is on /metrics."""
    while not stop.is_set():
        try:
            body = urllib.request.urlopen(url, timeout=2).read().decode()
            if "kafka_monitor_partition_high_watermark{" in body and "kafka_monitor_group_partition_lag{" in body:
                print(f"[demo] first metrics after {time.monotonic() - t_start:.1f}s: partition HW, group lag, ISR "
                      f"are live on {url}", flush=True)
                if ready is not None:
                    ready.set()
                return
        except OSError:
            pass
        stop.wait(1.0)


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
        """Fault 3: stop two brokers, keeping the one that leads the first partition: every
        partition is down to one in-sync replica, under min.insync.replicas."""
        parts = self._partitions()
        keep = parts[min(parts)][0]
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


def run_demo(metrics_port: int = 9465, duration_s: float = 0, probe_interval_s: float = PROBE_INTERVAL_S,
             trigger_s: float = TRIGGER_S, real_cluster: bool = False, fault_every_s: float = FAULT_EVERY_S) -> int:
    """The demo; with ``real_cluster`` on a real Apache Kafka cluster with a fault every
    ``fault_every_s`` seconds (0: none).  Raises
    ``kafka_monitor.local.kafka_install.KafkaSetupError`` when Java or Maven is missing or Kafka
    cannot be fetched."""
    from monitor.probe import Probe
    from monitor.probe_config import ProbeConfig
    from streaming.job import JobConfig, run

    if real_cluster:
        _kafka_setup()  # before anything starts: a missing Java or Maven is reported at once

    t_start = time.monotonic()
    stop = threading.Event()

    def on_signal(signum, _frame):
        what = "query, Spark, probe, workload, Kafka cluster, broker" if real_cluster else \
            "query, Spark, probe, workload, broker"
        print(f"\n[demo] {signal.Signals(signum).name}: stopping ({what})...", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    workdir = tempfile.mkdtemp(prefix="kafka-monitor-demo-")
    broker = TansuBroker(log=open(f"{workdir}/tansu.log", "wb")).start()
    print(f"[demo] Tansu broker on {broker.bootstrap} (pid {broker.proc.pid if broker.proc else '?'})"
          + (" for the monitor's events and alerts topics" if real_cluster else ""), flush=True)
    threads: list[threading.Thread] = []
    probe = None
    timer = None
    runner = None
    ready = threading.Event()
    try:
        if real_cluster:
            # The monitor's own topics stay on Tansu, as in the plain demo: the faults take one or
            # two of the real cluster's brokers away, and an events topic there would lose writes
            # (or its leader) exactly when the probe reports the fault.  The probe watches the
            # real cluster and writes its events to Tansu (--events-bootstrap-servers).
            create_topics(broker.bootstrap, {"kafka-monitor.events": 3, "kafka-monitor.alerts": 1})
            runner, watched = _start_runner(workdir, fault_every_s, stop)
            if runner is None:
                return 0 if stop.is_set() else 1
            # a steady consumer (the faults are the show); no client logs of refused connections
            # to the brokers the faults stop
            produce_kw = {"conf": {"log_level": 0}}
            consume_kw = {"pause_s": 0.0, "conf": {"log_level": 0}}
        else:
            create_topics(broker.bootstrap, {"kafka-monitor.events": 3, "kafka-monitor.alerts": 1, workload.TOPIC: 3})
            watched = broker.bootstrap
            produce_kw, consume_kw = {}, {}
        for target, kw in ((workload.produce_loop, produce_kw), (workload.consume_loop, consume_kw)):
            t = threading.Thread(target=target, args=(watched, stop), kwargs=kw, name=target.__name__, daemon=True)
            t.start()
            threads.append(t)
        if real_cluster:
            # On the real cluster the probe runs as its own process, as deployed, and is started
            # again when it exits: librdkafka (2.16) can crash a client whose broker goes away
            # mid-request, and these faults take brokers away (its coordinator requests run in a
            # child of its own: monitor/coordinator.py).
            t = threading.Thread(target=_supervise_probe, name="probe", daemon=True, args=(
                ["--bootstrap-servers", watched, "--events-bootstrap-servers", broker.bootstrap,
                 "--interval", f"{probe_interval_s:g}", "--offsets-via", "list_offsets",
                 "--cluster", "local-kafka", "--source", "demo-probe",
                 "-X", "log_level=2"], stop))  # not librdkafka's logs of the brokers the faults take away
        else:
            probe = Probe(ProbeConfig(bootstrap_servers=broker.bootstrap, interval_s=probe_interval_s,
                                      offsets_via="fetch", cluster="local", source="demo-probe"))
            t = threading.Thread(target=probe.run, args=(stop,), name="probe", daemon=True)
        t.start()
        threads.append(t)
        print(f"[demo] workload: producer -> {workload.TOPIC}, consumer group {workload.GROUP}; "
              f"probe every {probe_interval_s:g}s; starting the Spark job (about 30 s to the first metrics)...", flush=True)
        if real_cluster:
            if fault_every_s > 0:
                print(f"[demo] faults, one every {fault_every_s:g} s from {min(30.0, fault_every_s):g} s after the "
                      f"first metrics, in turn: (1) a follower paused {PAUSE_S:g} s, (2) a broker stopped "
                      f"{ONE_DOWN_S:g} s, then a preferred leader election, (3) two brokers stopped {TWO_DOWN_S:g} s",
                      flush=True)
            print("[demo] alerts the faults raise on purpose (kafka_monitor_alert_active on /metrics and the "
                  "kafka-monitor.alerts topic; the shipped Prometheus rules wait 1-5 minutes before firing):",
                  flush=True)
            for name, why in REAL_CLUSTER_ON_PURPOSE.items():
                print(f"[demo]   {name}: {why}", flush=True)
        else:
            if ON_PURPOSE:
                print("[demo] alerts on purpose (anything else is unexpected):", flush=True)
            else:
                print(f"[demo] no alert is expected: {workload.GROUP} pauses {workload.PAUSE_S:g} s every "
                      f"{workload.PAUSE_EVERY_S:g} s and catches up, which the lag rules call OK; any alert "
                      "on /metrics is unexpected", flush=True)
            for name, why in ON_PURPOSE.items():
                print(f"[demo]   {name}: {why}", flush=True)
        if runner is not None:
            def tell_ready():  # the runner starts the fault schedule once metrics are live
                while not ready.wait(1.0):
                    if stop.is_set():
                        return
                with contextlib.suppress(OSError, ValueError):
                    runner.stdin.write(b"ready\n")
                    runner.stdin.flush()
            threading.Thread(target=tell_ready, name="tell-ready", daemon=True).start()
        if duration_s:
            timer = threading.Timer(duration_s, stop.set)
            timer.daemon = True
            timer.start()

        def on_started(port: int) -> None:
            url = f"http://127.0.0.1:{port}/metrics"
            print(f"[demo] Spark job running; metrics at {url}  (Ctrl-C stops everything)", flush=True)
            threading.Thread(target=_wait_first_metric, args=(url, stop, t_start, ready), daemon=True).start()

        run(JobConfig(bootstrap_servers=broker.bootstrap, checkpoint_dir=f"{workdir}/checkpoint",
                      trigger_s=trigger_s, metrics_port=metrics_port), stop_event=stop, on_started=on_started)
        return 0
    finally:
        stop.set()
        if timer is not None:
            timer.cancel()  # Ctrl-C before the duration: nothing may keep the process alive
        for t in threads:
            t.join(10)
        if probe is not None:
            probe.close(flush_timeout=2)
        _stop_spark()
        if runner is not None:
            _stop_runner(runner)
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        print("[demo] stopped.", flush=True)


def _popen(cmd: list, **kw):
    from kafka_monitor.local.broker import popen_dying_with_parent

    return popen_dying_with_parent(cmd, **kw)


def _supervise_probe(args: list, stop: threading.Event) -> None:
    """Run ``kafka-monitor probe <args>`` until ``stop``, started again when it crashes
    (``kafka_monitor.supervise``); stopped by PID (SIGTERM: it flushes and exits)."""
    from kafka_monitor.supervise import CHILD_ENV, supervise

    env = {**os.environ, CHILD_ENV: "1",
           "KAFKA_MONITOR_PROBE_REQUEST_TIMEOUT_S": "5", "KAFKA_MONITOR_PROBE_REFRESH_BACKOFF_S": "0.5"}
    cmd = [sys.executable, "-m", "kafka_monitor.cli", "--log-level", "WARNING", "probe", *args]
    supervise(cmd, stop, name="the probe", env=env, stop_timeout_s=10,
              on_start=lambda pid: print(f"[demo] probe running as its own process, pid {pid}", flush=True))


# -- the real cluster's own process -----------------------------------------------------------
#
# The Kafka cluster and its faults run in a process of their own (``python -m
# kafka_monitor.demo --cluster-runner``), started before Spark: restarting a broker forks with
# kafka_monitor.local.kafka_cluster's preexec_fn, which in the Spark driver's process would reset
# its Py4J connections (see kafka_monitor.local.broker.popen_dying_with_parent).  The runner
# starts the cluster, creates the workload topic, writes ``cluster.json`` (bootstrap servers)
# into its work directory, and runs the faults from its main thread (brokers it starts die with
# that thread) once the demo writes "ready" to its stdin (the first metrics are live).  SIGTERM
# or the end of its stdin (the demo exited) stops it: a paused broker is resumed and the cluster
# stopped.

#: the real-cluster demo's broker.session.timeout.ms: a paused broker is fenced after it
_SESSION_TIMEOUT_MS = 8000


def _kafka_setup() -> None:
    """Java 17+ and the Kafka jars (fetched with Maven on the first run)."""
    from kafka_monitor.local.kafka_install import KAFKA_VERSION, ensure_kafka, java_bin, kafka_home

    java_bin()
    home = kafka_home()
    if not (home / ".complete").exists():
        print(f"[demo] first run: fetching Apache Kafka {KAFKA_VERSION} from Maven Central with mvn into {home} "
              "(about 55 MB; a minute or two, once)...", flush=True)
    ensure_kafka()


def _start_runner(workdir: str, fault_every_s: float, stop: threading.Event):
    """Start the cluster runner; return ``(process, bootstrap servers)`` once its cluster is up,
    or ``(None, None)`` when it failed or the demo was stopped meanwhile (the runner stopped)."""
    import json
    import subprocess

    info = f"{workdir}/kafka/cluster.json"
    runner = _popen([sys.executable, "-m", "kafka_monitor.demo", "--cluster-runner", "--work-dir", f"{workdir}/kafka",
                     "--fault-every", f"{fault_every_s:g}"], stdin=subprocess.PIPE)
    while not stop.is_set():
        if os.path.exists(info):
            with open(info) as f:
                return runner, json.load(f)["bootstrap_servers"]
        if runner.poll() is not None:
            print(f"[demo] error: the Kafka cluster did not start (its runner exited with {runner.returncode}; "
                  "see above)", flush=True)
            return None, None
        stop.wait(0.5)
    _stop_runner(runner)
    return None, None


def _stop_runner(runner, timeout: float = 60.0) -> None:
    """Ask the runner to stop (end of stdin, SIGTERM), wait for it by PID, SIGKILL after ``timeout``
    (its brokers then die with it: their parent-death signal)."""
    import subprocess

    with contextlib.suppress(OSError, ValueError):
        runner.stdin.close()
    if runner.poll() is None:
        print(f"[demo] stopping the Kafka cluster (runner pid {runner.pid})...", flush=True)
        runner.terminate()
    try:
        runner.wait(timeout)
    except subprocess.TimeoutExpired:
        runner.kill()
        runner.wait()


def _cluster_runner(work_dir: str, fault_every_s: float) -> int:
    import json

    from kafka_monitor.local.kafka_cluster import KafkaCluster

    stop, ready = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def read_stdin():  # "ready": the demo's metrics are live; end of input: the demo is gone
        for line in sys.stdin:
            if line.strip() == "ready":
                ready.set()
        stop.set()
    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    os.makedirs(work_dir, exist_ok=True)
    cluster = KafkaCluster(work_dir=work_dir, broker_session_timeout_ms=_SESSION_TIMEOUT_MS)
    try:
        _start_cluster(cluster, stop)
        cluster.create_topic(workload.TOPIC, replica_assignment=REAL_ASSIGNMENT,
                             config={"min.insync.replicas": REAL_MIN_ISR})
        print(f"[demo] topic {workload.TOPIC}: 3 partitions, replication factor 3, min.insync.replicas "
              f"{REAL_MIN_ISR}, replicas {REAL_ASSIGNMENT} (first = preferred leader)", flush=True)
        tmp = f"{work_dir}/cluster.json.tmp"
        with open(tmp, "w") as f:
            json.dump({"bootstrap_servers": cluster.bootstrap_servers}, f)
        os.rename(tmp, f"{work_dir}/cluster.json")
        if fault_every_s > 0:
            FaultCycle(cluster, workload.TOPIC, stop, fenced_after_s=_SESSION_TIMEOUT_MS / 1000).run(
                fault_every_s, first_after_s=min(30.0, fault_every_s), ready=ready)
        stop.wait()
        return 0
    except Exception as e:
        if not stop.is_set():
            print(f"[demo] error: the Kafka cluster: {e}", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        cluster.stop()  # resumes a paused broker first


def _start_cluster(cluster, stop: threading.Event) -> None:
    from kafka_monitor.local.kafka_install import KAFKA_VERSION

    print(f"[demo] starting Apache Kafka {KAFKA_VERSION} on 127.0.0.1: a KRaft controller and {len(cluster.broker_ids)} "
          f"brokers, one JVM each (about 20-60 s)...", flush=True)
    t0 = time.monotonic()
    started = threading.Event()

    def ticker():
        while not started.wait(15) and not stop.is_set():
            print(f"[demo]   ... the Kafka cluster is still starting ({time.monotonic() - t0:.0f} s)", flush=True)
    threading.Thread(target=ticker, daemon=True).start()
    try:
        cluster.start()
    finally:
        started.set()
    pids = ", ".join(f"{b}: pid {cluster.pid(b)}" for b in cluster.broker_ids)
    print(f"[demo] Kafka cluster up in {time.monotonic() - t0:.1f}s: bootstrap {cluster.bootstrap_servers} "
          f"(brokers {pids}; controller pid {cluster.pid(cluster.controller_id)})", flush=True)


def _stop_spark() -> None:
    from pyspark.sql import SparkSession

    from streaming.job import stop_spark

    spark = SparkSession.getActiveSession()
    if spark is not None:
        stop_spark(spark)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cluster-runner"]:  # the real-cluster demo's Kafka cluster (see _cluster_runner)
        import argparse
        ap = argparse.ArgumentParser(prog="kafka_monitor.demo --cluster-runner")
        ap.add_argument("--cluster-runner", action="store_true")
        ap.add_argument("--work-dir", required=True)
        ap.add_argument("--fault-every", type=float, default=FAULT_EVERY_S)
        a = ap.parse_args()
        sys.exit(_cluster_runner(a.work_dir, a.fault_every))
    sys.exit(run_demo())
