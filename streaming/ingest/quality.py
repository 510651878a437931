"""The quality gate: the event contract's value rules as a great-expectations (GX Core 1.x)
suite, run on the rows ``parsing.parse_values`` decoded; a row that fails gets the name of the
first rule it fails as its ``reason`` and goes to the counted quarantine.

API: ``build_suite()`` (the rules as a ``gx.ExpectationSuite``, each expectation's
``meta["rule"]`` is the reason it gives), ``validate_frame(pdf)`` (a Series of reasons aligned
with ``pdf.index``; None for a good row or one that already has a reason), ``RULES`` (rule
name -> ``Rule``, in priority order), ``warm_up()`` (build the per-process GX objects now),
``QualityGateError`` (GX could not evaluate a rule: a code defect, never a bad event).
How GX is used and what it costs: docs/ingest.md.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd

from monitor.contract import EVENT_TYPES, KAFKA_OFFSET_SENTINELS, PAYLOADS

# ---------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------


def _field_types() -> dict[str, tuple[str, ...]]:
    """payload field -> the event types whose payload has it (from the contract's classes)."""
    out: dict[str, list[str]] = {}
    for etype, (cls, _) in PAYLOADS.items():
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, []).append(etype)
    return {k: tuple(v) for k, v in out.items()}


#: payload field -> event types that carry it.  parse() flattens the union of all payloads, so
#: the frame GX sees keeps a payload column's value only on rows whose type has that field
#: (the contract's "unknown extra fields are ignored", applied to the flat frame).
FIELD_TYPES = _field_types()
#: event types that carry a partition (and a topic)
PARTITION_TYPES = FIELD_TYPES["partition"]
#: row types parse() derives from an event (not event types): one row per partition-count change
#: a metadata refresh reports.  They pass ``type_known``; no payload rule applies to them.
DERIVED_ROW_TYPES = ("partition_count_change",)
KNOWN_ROW_TYPES = tuple(EVENT_TYPES) + DERIVED_ROW_TYPES
OFFSET_COLUMNS = ("high_watermark", "log_start_offset", "last_stable_offset", "committed_offset")
#: event time bounds, epoch ms: [1, 2100-01-01T00:00:00Z)
OBSERVED_AT_MIN = 1
OBSERVED_AT_MAX = 4_102_444_800_000

#: the columns of parse()'s output the gate reads; any other column passes through untouched
ENVELOPE_COLUMNS = ("type", "seq", "observed_at")
#: payload columns of parse()'s output the rules read (everything else never reaches GX)
PAYLOAD_COLUMNS = ("partition", "leader", "leader_epoch", "min_insync_replicas") + OFFSET_COLUMNS + (
    "interval_ms", "events_dropped")
ARRAY_COLUMNS = ("replicas", "isr", "offline_replicas")
#: the columns the gate reads
INPUT_COLUMNS = ("reason", *ENVELOPE_COLUMNS, *PAYLOAD_COLUMNS, *ARRAY_COLUMNS)


@dataclass(frozen=True)
class Rule:
    name: str                 # the reason a failing row gets (a metric label: short, stable)
    types: tuple[str, ...]    # event types it applies to
    text: str                 # the rule in words


def _types(*fields: str) -> tuple[str, ...]:
    return tuple(t for t in EVENT_TYPES if any(t in FIELD_TYPES[f] for f in fields))


def _rules() -> list[Rule]:
    return [
        Rule("type_known", KNOWN_ROW_TYPES, f"type is an event type ({', '.join(EVENT_TYPES)}) "
                                            f"or a row type parse() derives ({', '.join(DERIVED_ROW_TYPES)})"),
        Rule("seq_not_negative", KNOWN_ROW_TYPES, "seq >= 0"),
        Rule("observed_at_in_range", KNOWN_ROW_TYPES,
             f"{OBSERVED_AT_MIN} <= observed_at < {OBSERVED_AT_MAX} (epoch ms, < 2100-01-01; catches s/us/ns mix-ups)"),
        Rule("partition_not_negative", PARTITION_TYPES, "partition >= 0"),
        Rule("offset_sentinel", _types(*OFFSET_COLUMNS),
             "no offset is -1 or -1001 (Kafka's 'no offset' sentinels must have become null upstream)"),
        Rule("offset_not_negative", _types(*OFFSET_COLUMNS),
             "high_watermark, log_start_offset, last_stable_offset, committed_offset: >= 0 when not null"),
        Rule("leader_not_below_minus_one", _types("leader"), "leader >= -1 (-1 = no leader)"),
        Rule("leader_epoch_not_negative", _types("leader_epoch"), "leader_epoch >= 0 when not null"),
        Rule("replica_id_not_negative", ("partition_metadata",),
             "every broker id in replicas, isr and offline_replicas is non-null and >= 0"),
        Rule("isr_subset_of_replicas", ("partition_metadata",), "every ISR member is one of the replicas"),
        Rule("min_insync_replicas_positive", _types("min_insync_replicas"), "min_insync_replicas >= 1 when not null"),
        Rule("hw_not_below_log_start", ("partition_offsets",), "high_watermark >= log_start_offset when both known"),
        Rule("interval_positive", _types("interval_ms"), "interval_ms > 0"),
        Rule("events_dropped_not_negative", _types("events_dropped"), "events_dropped >= 0"),
    ]


#: rule name -> Rule, in priority order (the first rule a row fails is its reason)
RULES: dict[str, Rule] = {r.name: r for r in _rules()}


def _only(*types: str) -> dict:
    """A GX row condition restricting an expectation to rows of these event types."""
    from great_expectations.expectations.row_conditions import Column

    return {"row_condition": Column("type") == types[0] if len(types) == 1 else Column("type").is_in(list(types))}


def _expectations() -> list[Any]:
    """The suite's expectations in priority order; each carries ``meta["rule"]`` (the reason).

    Type scoping: most rules read a payload column, and the frame GX sees has that column only
    on rows whose type carries the field (null elsewhere, and GX's column-map expectations skip
    nulls), so they need no row condition.  The rules that must see a null, or that read a field
    more than one type carries but apply to one type only, use a GX row condition."""
    import great_expectations.expectations as gxe

    out: list[Any] = []

    def add(rule: str, exp: Any) -> None:
        assert rule in RULES, rule
        exp.meta = {"rule": rule}
        out.append(exp)

    add("type_known", gxe.ExpectColumnValuesToBeInSet(column="type", value_set=list(KNOWN_ROW_TYPES)))
    add("seq_not_negative", gxe.ExpectColumnValuesToBeBetween(column="seq", min_value=0))
    add("observed_at_in_range", gxe.ExpectColumnValuesToBeBetween(
        column="observed_at", min_value=OBSERVED_AT_MIN, max_value=OBSERVED_AT_MAX, strict_max=True))
    add("partition_not_negative", gxe.ExpectColumnValuesToBeBetween(column="partition", min_value=0))
    for col in OFFSET_COLUMNS:
        add("offset_sentinel", gxe.ExpectColumnValuesToNotBeInSet(column=col, value_set=sorted(KAFKA_OFFSET_SENTINELS)))
    for col in OFFSET_COLUMNS:
        add("offset_not_negative", gxe.ExpectColumnValuesToBeBetween(column=col, min_value=0))
    add("leader_not_below_minus_one", gxe.ExpectColumnValuesToBeBetween(column="leader", min_value=-1))
    add("leader_epoch_not_negative", gxe.ExpectColumnValuesToBeBetween(column="leader_epoch", min_value=0))
    add("replica_id_not_negative", gxe.ExpectColumnValuesToBeInSet(column="_replica_ids_valid", value_set=[True]))
    add("isr_subset_of_replicas", gxe.ExpectColumnValuesToBeInSet(column="_isr_subset_of_replicas", value_set=[True]))
    add("min_insync_replicas_positive", gxe.ExpectColumnValuesToBeBetween(column="min_insync_replicas", min_value=1))
    add("hw_not_below_log_start", gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A="high_watermark", column_B="log_start_offset", or_equal=True,
        ignore_row_if="either_value_is_missing", **_only("partition_offsets")))
    add("interval_positive", gxe.ExpectColumnValuesToBeBetween(column="interval_ms", min_value=0, strict_min=True))
    add("events_dropped_not_negative", gxe.ExpectColumnValuesToBeBetween(column="events_dropped", min_value=0))
    return out


def build_suite(name: str = "kafka-monitor-contract-v1") -> Any:
    """The contract's value rules as a GX ExpectationSuite, in priority order (a row's reason is
    the rule of the first expectation it fails).  Every expectation's ``meta["rule"]`` is the
    reason; several expectations may share one rule (e.g. one per offset column)."""
    import great_expectations as gx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        suite = gx.ExpectationSuite(name=name)
        for e in _expectations():
            suite.add_expectation(e)
    return suite


# ---------------------------------------------------------------------------------------------
# The GX objects, once per process
# ---------------------------------------------------------------------------------------------


def _import_gx() -> Any:
    """``import great_expectations``, safe under ``python -c``.

    GX imports ``pyspark.sql.connect``, whose dependency check takes a ``__main__`` without
    ``__spec__`` and ``__file__`` (``python -c``, ``python - < script``) for a doctest run and
    calls ``sys.exit(0)`` when Spark Connect's extras (grpc) are missing: the interpreter would
    stop silently with status 0.  Looking interactive (``sys.ps1``) for the duration of the
    import skips that branch; Spark's Python workers (``-m pyspark.daemon``) never hit it."""
    main = sys.modules.get("__main__")
    shim = (main is not None and getattr(main, "__spec__", None) is None and not hasattr(main, "__file__")
            and not hasattr(sys, "ps1"))
    if shim:
        sys.ps1 = ""
    try:
        import great_expectations as gx
    finally:
        if shim:
            del sys.ps1
    return gx


class _Gx:
    """Context, batch definition and suite; one per process (see ``_gx()``)."""

    def __init__(self) -> None:
        t0 = time.perf_counter()
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        gx = _import_gx()
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.import_s = time.perf_counter() - t0
        self.context = gx.get_context(mode="ephemeral")
        self.context.config.analytics_enabled = False
        # tqdm bars on a worker's stderr for every batch would flood the executor logs
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        source = self.context.data_sources.add_pandas("kafka-monitor-quality")
        asset = source.add_dataframe_asset("events")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("micro-batch")
        self.suite = self.context.suites.add(build_suite())
        self.expectations = list(self.suite.expectations)
        self.rules = [e.meta["rule"] for e in self.expectations]
        #: rule -> rank of its first expectation (lower = checked first = wins)
        self.priority: dict[str, int] = {}
        for i, rule in enumerate(self.rules):
            self.priority.setdefault(rule, i)
        self._pos = {e.id: i for i, e in enumerate(self.expectations)}
        self.build_s = time.perf_counter() - t0

    def position(self, result: Any, fallback: int) -> int:
        """Position in the suite of the expectation a result belongs to."""
        return self._pos.get(getattr(result.expectation_config, "id", None), fallback)

    def batch(self, frame: pd.DataFrame) -> Any:
        """A GX batch over ``frame`` (GX hashes the frame for the batch id: get it once per frame)."""
        return self.batch_definition.get_batch(batch_parameters={"dataframe": frame})

    def validate(self, frame: Any, expect: Any, result_format: Any) -> Any:
        batch = frame if not isinstance(frame, pd.DataFrame) else self.batch(frame)
        return batch.validate(expect, result_format=result_format)


_GX: Optional[_Gx] = None
_GX_LOCK = threading.Lock()
#: how many times the GX objects were built in this process (the cache makes it 1)
BUILDS = 0


def _gx() -> _Gx:
    global _GX, BUILDS
    if _GX is None:
        with _GX_LOCK:
            if _GX is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _GX = _Gx()
                BUILDS += 1
    return _GX


def warm_up() -> dict:
    """Build the cached GX objects now (e.g. once per Python worker) and say what it cost."""
    g = _gx()
    return {"import_s": g.import_s, "build_s": g.build_s}


# ---------------------------------------------------------------------------------------------
# Derived columns (vectorised)
# ---------------------------------------------------------------------------------------------


def _flatten(col: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An array column -> (null mask per row, row position of each element, elements as float64
    with NaN for a null or non-numeric element).  A null array contributes no elements."""
    vals = col.to_numpy(dtype=object)
    null = pd.isna(vals)
    present = vals[~null]
    if present.size == 0:
        return null, np.empty(0, np.int64), np.empty(0, np.float64)
    lens = np.zeros(len(vals), dtype=np.int64)
    lens[~null] = np.fromiter(map(len, present), dtype=np.int64, count=present.size)
    if lens.sum() == 0:
        return null, np.empty(0, np.int64), np.empty(0, np.float64)
    elems = np.concatenate([np.asarray(v) for v in present])
    if elems.dtype.kind not in "iuf":  # nulls inside an array, or garbage: NaN
        elems = pd.to_numeric(pd.Series(elems, dtype=object), errors="coerce").to_numpy(np.float64)
    rows = np.repeat(np.arange(len(vals), dtype=np.int64), lens)
    return null, rows, elems.astype(np.float64, copy=False)


def _pairs_in(rows: np.ndarray, ids: np.ndarray, in_rows: np.ndarray, in_ids: np.ndarray) -> np.ndarray:
    """For each (rows[k], ids[k]): does that pair occur among (in_rows, in_ids)?  NaN ids never
    match.  Pairs are packed into one int64 key (row * span + id) when that cannot overflow,
    which keeps ``np.isin`` on integers (fast); otherwise into complex numbers (exact below 2**53)."""
    valid = ~np.isnan(ids)
    in_valid = ~np.isnan(in_ids)
    ok = np.zeros(len(ids), dtype=bool)
    if not valid.any() or not in_valid.any():
        return ok
    lo = min(ids[valid].min(), in_ids[in_valid].min())
    hi = max(ids[valid].max(), in_ids[in_valid].max())
    span = hi - lo + 1
    n_rows = max(rows.max(initial=0), in_rows.max(initial=0)) + 1
    if span * n_rows < 2**62:
        span_i, lo_i = int(span), int(lo)
        a = rows[valid] * span_i + (ids[valid].astype(np.int64) - lo_i)
        b = in_rows[in_valid] * span_i + (in_ids[in_valid].astype(np.int64) - lo_i)
    else:
        a = rows[valid] + 1j * ids[valid]
        b = in_rows[in_valid] + 1j * in_ids[in_valid]
    ok[valid] = np.isin(a, b)
    return ok


def _derive(arrays: pd.DataFrame, applies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The derived columns of the set-valued rules, as object arrays of True / False / None
    (None = the rule does not apply to the row; GX skips nulls):

    * ``_replica_ids_valid``: every id in replicas, isr, offline_replicas is non-null and >= 0;
    * ``_isr_subset_of_replicas``: every ISR id occurs among the row's replicas.

    Vectorised: the arrays are flattened once (numpy), and ISR ⊆ replicas becomes one
    ``np.isin`` over (row, broker id) pairs.  ``applies`` marks the partition_metadata rows."""
    n = len(arrays)
    ids_valid = np.full(n, None, dtype=object)
    subset = np.full(n, None, dtype=object)
    idx = np.flatnonzero(applies)
    if idx.size == 0:
        return ids_valid, subset
    m = idx.size
    flat = {}
    bad_id = np.zeros(m, dtype=bool)
    for c in ARRAY_COLUMNS:
        col = arrays[c].iloc[idx] if c in arrays.columns else pd.Series(np.full(m, None, dtype=object))
        null, rows, elems = _flatten(col)
        flat[c] = (null, rows, elems)
        bad = np.isnan(elems) | (elems < 0)
        if bad.any():
            bad_id[np.unique(rows[bad])] = True
    ids_valid[idx] = ~bad_id
    r_null, r_rows, r_ids = flat["replicas"]
    i_null, i_rows, i_ids = flat["isr"]
    outside = np.zeros(m, dtype=bool)
    if i_rows.size:
        ok = _pairs_in(i_rows, i_ids, r_rows, r_ids)
        if not ok.all():
            outside[np.unique(i_rows[~ok])] = True
    res = (~outside).astype(object)
    res[r_null | i_null] = None  # a missing array is parse()'s missing_field, not this rule's
    subset[idx] = res
    return ids_valid, subset


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

_COMPLETE = {"result_format": "COMPLETE", "partial_unexpected_count": 0, "include_unexpected_rows": False,
             "return_unexpected_index_query": False}


def _numeric(col: pd.Series) -> pd.Series:
    """A numeric column as float64 (null -> NaN), whatever it arrived as: PySpark 4's
    ``mapInPandas`` hands bigint columns over as nullable ``Int64`` (``int64`` when the batch has
    no null), hand-made frames as object columns of ints.  GX then always compares floats; sign,
    sentinel and order checks are exact below 2**53.  A non-numeric value is left as it is (GX
    cannot evaluate it: ``QualityGateError``)."""
    if col.dtype == np.float64:
        return col
    try:
        return pd.to_numeric(col, errors="raise").astype(np.float64)
    except (TypeError, ValueError):
        return col


def _narrow(pdf: pd.DataFrame, pos: np.ndarray) -> pd.DataFrame:
    """The frame GX sees: candidate rows only, index 0..n-1 (positions among the candidates);
    envelope columns; payload columns kept only on rows whose type carries the field; derived
    columns for the set-valued rules.  The raw text and the array columns never reach GX."""
    n = len(pos)
    everything = n == len(pdf)

    def column(c: str) -> pd.Series:
        if c not in pdf.columns:  # absent input: all null
            return pd.Series(np.full(n, None, dtype=object))
        v = pdf[c]
        return (v if everything else v.iloc[pos]).reset_index(drop=True)

    cols: dict[str, Any] = {}
    types = column("type").astype(object)
    cols["type"] = types
    for c in ("seq", "observed_at"):
        cols[c] = _numeric(column(c))
    # per-row type code (-1 = unknown type) and, per payload field, which codes carry it
    codes = pd.Categorical(types, categories=list(EVENT_TYPES)).codes
    for c in PAYLOAD_COLUMNS:
        lut = np.array([t in FIELD_TYPES[c] for t in EVENT_TYPES] + [False])
        carried = lut[codes]  # code -1 indexes the trailing False
        cols[c] = _numeric(column(c)).where(carried)
    arrays = pd.DataFrame({c: column(c) for c in ARRAY_COLUMNS})
    ids_valid, subset = _derive(arrays, codes == EVENT_TYPES.index("partition_metadata"))
    cols["_replica_ids_valid"] = ids_valid
    cols["_isr_subset_of_replicas"] = subset
    return pd.DataFrame(cols, index=pd.RangeIndex(n))


def validate_frame(pdf: pd.DataFrame) -> pd.Series:
    """Reasons for ``pdf``'s rows, aligned with ``pdf.index``: the ``meta.rule`` of the first
    expectation (suite order) a row fails, or None for a good row.  Only rows whose upstream
    ``reason`` is null are checked; the others get None here (they keep their own reason)."""
    n = len(pdf)
    out = np.full(n, None, dtype=object)
    if n:
        cand = pdf["reason"].isna().to_numpy() if "reason" in pdf.columns else np.ones(n, bool)
        pos = np.flatnonzero(cand)
        if pos.size:
            reasons = _validate_narrow(_narrow(pdf, pos))
            out[pos] = reasons
    return pd.Series(out, index=pdf.index, dtype=object, name="reason")


#: what the last validation in this process did (for the bench and the tests)
LAST: dict[str, Any] = {}


class QualityGateError(RuntimeError):
    """GX could not evaluate an expectation (a code defect, e.g. an unexpected dtype)."""


def _raised(result: Any) -> Optional[str]:
    """The exception message if evaluating this expectation raised, else None.  GX 1.x puts
    either {raised_exception, exception_message} or {metric id: {...}} in exception_info."""
    info = result.exception_info or {}
    items = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for it in items:
        if it.get("raised_exception"):
            return str(it.get("exception_message"))
    return None


def _validate_narrow(frame: pd.DataFrame) -> np.ndarray:
    g = _gx()
    n = len(frame)
    reasons = np.full(n, None, dtype=object)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = g.batch(frame)
        first = g.validate(batch, g.suite, "BOOLEAN_ONLY")
        t1 = time.perf_counter()
        failed = sorted(g.position(r, i) for i, r in enumerate(first.results) if not r.success)
        LAST.clear()
        LAST.update(rows=n, pass1_s=t1 - t0, failed_expectations=len(failed), pass2_s=0.0)
        if not failed:
            return reasons
        for i, r in enumerate(first.results):
            err = _raised(r)
            if err is not None:
                raise QualityGateError(f"great-expectations could not evaluate rule {g.rules[g.position(r, i)]}: {err}")
        # pass 2: only the failed expectations, with the row indices
        import great_expectations as gx

        sub = gx.ExpectationSuite(name="failed", expectations=[copy.copy(g.expectations[i]) for i in failed])
        second = g.validate(batch, sub, _COMPLETE)
        LAST["pass2_s"] = time.perf_counter() - t1
    # first failure wins: write the rules from the lowest priority to the highest, so that the
    # earliest expectation's rule is the one left on a row that fails several
    hits = []
    for r in second.results:
        rule = r.expectation_config.meta["rule"]
        idx = r.result.get("unexpected_index_list")
        if idx is None:
            raise QualityGateError(f"great-expectations returned no unexpected_index_list for {rule}")
        hits.append((g.priority[rule], rule, idx))
    for _, rule, idx in sorted(hits, key=lambda h: h[0], reverse=True):
        if len(idx):
            reasons[np.asarray(idx, dtype=np.int64)] = rule
    return reasons
