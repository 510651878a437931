"""Lag rules on simulated consumers, before issue 14, before issue 35 and now: alerts per
simulated hour on healthy consumers, the error of the lag in seconds, how soon dead consumers
are called and how soon consumers slightly slower than their producers are WARN.

The simulator is ``tests/support/lag_simulation.py`` (the one ``tests/unit/test_lag_simulation.py`` asserts on) (seeded; records written with
a wandering rate, consumers that auto-commit every 5 s or every 1 000 records, observed as the
probe observes them: every 10 s, the committed offset read a few ms before the HW; the true
lag in seconds is the age of the record at offset = committed).  Each profile runs against

* "before_issue_14": the lag rules as of ``--issue14-rev`` (the last commit before issue 14),
* "before": the lag rules as of ``--before-rev`` (default: the last commit before issue 35),
  each imported with that revision's ``streaming`` and ``monitor`` from a temporary copy
  (``git archive``) for the run only, and
* "after": ``streaming/rules/lag.py`` (and the lag_* modules it imports) as in the working tree,

each with its own default ``LagConfig``.  Figures per profile and version:

* healthy profiles (``HEALTHY``) and stress variants of them (not asserted by the test):
  alert episodes opened per simulated hour by type (ConsumerLagHigh, ConsumerLagStatus per
  status), the share of observations whose status is not OK, and the lag-in-seconds error
  (estimate - truth; percentiles of its absolute value, its mean, the largest over-statement,
  and the relative error where the true lag is >= 60 s), after the first 10 min of history;
* dead profiles (``DEAD``, ``--dead-runs`` deaths each): seconds from the death to the first
  STALL, the first STOP and ConsumerLagHigh (p50 and max over the runs), the first non-OK
  status, how many runs were called WARN after the death, how many never reached STOP;
* the falling-behind profile: seconds from the slow-down to the first WARN;
* the drift profiles (``DRIFT``, records written evenly, and ``DRIFT_POISSON``, a Poisson
  stream; 90, 95 and 99 % of 5, 50 and 500 records/s; ``--drift-runs`` each, 2 h, "before"
  and "after" only): minutes from the slow-down to the first WARN (p50, max), how many runs
  were not WARN by the end, and the WARN share of the observations after the first WARN;
* the cost of one ``on_group_offsets`` call (CPU µs, best of 5 passes over a 6 h run).

    python bench/lag_sim_bench.py                       # 24 h per profile (4 seeds x 6 h), 20 deaths, 8 drifts
    python bench/lag_sim_bench.py --hours 6 --seeds 2 --dead-runs 8
    python bench/lag_sim_bench.py --before-rev HEAD~3

Prints a table and writes bench/results/lag-simulation.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from types import ModuleType
from typing import Any, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import report  # noqa: E402  (bench/report.py)
from streaming.rules import lag as rules_lag  # noqa: E402
from tests.support import lag_simulation as sim  # noqa: E402

#: the last commit of streaming/rules/lag.py before issue 14
ISSUE14_REV = "0f1c80a1ab61c42a7749569496efa0318505bbfa"
#: the last commit before issue 35 (main when it started)
BEFORE_REV = "d812381"
DRIFT_HOURS = 2.0

#: (profile, LagConfig settings for both versions): variants of the healthy profiles, not
#: asserted by the test — to show where the rules' limits are
STRESS = [
    (replace(sim.PROFILES["idle-topic"], name="idle-topic-window-64",
             what="idle-topic with lag.window 64 (the issue: a batch consumed in 7 s read as 630 s behind)"),
     {"window": 64}),
    (replace(sim.PROFILES["steady-autocommit"], name="steady-fast-wander",
             what="steady-autocommit with the rate wandering 10x faster (time constant 60 s)", rate_tau_s=60.0), {}),
    (replace(sim.PROFILES["commit-every-n"], name="commit-every-n-fast-wander",
             what="commit-every-n with the rate wandering within 4-15 records/s on a 2-min time constant",
             rate_tau_s=120.0), {}),
    (replace(sim.PROFILES["commit-every-n"], name="commit-every-500-low-rate",
             what="commits every 500 records at 2-12 records/s (every 42-250 s), 5-min time constant",
             rate=(2.0, 12.0), commit_every_n=500, rate_tau_s=300.0), {}),
    (replace(sim.PROFILES["bursts"], name="bursts-bigger",
             what="bursts of 10 000-60 000 records every ~5 min written in 2 s, drained at 2 000 records/s (5-30 s)",
             bursts=(300.0, 10_000, 60_000, 2.0), capacity=2000.0), {}),
    (replace(sim.PROFILES["slow-bounded"], name="slow-latency-wanders-30min",
             what="slow-bounded with its latency wandering on a 30-min time constant (rises of 30 s within "
             "5 min happen: WARN during them is the rule as documented)", latency_tau_s=1800.0), {}),
    (replace(sim.PROFILES["slow-bounded"], name="slow-latency-wanders-10min",
             what="slow-bounded with its latency wandering on a 10-min time constant", latency_tau_s=600.0), {}),
]


def _ours(name: str) -> bool:
    return name.split(".", 1)[0] in ("streaming", "monitor")


def load_before(rev: str, tmp: pathlib.Path) -> ModuleType:
    """The lag rules module of ``rev`` (``streaming/rules/lag.py``, or ``streaming/rules_lag.py``
    before the rules became a package), imported with the rest of that revision's ``streaming``
    and ``monitor`` from a temporary copy (``git archive``; never committed).  Today's modules
    are set aside while it imports and put back afterwards: the old module keeps its own."""
    archive = subprocess.run(["git", "archive", rev, "streaming", "monitor"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    name = next((n for n, f in (("streaming.rules.lag", "streaming/rules/lag.py"),
                                ("streaming.rules_lag", "streaming/rules_lag.py")) if (tmp / f).exists()), None)
    if name is None:
        raise SystemExit(f"lag_sim_bench: {rev} has neither streaming/rules/lag.py nor streaming/rules_lag.py")
    saved = {k: m for k, m in sys.modules.items() if _ours(k)}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp))
        for k in [k for k in sys.modules if _ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


def _q(values: list, p: float) -> Optional[float]:
    return round(float(np.percentile(values, p)), 2) if values else None


def healthy_figures(profile: sim.Profile, mod: ModuleType, hours: float, seeds: int,
                    settings: Optional[dict] = None) -> dict[str, Any]:
    cfg = mod.LagConfig(**(settings or {}))
    alerts: dict[str, int] = {}
    not_ok = n_obs = 0
    err: list = []
    rel: list = []
    for i in range(seeds):
        run = sim.simulate(profile, hours, sim.seed_of(profile.name, 100 + i), mod, cfg)
        for k, v in sim.alerts_opened(run).items():
            alerts[k] = alerts.get(k, 0) + v
        not_ok += sum(1 for s in run.statuses if s not in ("OK", None))
        n_obs += len(run.statuses)
        sel = (run.t_ms - run.t_ms[0] >= sim.WARMUP_S * 1000) & ((run.true > 0) | (run.est > 0))
        e = run.est[sel] - run.true[sel]
        err += e.tolist()
        big = run.true[sel] >= 60
        rel += (np.abs(e[big]) / run.true[sel][big]).tolist()
    total_h = hours * seeds
    a = [abs(x) for x in err]
    return {
        "simulated_hours": total_h,
        "alerts_per_hour": {k: round(v / total_h, 3) for k, v in sorted(alerts.items())},
        "alerts_per_hour_total": round(sum(alerts.values()) / total_h, 3),
        "alert_episodes": sum(alerts.values()),
        "not_ok_observations_share": round(not_ok / n_obs, 5),
        "lag_seconds_error": {
            "observations": len(err), "abs_p50_s": _q(a, 50), "abs_p90_s": _q(a, 90), "abs_p99_s": _q(a, 99),
            "abs_max_s": round(max(a), 2) if a else None, "mean_s": round(statistics.fmean(err), 2) if err else None,
            "max_overstatement_s": round(max(0.0, max(err)), 2) if err else None,
            "rel_p50_true_ge_60s": _q(rel, 50), "rel_p99_true_ge_60s": _q(rel, 99),
            "rel_max_true_ge_60s": round(max(rel), 3) if rel else None},
    }


def dead_figures(profile: sim.Profile, mod: ModuleType, runs: int) -> dict[str, Any]:
    hours = (profile.dies_at_s + 2400.0) / 3600.0
    got = [sim.dead_figures(sim.simulate(profile, hours, sim.seed_of(profile.name, i), mod)) for i in range(runs)]

    def dist(key: str) -> dict:
        v = [g[key] for g in got if g[key] is not None]
        return {"p50": _q(v, 50), "max": round(max(v), 1) if v else None, "runs": len(v)}

    first: dict[str, int] = {}
    for g in got:
        first[str(g["first_status_after_death"])] = first.get(str(g["first_status_after_death"]), 0) + 1
    return {"runs": runs, "stall_s": dist("stall_s"), "stop_s": dist("stop_s"), "lag_high_s": dist("lag_high_s"),
            "first_status_after_death": first,
            "runs_called_warn_after_death": sum(1 for g in got if g["warn_after_death"]),
            "runs_never_stop": sum(1 for g in got if g["stop_s"] is None),
            "runs_with_alerts_before_death": sum(1 for g in got if g["alerts_before_death"])}


def falling_figures(mod: ModuleType, runs: int) -> dict[str, Any]:
    p = sim.FALLING
    out, worse = [], 0
    for i in range(runs):
        run = sim.simulate(p, 1.0, sim.seed_of(p.name, i), mod)
        slow_from = int(run.t_ms[0] + p.slow_from_s * 1000)
        out.append(sim.first_status_after(run, "WARN", slow_from))
        worse += any(s in ("STALL", "STOP", "REWIND") for s in run.statuses)
    v = [x for x in out if x is not None]
    return {"runs": runs, "warn_after_slowdown_s": {"p50": _q(v, 50), "max": round(max(v), 1) if v else None,
                                                     "runs": len(v)},
            "runs_worse_than_warn": worse}


def drift_figures(profile: sim.Profile, mod: ModuleType, runs: int) -> dict[str, Any]:
    firsts, never, share = [], 0, []
    for i in range(runs):
        run = sim.simulate(profile, DRIFT_HOURS, sim.seed_of(profile.name, i), mod)
        f = sim.first_status_after(run, "WARN", int(run.t_ms[0] + profile.slow_from_s * 1000))
        if f is None:
            never += 1
            continue
        firsts.append(f / 60.0)
        k = run.statuses.index("WARN")
        share.append(sum(1 for s in run.statuses[k:] if s == "WARN") / len(run.statuses[k:]))
    return {"runs": runs, "warn_after_slowdown_min": {"p50": _q(firsts, 50), "max": round(max(firsts), 1)
                                                      if firsts else None},
            "runs_not_warn_within_min": {"runs": never, "min": round(DRIFT_HOURS * 60 - profile.slow_from_s / 60, 1)},
            "warn_share_after_first_warn_min": round(min(share), 3) if share else None}


def cost_us(mod: ModuleType) -> dict[str, float]:
    out = {}
    for name in ("steady-autocommit", "commit-every-n", "slow-bounded"):
        rng = np.random.default_rng(1)
        s = sim.build(sim.PROFILES[name], 6 * 3600, rng)
        obs = sim.observe(s, 6 * 3600, rng)
        best = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            sim.monitor(obs, mod)
            best = min(best, time.process_time() - t0)
        out[name] = round(best / len(obs.t_ms) * 1e6, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=6.0, help="simulated hours per healthy run")
    ap.add_argument("--seeds", type=int, default=4, help="runs (seeds) per healthy profile")
    ap.add_argument("--dead-runs", type=int, default=20, help="deaths per dead profile")
    ap.add_argument("--drift-runs", type=int, default=8, help="runs per drift profile")
    ap.add_argument("--before-rev", default=BEFORE_REV, help="git revision of the 'before' rules")
    ap.add_argument("--issue14-rev", default=ISSUE14_REV, help="git revision of the rules before issue 14")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lag-simulation.json"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        versions = {"before_issue_14": load_before(args.issue14_rev, pathlib.Path(tmp) / "i14"),
                    "before": load_before(args.before_rev, pathlib.Path(tmp) / "before"), "after": rules_lag}
        healthy: dict[str, Any] = {}
        stress: dict[str, Any] = {}
        dead: dict[str, Any] = {}
        for group, profiles in ((healthy, [(p, {}) for p in sim.HEALTHY]), (stress, STRESS)):
            for p, settings in profiles:
                group[p.name] = {"what": p.what, "settings": settings,
                                 **{v: healthy_figures(p, m, args.hours, args.seeds, settings)
                                    for v, m in versions.items()}}
        for p in sim.DEAD:
            dead[p.name] = {"what": p.what, **{v: dead_figures(p, m, args.dead_runs) for v, m in versions.items()}}
        falling = {"what": sim.FALLING.what, **{v: falling_figures(m, args.dead_runs) for v, m in versions.items()}}
        drift = {p.name: {"what": p.what, **{v: drift_figures(p, versions[v], args.drift_runs)
                                             for v in ("before", "after")}}
                 for p in sim.DRIFT + sim.DRIFT_POISSON}
        cost = {v: cost_us(m) for v, m in versions.items()}

    print(f"{'profile':30s} {'alerts/h i14-before':>20s} {'before':>7s} {'after':>6s}  "
          f"{'|err| p99 s before':>19s} {'after':>6s}  after: by type")
    for group in (healthy, stress):
        for name, f in group.items():
            print(f"{name:30s} {f['before_issue_14']['alerts_per_hour_total']:20.2f} "
                  f"{f['before']['alerts_per_hour_total']:7.2f} {f['after']['alerts_per_hour_total']:6.2f}  "
                  f"{f['before']['lag_seconds_error']['abs_p99_s']!s:>19s} "
                  f"{f['after']['lag_seconds_error']['abs_p99_s']!s:>6s}  {f['after']['alerts_per_hour']}")
    print("dead (max over the runs, s; before / after): STALL, STOP, ConsumerLagHigh")
    for name, f in dead.items():
        b, a = f["before"], f["after"]
        print(f"{name:30s} STALL {b['stall_s']['max']}/{a['stall_s']['max']}  STOP {b['stop_s']['max']}/"
              f"{a['stop_s']['max']}  High {b['lag_high_s']['max']}/{a['lag_high_s']['max']} "
              f"(p50 {b['lag_high_s']['p50']}/{a['lag_high_s']['p50']})  first {b['first_status_after_death']} / "
              f"{a['first_status_after_death']}")
    print(f"falling-behind: WARN after {falling['before']['warn_after_slowdown_s']} / "
          f"{falling['after']['warn_after_slowdown_s']}")
    print("drift: minutes from the slow-down to WARN, p50 / max (runs not WARN by the end), before -> after")
    for name, f in drift.items():
        b, a = f["before"], f["after"]
        print(f"{name:30s} {b['warn_after_slowdown_min']['p50']!s:>6s} / {b['warn_after_slowdown_min']['max']!s:>6s} "
              f"({b['runs_not_warn_within_min']['runs']})  ->  {a['warn_after_slowdown_min']['p50']!s:>6s} / "
              f"{a['warn_after_slowdown_min']['max']!s:>6s} ({a['runs_not_warn_within_min']['runs']})  "
              f"WARN share after first {a['warn_share_after_first_warn_min']}")
    print(f"cost µs/observation: {cost}")

    report.write(args.out, "lag-simulation",
                 args={"hours_per_run": args.hours, "seeds": args.seeds, "dead_runs": args.dead_runs,
                       "drift_runs": args.drift_runs, "drift_hours": DRIFT_HOURS,
                       "before_rev": args.before_rev, "issue14_rev": args.issue14_rev,
                       "probe_interval_s": sim.PROBE_S, "step_s": sim.DT,
                       "error_after_s_of_history": sim.WARMUP_S},
                 bounds_asserted_by_the_test={
                     "healthy": "no ConsumerLagHigh, no ConsumerLagStatus, status OK at every observation",
                     "lag_seconds_error": f"|estimate - true| <= max({sim.ERR_ABS_S} s, {sim.ERR_REL:.0%} of true) "
                                          f"after {sim.WARMUP_S:.0f} s of history; before that never over",
                     "dead_stop_within_s": sim.DEAD_STOP_BOUND_S,
                     "dead_commit_every_n_stop_within_s": sim.DEAD_SLOW_STOP_BOUND_S,
                     "falling_behind_warn_within_s": sim.FALLING_WARN_BOUND_S,
                     "drift_warn_within_s": sim.DRIFT_WARN_BOUND_S,
                     "long_gaps": "healthy from the first commit the monitor sees"},
                 healthy=healthy, stress_variants=stress, dead=dead, falling_behind=falling, drift=drift,
                 cost_us_per_observation=cost)


if __name__ == "__main__":
    main()
