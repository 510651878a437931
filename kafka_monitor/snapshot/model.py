"""What a snapshot holds: panels of series, timelines and tables, and the ``Snapshot``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Optional, TypeVar

from kafka_monitor.snapshot.prometheus import Series

T = TypeVar("T")


@dataclass
class Panel(Generic[T]):
    """What one panel shows: its rows (series of a chart, rows of a timeline or a table), at
    most the cap of ``total`` (ranked on the server), or the error of its query."""
    rows: list[T] = field(default_factory=list)
    total: int = 0
    error: Optional[str] = None

    @property
    def left_out(self) -> int:
        return max(0, self.total - len(self.rows))


@dataclass
class Segment:
    start: float
    end: float
    state: str  # alert: active | pending | firing; job: up | down
    open: bool  # still in this state at the end of the range


@dataclass
class Row:
    labels: dict[str, str]
    segments: list[Segment]

    @property
    def open_segment(self) -> Optional[Segment]:
        return self.segments[-1] if self.segments and self.segments[-1].open else None


Chart = Panel[Series]
Timeline = Panel[Row]
Table = Panel[dict[str, Any]]


@dataclass
class Snapshot:
    url: str
    version: Optional[str]
    start: float
    end: float
    step: float
    generated: float
    filters: dict[str, list[str]]
    top: int
    rows: int
    queries: list[tuple[str, str]] = field(default_factory=list)  # (what, PromQL)
    lag_chart: Chart = field(default_factory=Chart)
    lag_groups: Table = field(default_factory=Table)
    lag_partitions: Table = field(default_factory=Table)
    lagging_partitions: Optional[int] = None
    urp_chart: Chart = field(default_factory=Chart)
    replication: Table = field(default_factory=Table)
    partitions_total: Optional[int] = None
    urp_total: Optional[int] = None
    offline_total: Optional[int] = None
    alert_timeline: Timeline = field(default_factory=Timeline)
    alerts_open: Optional[int] = None
    prom_alert_timeline: Timeline = field(default_factory=Timeline)
    prom_alerts_firing: Optional[int] = None
    job_timeline: Timeline = field(default_factory=Timeline)
    batch_age_chart: Chart = field(default_factory=Chart)
    batch_age_now: Optional[float] = None
    job_up_now: Optional[list[float]] = None
    batches_in_range: Optional[float] = None
    quarantine_chart: Chart = field(default_factory=Chart)
    quarantined: Table = field(default_factory=Table)
    heartbeats: Table = field(default_factory=Table)
    refused_in_range: Optional[float] = None
    health_error: Optional[str] = None

    @property
    def errors(self) -> list[str]:
        parts: list[Any] = [self.lag_chart, self.lag_groups, self.lag_partitions, self.urp_chart, self.replication,
                 self.alert_timeline, self.prom_alert_timeline, self.job_timeline, self.batch_age_chart,
                 self.quarantine_chart, self.quarantined, self.heartbeats]
        return [p.error for p in parts if p.error] + ([self.health_error] if self.health_error else [])
