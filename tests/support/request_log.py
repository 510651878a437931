"""What clients asked of a real cluster, read from its brokers' request logs
(``KafkaCluster.set_request_log``): each completed request's client id, API and request body.

``asked(cluster, clients)`` after a window that ``RequestWindow`` opened and closed: per client
(a probe's ``-X client.id``), the partitions in its ListOffsets requests, the topics it named in
Metadata requests and how many asked for every topic, the groups it described, and its requests
per API."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

PREFIX = "Completed request:"


@dataclass
class Asked:
    """What one client asked in the window."""

    requests: Counter = field(default_factory=Counter)
    list_offsets: set = field(default_factory=set)  # (topic, partition)
    metadata_named: set = field(default_factory=set)  # topics
    metadata_whole: int = 0  # Metadata requests for every topic
    groups_described: set = field(default_factory=set)  # DescribeGroups and ConsumerGroupDescribe
    broker_configs: int = 0  # DescribeConfigs of a broker's configuration (resource type 4)


class RequestWindow:
    """The brokers' request logs between ``open()`` and ``close()``: the logger turned on, and
    the files read from where they ended when it was."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.files: list[Path] = cluster.request_log_files()
        self.at: dict[Path, int] = {}
        self.until: dict[Path, int] = {}

    def open(self) -> "RequestWindow":
        self.at = {f: f.stat().st_size if f.exists() else 0 for f in self.files}
        self.cluster.set_request_log(True)
        return self

    def close(self) -> None:
        self.cluster.set_request_log(False)
        self.until = {f: f.stat().st_size if f.exists() else 0 for f in self.files}

    def requests(self) -> Iterator[dict]:
        for f in self.files:
            if not f.exists():
                continue
            with open(f, "rb") as fh:
                fh.seek(self.at.get(f, 0))
                data = fh.read(self.until.get(f, f.stat().st_size) - self.at.get(f, 0))
            for raw in data.splitlines():
                line = raw.decode("utf-8", "replace")
                if line.startswith(PREFIX):
                    try:
                        yield json.loads(line[len(PREFIX):])
                    except ValueError:  # a line cut by the window's end
                        continue

    def asked(self, clients: list[str]) -> dict[str, Asked]:
        out = {c: Asked() for c in clients}
        for r in self.requests():
            head = r.get("requestHeader") or {}
            who = out.get(head.get("clientId"))
            if who is None:
                continue
            api, body = head.get("requestApiKeyName"), r.get("request") or {}
            who.requests[api] += 1
            if api == "LIST_OFFSETS":
                who.list_offsets |= {(t["name"], p["partitionIndex"]) for t in body.get("topics") or []
                                     for p in t.get("partitions") or []}
            elif api == "METADATA":
                if body.get("topics") is None:
                    who.metadata_whole += 1
                else:
                    who.metadata_named |= {t.get("name") for t in body["topics"]}
            elif api == "DESCRIBE_GROUPS":
                who.groups_described |= set(body.get("groups") or [])
            elif api == "CONSUMER_GROUP_DESCRIBE":
                who.groups_described |= set(body.get("groupIds") or [])
            elif api == "DESCRIBE_CONFIGS":
                who.broker_configs += sum(1 for r in body.get("resources") or [] if r.get("resourceType") == 4)
        return out
