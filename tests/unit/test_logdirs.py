"""Log dirs without a cluster (issue 48, in progress): a DescribeLogDirs answer as kafka-python
3.0.12 gives it (its shape recorded from Kafka 4.1.1) becomes one log_dir_state per dir; an
offline dir names what it held when last online."""

from __future__ import annotations

from monitor.contract import Event, LogDirState
from monitor.logdirs import MAX_NAMED, log_dir_states


def dir_(path, parts=(), error_code=0, total=1000, usable=400, future=()):
    topics = {}
    for name, idx, size in parts:
        topics.setdefault(name, []).append({"partition_index": idx, "partition_size": size, "offset_lag": 0,
                                            "is_future_key": (name, idx) in future})
    d = {"error_code": error_code, "log_dir": path, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
    if error_code:
        d.update(total_bytes=-1, usable_bytes=-1, topics=[])
    else:
        d.update(total_bytes=total, usable_bytes=usable)
    return d


def test_online_dirs_count_their_replicas_and_an_offline_one_names_what_it_held():
    held: dict = {}
    first = log_dir_states([{"broker": 1, "log_dirs": [dir_("/d1", [("fill", 0, 85), ("fill", 2, 77)]),
                                                       dir_("/d2", [("fill", 1, 300), ("fill", 3, 90)])]}], held)
    assert [(s.log_dir, s.online, s.held_replicas, s.held_bytes, s.held_partitions) for s in first] == [
        ("/d1", True, 2, 162, ["fill-0", "fill-2"]), ("/d2", True, 2, 390, ["fill-1", "fill-3"])]
    assert (first[0].total_bytes, first[0].usable_bytes) == (1000, 400)
    later = log_dir_states([{"broker": 1, "log_dirs": [dir_("/d1", [("fill", 0, 90), ("fill", 2, 80)]),
                                                       dir_("/d2", error_code=56)]}], held)
    off = later[1]
    assert (off.online, off.error, off.total_bytes, off.usable_bytes) == (False, "KAFKA_STORAGE_ERROR", None, None)
    assert (off.held_replicas, off.held_partitions) == (2, ["fill-1", "fill-3"])
    e = Event.of(off, cluster="k", source="p", seq=0, observed_at=1)
    assert e.schema == "kafka-monitor/v2" and e.key() == "k/1//d2" and Event.from_json(e.to_json()) == e


def test_names_are_bounded_and_moving_replicas_counted_apart():
    held: dict = {}
    parts = [("t", i, i) for i in range(MAX_NAMED + 50)]
    (s,) = log_dir_states([{"broker": 2, "log_dirs": [dir_("/d", parts, future={("t", 0)})]}], held)
    assert s.held_replicas == MAX_NAMED + 49 and len(s.held_partitions) == MAX_NAMED and s.moving_replicas == 1
    assert s.held_partitions[0] == f"t-{MAX_NAMED + 49}"  # the largest first
    assert isinstance(s, LogDirState)


class FakeAdmin:
    def __init__(self, answers):
        self.answers = list(answers)

    def describe_log_dirs(self):
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    def close(self):
        pass


def test_the_watcher_hands_each_answer_over_once_and_keeps_what_an_offline_dir_held():
    from monitor.logdirs import LogDirWatcher

    fake = FakeAdmin([[{"broker": 1, "log_dirs": [dir_("/d2", [("fill", 1, 300)])]}], ConnectionError("gone"),
                      [{"broker": 1, "log_dirs": [dir_("/d2", error_code=56)]}]])
    made = []
    w = LogDirWatcher({}, interval_s=1, timeout_s=1, admin_factory=lambda: made.append(1) or fake)
    assert w.ask(10) is not None and w.take()[0] == 10 and w.take() is None
    assert w.ask(20) is None and w.failures == 1 and "gone" in w.last_error
    (off,) = w.ask(30)
    assert (off.online, off.held_partitions) == (False, ["fill-1"]) and len(made) == 2
