"""The quality gate (streaming.ingest.quality) on pandas frames shaped like parse()'s output, no Spark.

The table below is the rules' correctness proof: one good and at least one bad row per rule,
the sentinels that must have become null upstream, the deliberate non-rules (committed above
HW, leader -1, extra fields a type does not carry), and the first-failure priority."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from streaming.ingest import quality as q

COLS = ["reason", "raw", "entity", "type", "cluster", "source", "seq", "observed_at", "topic", "partition",
        "group", "leader", "leader_epoch", "replicas", "isr", "offline_replicas", "min_insync_replicas",
        "high_watermark", "log_start_offset", "last_stable_offset", "committed_offset", "interval_ms",
        "events_dropped"]
LONGS = ["seq", "observed_at", "partition", "leader", "leader_epoch", "min_insync_replicas", "high_watermark",
         "log_start_offset", "last_stable_offset", "committed_offset", "interval_ms", "events_dropped"]
T0 = 1_700_000_000_000


def env(etype, **kw):
    d = {"reason": None, "raw": f'{{"type":"{etype}"}}', "entity": "k/x", "type": etype, "cluster": "k",
         "source": "probe", "seq": 7, "observed_at": T0}
    d.update(kw)
    return d


def pmd(**kw):
    d = dict(topic="t", partition=0, leader=1, leader_epoch=4, replicas=[1, 2, 3], isr=[1, 2, 3],
             offline_replicas=[], min_insync_replicas=2)
    d.update(kw)
    return env("partition_metadata", **d)


def poff(**kw):
    d = dict(topic="t", partition=0, high_watermark=500, log_start_offset=10, last_stable_offset=490)
    d.update(kw)
    return env("partition_offsets", **d)


def goff(**kw):
    d = dict(group="g", topic="t", partition=0, committed_offset=450, high_watermark=500)
    d.update(kw)
    return env("group_offsets", **d)


def cfetch(**kw):
    d = dict(group="g", topic="t", partition=0, leader=2, leader_epoch=3, high_watermark=500, log_start_offset=0,
             last_stable_offset=500)
    d.update(kw)
    return env("client_fetch", **d)


def hb(**kw):
    d = dict(interval_ms=5000, events_dropped=0)
    d.update(kw)
    return env("heartbeat", **d)


def with_(row, **kw):
    r = dict(row)
    r.update(kw)
    return r


def frame(*rows, spark_dtypes=False):
    df = pd.DataFrame([{c: r.get(c) for c in COLS} for r in rows], columns=COLS)
    if spark_dtypes:
        # what mapInPandas hands over (PySpark 4, measured): bigint -> nullable Int64; array<bigint>
        # -> numpy int64 arrays, or object arrays when an element is null; strings -> object
        for c in LONGS:
            df[c] = pd.array([None if v is None else v for v in df[c]], dtype="Int64")
        for c in ("replicas", "isr", "offline_replicas"):
            df[c] = pd.Series([None if v is None else np.asarray(v, dtype=object if None in v else np.int64)
                               for v in df[c]], dtype=object)
    return df


# (case, row, expected reason)
TABLE = [
    # --- good rows of every type
    ("good partition_metadata", pmd(), None),
    ("good partition_offsets", poff(), None),
    ("good group_offsets", goff(), None),
    ("good client_fetch", cfetch(), None),
    ("good heartbeat", hb(), None),
    ("good group_state", env("group_state", group="g"), None),
    ("good rebalance", env("rebalance", group="g"), None),
    ("good metadata_refresh", env("metadata_refresh"), None),
    ("derived partition_count_change row", env("partition_count_change", topic="t"), None),
    # --- envelope
    ("unknown type (double check of parse())", env("bogus"), "type_known"),
    ("seq -1", with_(hb(), seq=-1), "seq_not_negative"),
    ("seq 0 is the first event", with_(hb(), seq=0), None),
    ("observed_at 0", with_(hb(), observed_at=0), "observed_at_in_range"),
    ("observed_at negative", with_(poff(), observed_at=-5), "observed_at_in_range"),
    ("observed_at in microseconds", with_(poff(), observed_at=T0 * 1000), "observed_at_in_range"),
    ("observed_at in nanoseconds", with_(poff(), observed_at=T0 * 1_000_000), "observed_at_in_range"),
    ("observed_at small but positive (test clocks)", with_(poff(), observed_at=1000), None),
    # --- partition
    ("partition -1", pmd(partition=-1), "partition_not_negative"),
    ("partition -1 on group_offsets", goff(partition=-1), "partition_not_negative"),
    ("partition 0", pmd(partition=0), None),
    # --- sentinels and offsets
    ("HW -1001 slipped through", poff(high_watermark=-1001), "offset_sentinel"),
    ("log start -1 slipped through", poff(log_start_offset=-1), "offset_sentinel"),
    ("committed -1001 slipped through", goff(committed_offset=-1001), "offset_sentinel"),
    ("client LSO -1 slipped through", cfetch(last_stable_offset=-1), "offset_sentinel"),
    ("negative committed", goff(committed_offset=-5), "offset_not_negative"),
    ("negative HW", poff(high_watermark=-7, log_start_offset=None), "offset_not_negative"),
    ("negative LSO", poff(last_stable_offset=-2), "offset_not_negative"),
    ("offsets null when unknown", poff(log_start_offset=None, last_stable_offset=None), None),
    ("committed null (nothing committed)", goff(committed_offset=None), None),
    ("committed above a stale HW is allowed", goff(committed_offset=900, high_watermark=500), None),
    ("committed below log start is allowed", goff(committed_offset=0), None),
    # --- leader / epoch / min ISR
    ("leader -1 = no leader (offline)", pmd(leader=-1, isr=[]), None),
    ("leader -2", pmd(leader=-2), "leader_not_below_minus_one"),
    ("client leader -2", cfetch(leader=-2), "leader_not_below_minus_one"),
    ("leader epoch -1 slipped through", pmd(leader_epoch=-1), "leader_epoch_not_negative"),
    ("leader epoch unknown", pmd(leader_epoch=None), None),
    ("min ISR 0", pmd(min_insync_replicas=0), "min_insync_replicas_positive"),
    ("min ISR unknown", pmd(min_insync_replicas=None), None),
    ("min ISR 1", pmd(min_insync_replicas=1), None),
    # --- replica sets
    ("ISR not a subset of replicas", pmd(isr=[1, 4]), "isr_subset_of_replicas"),
    ("ISR shrunk (a subset)", pmd(isr=[3]), None),
    ("empty ISR", pmd(isr=[]), None),
    ("ISR equal to replicas in another order", pmd(isr=[3, 1, 2]), None),
    ("replica id -1 in replicas", pmd(replicas=[-1, 2, 3], isr=[2]), "replica_id_not_negative"),
    ("null id in the ISR", pmd(isr=[1, None]), "replica_id_not_negative"),
    ("negative offline replica", pmd(offline_replicas=[-3]), "replica_id_not_negative"),
    ("offline replica listed", pmd(isr=[1, 2], offline_replicas=[3]), None),
    # --- HW vs log start
    ("HW below log start", poff(high_watermark=5, log_start_offset=10, last_stable_offset=5), "hw_not_below_log_start"),
    ("HW equal to log start (empty log)", poff(high_watermark=10, log_start_offset=10, last_stable_offset=10), None),
    ("HW vs log start only for partition_offsets", cfetch(high_watermark=5, log_start_offset=10), None),
    ("LSO above HW is not a rule", poff(last_stable_offset=600), None),
    # --- heartbeat
    ("heartbeat interval 0", hb(interval_ms=0), "interval_positive"),
    ("heartbeat interval negative", hb(interval_ms=-1000), "interval_positive"),
    ("heartbeat dropped -1", hb(events_dropped=-1), "events_dropped_not_negative"),
    ("heartbeat dropped unknown", hb(events_dropped=None), None),
    # --- a field the type does not carry is an ignored extra field
    ("heartbeat with an extra negative HW", hb(high_watermark=-5), None),
    ("group_state with an extra interval 0", env("group_state", group="g", interval_ms=0), None),
    ("partition_offsets with an extra leader -7", poff(leader=-7), None),
    ("metadata_refresh with an extra partition -1", env("metadata_refresh", partition=-1), None),
    # --- the first failed expectation wins (suite order)
    ("partition -1 and HW -1001", poff(partition=-1, high_watermark=-1001), "partition_not_negative"),
    ("sentinel before negative", goff(committed_offset=-1, high_watermark=-5), "offset_sentinel"),
    ("bad seq and bad ISR", pmd(seq=-1, isr=[9]), "seq_not_negative"),
    ("bad ISR and min ISR 0", pmd(isr=[9], min_insync_replicas=0), "isr_subset_of_replicas"),
]


@pytest.mark.parametrize("case, row, expected", TABLE, ids=[c for c, _, _ in TABLE])
def test_rule_alone(case, row, expected):
    """Each case alone in a frame, with the dtypes mapInPandas hands over."""
    assert q.validate_frame(frame(row, spark_dtypes=True)).iloc[0] == expected


@pytest.mark.parametrize("spark_dtypes", [False, True], ids=["object", "spark"])
def test_rules_table_in_one_batch(spark_dtypes):
    """All cases in one frame: one validation, and every reason lands on its own row."""
    df = frame(*[r for _, r, _ in TABLE], spark_dtypes=spark_dtypes)
    got = q.validate_frame(df)
    assert list(got.index) == list(df.index)
    mismatches = [(case, exp, got.iloc[i]) for i, (case, _, exp) in enumerate(TABLE) if got.iloc[i] != exp]
    assert mismatches == []


def test_every_rule_has_a_failing_and_a_passing_case():
    failing = {exp for _, _, exp in TABLE if exp is not None}
    assert failing == set(q.RULES)
    for rule in q.RULES.values():
        assert any(exp is None and row["type"] in rule.types for _, row, exp in TABLE), rule.name


def test_good_rows_stay_untouched():
    df = frame(pmd(), poff(), goff(), cfetch(), hb(), spark_dtypes=True)
    before = df.copy(deep=True)
    assert q.validate_frame(df).isna().all()
    pd.testing.assert_frame_equal(df, before)  # the input is not modified


def test_mixed_batch_maps_reasons_to_the_right_rows_whatever_the_index():
    rows = [pmd(), pmd(isr=[1, 4]), poff(), with_(poff(), reason="malformed_json", high_watermark=-1),
            goff(committed_offset=-5), hb(), hb(interval_ms=0), poff(high_watermark=1, log_start_offset=2,
                                                                      last_stable_offset=1)]
    expected = [None, "isr_subset_of_replicas", None, "malformed_json", "offset_not_negative", None,
                "interval_positive", "hw_not_below_log_start"]
    base = frame(*rows, spark_dtypes=True)
    # a filtered frame (holes in the index), a reversed one, string labels and duplicate labels
    variants = {
        "holes": base.set_axis([3, 10, 11, 40, 41, 42, 90, 91]),
        "reversed": base.set_axis(list(range(7, -1, -1))),
        "strings": base.set_axis([f"r{i}" for i in range(8)]),
        "duplicates": base.set_axis([0, 0, 1, 1, 2, 2, 3, 3]),
        "filtered": pd.concat([frame(hb(), spark_dtypes=True), base]).reset_index(drop=True).iloc[1:],
    }
    for name, df in variants.items():
        reasons = q.validate_frame(df)
        assert list(reasons.index) == list(df.index), name
        # upstream reasons are not re-checked: None from validate_frame
        assert list(reasons) == [None if e == "malformed_json" else e for e in expected], name


def test_unknown_columns_are_ignored_and_the_frame_is_not_modified():
    df = frame(pmd(), pmd(leader=-2), poff(high_watermark=-1001), hb(), spark_dtypes=True)
    df["extra"] = 1.5  # a column the gate does not know
    before = df.copy(deep=True)
    assert list(q.validate_frame(df)) == [None, "leader_not_below_minus_one", "offset_sentinel", None]
    pd.testing.assert_frame_equal(df, before)


def test_empty_frame():
    df = frame(spark_dtypes=True).iloc[0:0]
    assert len(q.validate_frame(df)) == 0


def test_only_upstream_quarantined_rows():
    df = frame(with_(poff(high_watermark=-1), reason="out_of_range"), with_(hb(), reason="missing_field"))
    assert q.validate_frame(df).isna().all()  # not re-checked: their reason stays the upstream one


@pytest.mark.parametrize("null", [None, np.nan, pd.NA], ids=["None", "NaN", "NA"])
def test_all_null_optional_columns(null):
    """Every optional column null in the whole frame (all-null object / float / Int64 columns)."""
    rows = [env("heartbeat", interval_ms=5000), env("partition_offsets", topic="t", partition=1, high_watermark=3),
            env("group_offsets", group="g", topic="t", partition=1), env("partition_metadata", topic="t", partition=2,
                                                                         leader=-1, replicas=[1], isr=[])]
    df = frame(*rows)
    optional = ["leader_epoch", "offline_replicas", "min_insync_replicas", "log_start_offset", "last_stable_offset",
                "committed_offset", "events_dropped"]
    for c in optional:
        df[c] = pd.Series([null] * len(df), dtype=object)
    assert q.validate_frame(df).isna().all()
    for c in optional:
        if c != "offline_replicas":
            df[c] = pd.array([None] * len(df), dtype="Int64")
    assert q.validate_frame(df).isna().all()


def test_missing_columns_are_treated_as_null():
    df = frame(hb(), poff()).drop(columns=["events_dropped", "last_stable_offset", "offline_replicas"])
    assert q.validate_frame(df).isna().all()


def test_suite_is_built_once_per_process():
    q.validate_frame(frame(pmd()))
    g, builds = q._gx(), q.BUILDS
    q.validate_frame(frame(hb(interval_ms=0)))
    q.validate_frame(frame(poff()))
    assert q._gx() is g
    assert q.BUILDS == builds == 1


def test_build_suite_covers_every_rule_in_priority_order():
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = q.build_suite()
    assert isinstance(suite, gx.ExpectationSuite)
    rules = [e.meta["rule"] for e in suite.expectations]
    assert list(dict.fromkeys(rules)) == list(q.RULES)  # every rule, in RULES order
    kinds = {type(e) for e in suite.expectations}
    assert {gxe.ExpectColumnValuesToBeBetween, gxe.ExpectColumnValuesToBeInSet, gxe.ExpectColumnValuesToNotBeInSet,
            gxe.ExpectColumnPairValuesAToBeGreaterThanB} <= kinds
    pair = next(e for e in suite.expectations if e.meta["rule"] == "hw_not_below_log_start")
    assert pair.row_condition is not None  # partition_offsets only


def test_a_value_gx_cannot_evaluate_is_a_gate_error_not_a_verdict():
    """The Spark schema fixes the dtypes; a string in a long column is a code defect, so the
    gate fails loudly instead of quarantining or passing the frame."""
    df = frame(hb())
    df["seq"] = pd.Series(["seven"], dtype=object)
    with pytest.raises(q.QualityGateError, match="seq_not_negative"):
        q.validate_frame(df)


def test_pair_membership_is_exact_for_large_broker_ids():
    """ISR ⊆ replicas packs (row, id) pairs into one int64 key, or complex numbers when that
    could overflow; both paths give the same answer."""
    rows = np.array([0, 0, 1, 1])
    ids = np.array([5.0, 7.0, 5.0, np.nan])
    in_rows, in_ids = np.array([0, 0, 1]), np.array([5.0, 7.0, 6.0])
    assert list(q._pairs_in(rows, ids, in_rows, in_ids)) == [True, True, False, False]
    # ids 0..2**52 over 2,001 rows: row * span + id could overflow int64 -> the complex path
    rows, in_rows = np.array([0, 0, 2000, 2000]), np.array([0, 0, 2000])
    ids, in_ids = np.array([5.0, 2.0 ** 52, 5.0, np.nan]), np.array([5.0, 2.0 ** 52, 6.0])
    assert list(q._pairs_in(rows, ids, in_rows, in_ids)) == [True, True, False, False]
    assert list(q.validate_frame(frame(pmd(replicas=[2**31 - 1, 0], isr=[2**31 - 1]),
                                       pmd(replicas=[2**31 - 1, 0], isr=[2**31 - 2])))) == [None, "isr_subset_of_replicas"]
