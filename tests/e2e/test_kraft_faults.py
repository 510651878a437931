"""The controller quorum's faults and eligible leader replicas through the whole monitor (issue 47):
a cluster with three controllers (tests/support/kraft_stack.py), its active controller SIGKILLed
and started again, then the next one SIGSTOPped past the election timeout and resumed: /metrics
shows each new leader and QuorumVoterLagging, resolved once the controller is back, and no
partition or group alert opens, nor QuorumUnavailable (two voters of three keep a majority); the
probe and the job keep running.  Then a follower paused below min.insync.replicas: its ELR on
/metrics, gone once the ISR is full.  bench/kraft_bench.py repeats these for figures."""

from __future__ import annotations

import pytest

from tests.support.kraft_stack import Faults, KraftStack

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


@pytest.mark.timeout(900)
def test_controller_failovers_and_an_elr_reach_metrics_with_no_false_alert(spark, tmp_path):
    with KraftStack(spark, tmp_path) as stack:
        faults = Faults(stack)
        got = [faults.controller("kill"), faults.controller("pause"), faults.elr()]
        print("\n" + "\n".join(map(str, got)))
    for g in got[:2]:
        assert g["new_leader"] != g["lost"]
        assert g["quorum_unavailable"] == 0, g
        assert g["partition_or_group_alerts"] == {}, g
    assert all(g["alive"] for g in got), got
