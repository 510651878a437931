"""A seeded simulator of ordinary consumers, observed as the probe observes them and run
through the lag rules (tests/unit/test_lag_simulation.py asserts on it, bench/lag_sim_bench.py
measures with it).

The simulator (pure numpy, 100 ms steps) writes records with a wandering rate, lets a consumer
read them with a capacity and a fetch delay (or a processing latency), commits the way real
consumers do (auto-commit every 5 s, or every N records), and observes the group as the probe
does: every 10 s (a little jitter), the committed offset read a few ms before the HW, the
observation stamped with the HW's time.  It knows the truth: the lag in seconds is the age of
the oldest record the group has not consumed, the record at offset = committed.  The monitor
starts with an empty state while the consumers are already running (a fresh deployment: its
first minutes are part of the run).  The profiles and the bounds the test asserts (quoted by
docs/lag-rules.md) live here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional

import numpy as np

from streaming.rules import lag as rules_lag

DT = 0.1                 # simulation step, s
PROBE_S = 10.0           # probe interval, s
WARM_SYSTEM_S = 900.0    # the consumers run this long before the monitor's first observation
HW0 = 1_000_000          # first offset of the partition
ENTITY = "group_partition|sim|g|t|0"

#: error bound of the lag in seconds (estimate vs truth), after WARMUP_S of history
ERR_ABS_S = 12.0
ERR_REL = 0.10
WARMUP_S = 600.0
#: dead consumers: STOP within this long of the death
DEAD_STOP_BOUND_S = 330.0
DEAD_SLOW_STOP_BOUND_S = 1500.0
#: long_gaps profiles, before WARMUP_S: the estimate's overstatement, relative to the true lag
START_ERR_REL = 0.5
#: a consumer at 64-78 % of its producers' speed is WARN within this long of slowing down:
#: once it is more than the window (90 s) behind — after 90 / (1 - 0.78) = 410 s at worst, 300 s
#: at 70 % — and the next commit sample (every 30 s) shows the rise
FALLING_WARN_BOUND_S = 450.0
#: a consumer at 90-99 % of its producers' speed (records written evenly) is WARN within this
#: long of slowing down, whatever the producers' rate (measured: 99 % 21-22 min, 95 % ~9 min,
#: 90 % ~6 min; from a fresh monitor 13 min at 90-95 %)
DRIFT_WARN_BOUND_S = 1800.0


@dataclass(frozen=True)
class Profile:
    """One consumer and its producers.  Rates in records/s, times in seconds."""

    name: str
    what: str
    #: production rate: wanders (log-space Ornstein-Uhlenbeck) within this range; (0, 0): none
    rate: tuple[float, float] = (0.0, 0.0)
    rate_tau_s: float = 900.0
    #: records written evenly at the rate, not as a Poisson stream
    steady: bool = False
    #: the rate also follows the day: multiplied by a factor going from 1 down to this and back
    #: (a cosine of period ``diurnal_period_s``); 1: no daily cycle
    diurnal_low: float = 1.0
    diurnal_period_s: float = 86_400.0
    #: bursts: (mean gap s, min size, max size, seconds to write one)
    bursts: Optional[tuple[float, int, int, float]] = None
    #: consumer: records/s it can process, fetch delay range (s)
    capacity: float = 5000.0
    fetch_delay: tuple[float, float] = (0.05, 0.5)
    #: a processing latency wandering within this range (s): the consumer is this far behind
    latency: Optional[tuple[float, float]] = None
    latency_tau_s: float = 3600.0
    #: "auto" (every commit_every_s), "records" (every commit_every_n records) or "batch" (wakes
    #: every batch_every s — a uniform draw — consumes what is there and commits)
    commit: str = "auto"
    commit_every_s: float = 5.0
    commit_every_n: int = 1000
    batch_every: tuple[float, float] = (180.0, 360.0)
    #: from slow_from_s (after the monitor's first observation) on, the consumer processes only
    #: this many records/s
    slow_capacity: Optional[float] = None
    slow_from_s: float = 0.0
    #: the consumer dies this long after the monitor's first observation (no processing, no commit)
    dies_at_s: Optional[float] = None
    #: the producers stop this long after the monitor's first observation
    quiet_at_s: Optional[float] = None
    #: a last batch written as the consumer dies (records), so records are waiting
    last_batch: int = 0
    kind: str = "healthy"   # healthy | dead | falling | drift
    #: commit gaps longer than stop_after_ms and lag_high_seconds: the gap under way when the
    #: monitor starts (no cadence, no commit step known yet) may raise STOP and ConsumerLagHigh,
    #: and the lag of its record, written before the monitor's first observation, is
    #: extrapolated with the little rate seen so far (within START_ERR_REL)
    long_gaps: bool = False


HEALTHY = [
    Profile("steady-autocommit", "rate wandering 1-100 records/s, auto-commit every 5 s",
            rate=(1.0, 100.0), rate_tau_s=600.0),
    Profile("bursts", "1-5 records/s plus bursts of 5 000-30 000 records (every ~10 min, written in "
            "1 s) drained in 2-20 s by a 1 500 records/s consumer, auto-commit every 5 s",
            rate=(1.0, 5.0), bursts=(600.0, 5_000, 30_000, 1.0), capacity=1500.0),
    Profile("idle-topic", "nothing, then a batch of 1-100 records, every 30 min on average (random); the "
            "consumer reads it at once and auto-commits within 5 s", bursts=(1800.0, 1, 100, 0.5)),
    Profile("low-volume", "one record every 20-100 s, auto-commit every 5 s", rate=(0.01, 0.05)),
    Profile("commit-every-n", "rate wandering 4-15 records/s, the consumer keeps up but commits every "
            "1 000 records (every 67-250 s)", rate=(4.0, 15.0), rate_tau_s=900.0, commit="records"),
    Profile("slow-bounded", "a slow but stable consumer: processing latency wandering 50-130 s, rate "
            "5-15 records/s (lag 250-1 950 records), auto-commit every 5 s", rate=(5.0, 15.0),
            latency=(50.0, 130.0), latency_tau_s=7200.0),
    Profile("diurnal", "producers following the day: 300-500 records/s at the peak, 50 times less at night (a "
            "24 h cosine), a consumer with 600 records/s of capacity, auto-commit every 5 s",
            rate=(300.0, 500.0), diurnal_low=0.02, capacity=600.0),
    Profile("bursty-producers", "producers at 0.5-2 records/s that write 6 000-24 000 records over 2 min "
            "(50-200 records/s) every ~15 min, now and then two at once; a 300 records/s consumer, "
            "auto-commit every 5 s", rate=(0.5, 2.0), bursts=(900.0, 6_000, 24_000, 120.0), capacity=300.0),
    Profile("commit-every-n-low-rate", "2-4 records/s, the consumer keeps up but commits every 1 000 records "
            "(every 250-500 s)", rate=(2.0, 4.0), commit="records", long_gaps=True),
    Profile("batch-consumer", "5-20 records/s; the consumer wakes every 3-6 min, consumes what is there and "
            "commits", rate=(5.0, 20.0), commit="batch", long_gaps=True),
]

DEAD = [
    Profile("dead-producers-writing", "auto-committing consumer at 5-50 records/s dies; producers go on",
            rate=(5.0, 50.0), dies_at_s=1200.0, kind="dead"),
    Profile("dead-producers-quiet", "auto-committing consumer at 5-50 records/s dies as a last batch of 200 "
            "records lands; then the producers are quiet", rate=(5.0, 50.0), dies_at_s=1200.0,
            quiet_at_s=1200.1, last_batch=200, kind="dead"),
    Profile("dead-commit-every-n", "a consumer committing every 1 000 records (5-15 records/s) dies; "
            "producers go on", rate=(5.0, 15.0), commit="records", dies_at_s=2400.0, kind="dead"),
]

FALLING = Profile("falling-behind", "45-55 records/s, auto-commit every 5 s; 10 min after the monitor starts "
                  "the consumer slows to 35 records/s (64-78 % of the rate)", rate=(45.0, 55.0),
                  slow_capacity=35.0, slow_from_s=600.0, kind="falling")

#: a consumer slightly slower than its producers: keeps up until DRIFT_FROM_S, then processes
#: ``fraction`` of the producers' steady rate (its lag in seconds rises 1 - fraction s per s)
DRIFT_FROM_S = 600.0
DRIFT_FRACTIONS = (0.90, 0.95, 0.99)
DRIFT_RATES = (5.0, 50.0, 500.0)


def drift_profile(fraction: float, rate: float, steady: bool = True) -> Profile:
    """Records written evenly (``steady``: the lag rises steadily, 1 - fraction s per s), or as a
    Poisson stream (the true lag then also wanders by about sqrt(t / rate) s: at 99 % of 5
    records/s that is as much as the drift over half an hour)."""
    return Profile(f"drift-{round(fraction * 100)}pct-{rate:g}rps" + ("" if steady else "-poisson"),
                   f"{rate:g} records/s ({'evenly' if steady else 'Poisson'}), auto-commit every 5 s; "
                   f"{DRIFT_FROM_S:.0f} s after the monitor starts the consumer slows to {fraction:.0%} of that",
                   rate=(rate, rate), steady=steady, slow_capacity=fraction * rate, slow_from_s=DRIFT_FROM_S,
                   kind="drift")


DRIFT = [drift_profile(f, r) for f in DRIFT_FRACTIONS for r in DRIFT_RATES]
DRIFT_POISSON = [drift_profile(f, r, steady=False) for f in DRIFT_FRACTIONS for r in DRIFT_RATES]

PROFILES = {p.name: p for p in HEALTHY + DEAD + [FALLING] + DRIFT + DRIFT_POISSON}


# --- the simulated system ---------------------------------------------------------------

def _wander(rng: np.random.Generator, n: int, lo: float, hi: float, tau_s: float) -> np.ndarray:
    """n per-step values wandering within [lo, hi] (log-space OU, sampled every second)."""
    if hi <= 0:
        return np.zeros(n)
    secs = int(math.ceil(n * DT)) + 1
    a, b = math.log(lo), math.log(hi)
    mu, sd = (a + b) / 2, (b - a) / 4
    theta = 1.0 / tau_s
    x = np.empty(secs)
    x[0] = rng.uniform(a, b)
    noise = rng.standard_normal(secs) * sd * math.sqrt(2 * theta)
    for i in range(1, secs):
        x[i] = min(b, max(a, x[i - 1] + theta * (mu - x[i - 1]) + noise[i]))
    per_step = np.repeat(np.exp(x), int(round(1 / DT)))[:n]
    return per_step


@dataclass
class System:
    """The simulated partition and group, in steps of DT from t = 0 (the monitor starts at
    WARM_SYSTEM_S)."""

    cum: np.ndarray              # records written by the end of each step (HW - HW0 at t = k*DT)
    commit_steps: np.ndarray     # step of each commit (increasing)
    commit_values: np.ndarray    # committed offset - HW0 after each commit
    death_t: Optional[float]     # absolute time of the death, s


def build(p: Profile, seconds: float, rng: np.random.Generator) -> System:
    n = int(round((WARM_SYSTEM_S + seconds) / DT))
    t = np.arange(n) * DT
    rate = _wander(rng, n, *p.rate, p.rate_tau_s) if p.rate[1] > 0 else np.zeros(n)
    if p.diurnal_low < 1.0:
        phase = rng.uniform(0, 2 * math.pi)
        rate = rate * (p.diurnal_low + (1 - p.diurnal_low) * (1 + np.cos(2 * math.pi * t / p.diurnal_period_s + phase)) / 2)
    if p.quiet_at_s is not None:
        rate[t >= WARM_SYSTEM_S + p.quiet_at_s] = 0.0
    if p.steady:  # evenly spaced records: no arrival noise (the lag of a slower consumer rises steadily)
        counts = np.diff(np.floor(np.concatenate([[0.0], np.cumsum(rate * DT)]))).astype(np.int64)
    else:
        counts = rng.poisson(rate * DT).astype(np.int64)
    if p.bursts is not None:
        gap, lo, hi, over = p.bursts
        at = rng.exponential(gap)
        while at < n * DT:
            size, k0, width = int(rng.integers(lo, hi + 1)), int(at / DT), max(1, int(over / DT))
            k1 = min(n, k0 + width)
            counts[k0:k1] += np.diff(np.linspace(0, size, k1 - k0 + 1).astype(np.int64))
            at += rng.exponential(gap)
    death_t = None if p.dies_at_s is None else WARM_SYSTEM_S + p.dies_at_s
    if p.last_batch and death_t is not None:
        counts[int(round(death_t / DT))] += p.last_batch  # lands as the consumer dies, then quiet
    cum = np.cumsum(counts)

    # what the consumer can have fetched at each step: a fetch delay, or a processing latency
    if p.latency is not None:
        delay = _wander(rng, n, *p.latency, p.latency_tau_s)
    else:
        delay = rng.uniform(*p.fetch_delay, size=n // 50 + 1).repeat(50)[:n]
    src = np.maximum.accumulate(np.maximum(0, np.arange(n) - (delay / DT).astype(np.int64)))
    avail = cum[src]
    cap = np.full(n, p.capacity * DT)
    if p.slow_capacity is not None:
        cap[t >= WARM_SYSTEM_S + p.slow_from_s] = p.slow_capacity * DT
    if death_t is not None:
        cap[t >= death_t] = 0.0
    ccap = np.cumsum(cap)
    pos = np.floor(ccap + np.minimum.accumulate(avail - ccap)).astype(np.int64)
    pos = np.maximum(0, np.minimum(pos, avail))

    # commits
    end = n if death_t is None else int(death_t / DT)
    if p.commit == "auto":
        every = int(round(p.commit_every_s / DT))
        steps = np.arange(int(rng.integers(0, every)), end, every)
        values = pos[steps]
    elif p.commit == "batch":
        at = float(rng.uniform(0, p.batch_every[1]))
        steps_b = []
        while at < end * DT:
            steps_b.append(int(at / DT))
            at += float(rng.uniform(*p.batch_every))
        steps = np.array(steps_b, dtype=np.int64)
        values = pos[steps]
    else:
        steps_l, values_l, last, k = [0], [int(pos[0])], int(pos[0]), 0
        while True:
            k = int(np.searchsorted(pos, last + p.commit_every_n, side="left"))
            if k >= end:
                break
            last = int(pos[k])
            steps_l.append(k)
            values_l.append(last)
        steps, values = np.array(steps_l), np.array(values_l)
    keep = np.concatenate([[True], np.diff(values) != 0])  # a commit of the same offset changes nothing
    return System(cum, steps[keep], values[keep], death_t)


@dataclass
class Observed:
    t_ms: np.ndarray          # observation time (the HW's), ms
    committed: np.ndarray     # absolute offsets
    hw: np.ndarray
    true_lag_s: np.ndarray    # age of the record at offset = committed (0 when caught up)


def observe(sys_: System, seconds: float, rng: np.random.Generator) -> Observed:
    """The probe: every PROBE_S (jitter up to 0.2 s), committed read 2-30 ms before the HW."""
    k = np.arange(int(seconds / PROBE_S))
    t = WARM_SYSTEM_S + k * PROBE_S + rng.uniform(0, 0.2, size=len(k))
    t_commit = t - rng.uniform(0.002, 0.030, size=len(k))
    n = len(sys_.cum)
    hw_rel = sys_.cum[np.minimum(n - 1, (t / DT).astype(np.int64))]
    ci = np.searchsorted(sys_.commit_steps, (t_commit / DT).astype(np.int64), side="right") - 1
    c_rel = np.where(ci >= 0, sys_.commit_values[np.maximum(ci, 0)], 0)
    # record o was written in the step where the cumulative count passed o
    written = np.searchsorted(sys_.cum, c_rel, side="right") * DT
    true = np.where(c_rel >= hw_rel, 0.0, np.maximum(0.0, t - written))
    return Observed(np.round(t * 1000).astype(np.int64), c_rel + HW0, hw_rel + HW0, true)


# --- the monitor ------------------------------------------------------------------------

@dataclass
class Run:
    profile: str
    hours: float
    statuses: list
    est: np.ndarray
    basis: list
    true: np.ndarray
    t_ms: np.ndarray
    transitions: list            # (t_ms, alert value, action, status or None)
    death_t_ms: Optional[int]
    #: when the monitor first saw the committed offset move (the end of the gap under way at its start)
    first_commit_ms: Optional[int] = None


def monitor(obs: Observed, rules_module: ModuleType, cfg: Any = None) -> tuple[list, np.ndarray, list, list]:
    """Feed the observations to ``rules_module.on_group_offsets`` (the module as it is, or an
    older version of it): statuses, lag-seconds estimates, their bases, transitions."""
    cfg = cfg if cfg is not None else rules_module.LagConfig()
    s = rules_lag.new_group_partition("sim", "g", "t", 0)
    statuses, est, basis, trans = [], np.zeros(len(obs.t_ms)), [], []
    on = rules_module.on_group_offsets
    for i, (t, c, h) in enumerate(zip(obs.t_ms.tolist(), obs.committed.tolist(), obs.hw.tolist())):
        for x in on(s, {"committed_offset": c, "high_watermark": h}, t, ENTITY, cfg):
            trans.append((x.at, x.alert.value, x.action, x.evidence.get("status")))
        statuses.append(s["status"])
        est[i] = s["lag_seconds"] if s["lag_seconds"] is not None else 0.0
        basis.append(s.get("lag_seconds_basis"))
    return statuses, est, basis, trans


def simulate(p: Profile, hours: float, seed: int, rules_module: ModuleType = rules_lag, cfg: Any = None) -> Run:
    rng = np.random.default_rng(seed)
    seconds = hours * 3600.0
    sys_ = build(p, seconds, rng)
    obs = observe(sys_, seconds, rng)
    statuses, est, basis, trans = monitor(obs, rules_module, cfg)
    death = None if sys_.death_t is None else int(round(sys_.death_t * 1000))
    moved = np.flatnonzero(obs.committed != obs.committed[0])
    first_commit = int(obs.t_ms[moved[0]]) if len(moved) else None
    return Run(p.name, hours, statuses, est, basis, obs.true_lag_s, obs.t_ms, trans, death, first_commit)


# --- figures ------------------------------------------------------------------------------

def alerts_opened(run: Run) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, alert, action, status in run.transitions:
        if action == "open":
            key = alert if alert != "ConsumerLagStatus" else f"ConsumerLagStatus:{status}"
            out[key] = out.get(key, 0) + 1
    return out


def estimate_errors(run: Run, warmup_s: float = WARMUP_S) -> dict[str, Any]:
    """Estimate - truth (s) over the observations after ``warmup_s`` where either is > 0."""
    t0 = run.t_ms[0]
    sel = (run.t_ms - t0 >= warmup_s * 1000) & ((run.true > 0) | (run.est > 0))
    err = run.est[sel] - run.true[sel]
    if not len(err):
        return {"n": 0}
    a = np.abs(err)
    big = run.true[sel] >= 60
    rel = a[big] / run.true[sel][big]
    q = lambda v, p: round(float(np.percentile(v, p)), 2) if len(v) else None  # noqa: E731
    return {"n": int(len(err)), "abs_p50_s": q(a, 50), "abs_p90_s": q(a, 90), "abs_p99_s": q(a, 99),
            "abs_max_s": round(float(a.max()), 2), "bias_mean_s": round(float(err.mean()), 2),
            "over_max_s": round(float(max(0.0, err.max())), 2),
            "rel_p50_true_ge_60s": q(rel, 50), "rel_p99_true_ge_60s": q(rel, 99),
            "rel_max_true_ge_60s": round(float(rel.max()), 3) if len(rel) else None}


def first_status_after(run: Run, status: str, after_ms: int) -> Optional[float]:
    for t, s in zip(run.t_ms.tolist(), run.statuses):
        if t >= after_ms and s == status:
            return (t - after_ms) / 1000.0
    return None


def dead_figures(run: Run) -> dict[str, Any]:
    d = run.death_t_ms
    before = [s for t, s in zip(run.t_ms.tolist(), run.statuses) if t < d]
    after = [s for t, s in zip(run.t_ms.tolist(), run.statuses) if t >= d]
    high = [t for t, a, act, _ in run.transitions if a == "ConsumerLagHigh" and act == "open" and t >= d]
    return {"alerts_before_death": sum(1 for t, _, act, _ in run.transitions if act == "open" and t < d),
            "not_ok_before_death": sum(1 for s in before if s not in ("OK", None)),
            "warn_after_death": sum(1 for s in after if s == "WARN"),
            "first_status_after_death": next((s for s in after if s not in ("OK", None)), None),
            "stall_s": first_status_after(run, "STALL", d), "stop_s": first_status_after(run, "STOP", d),
            "lag_high_s": (high[0] - d) / 1000.0 if high else None}


# --- the tests ----------------------------------------------------------------------------

def seed_of(name: str, i: int = 0) -> int:
    """A fixed seed per profile (and run): the same simulation every time, everywhere."""
    return sum(ord(ch) * (k + 1) for k, ch in enumerate(name)) * 1000 + i


