"""A fake Kafka broker that answers only what ``monitor.elr`` asks, in a process of its own.

librdkafka's mock cluster (``bench/mock_cluster_server.py``) has no DescribeTopicPartitions (API
key 75) and no finalized features, and a real Kafka with 100,000 partitions does not fit a
2-core machine; this broker is enough of one for kafka-python's ``KafkaAdminClient``:

- ApiVersions (0-4): advertises only the three APIs below; at v3+ the finalized feature
  ``eligible.leader.replicas.version`` = 1 (kafka-python's ``describe_features()`` is an
  ApiVersions v3+ request);
- Metadata (0-12): one broker, this one (node 1), and no topics;
- DescribeTopicPartitions (0): ``--topics`` topics ``<prefix>00000`` .. of ``--partitions``
  partitions each, replicas [1, 2, 3]; every ``--unhealthy-every``-th partition (counted over all
  topics) has ISR [1] and eligible leader replicas [2, 3], the others a full ISR and an empty
  ELR.  Topics in name order; ``response_partition_limit`` (at most 2,000, Kafka's
  ``max.request.partition.size.limit``) and the cursor are honoured as Kafka's broker does: a
  topic cut by the limit gives the next partition as the next cursor, a limit used up at a
  topic's end gives the next topic's partition 0.

Requests are decoded and answers encoded with kafka-python's own protocol classes.  The answers
to a sweep (all topics, from no cursor, at ``--page`` partitions a request) are encoded once at
start; any other answer once, the first time it is asked.  So the broker costs little per
request and a sweep's time is the client's.

    python bench/dtp_broker.py --topics 1000 --partitions 100     # 100,000 partitions

Prints one line ``BOOTSTRAP 127.0.0.1:<port>`` on stdout when its answers are ready, then serves
until it is killed (SIGTERM/SIGINT) or its stdin is closed.  Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import signal
import socket
import socketserver
import struct
import sys
import threading
import uuid
from typing import Any, Optional

from kafka.protocol.admin import DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

ELR_FEATURE = "eligible.leader.replicas.version"
NODE_ID = 1
REPLICAS = [1, 2, 3]
SERVER_PARTITION_LIMIT = 2000  # Kafka's max.request.partition.size.limit default
UNKNOWN_TOPIC_OR_PARTITION = 3
UNSUPPORTED_VERSION = 35

#: api key -> (request class, response class, lowest, highest version served)
APIS: dict[int, tuple[Any, Any, int, int]] = {
    ApiVersionsRequest.API_KEY: (ApiVersionsRequest, ApiVersionsResponse, 0, 4),
    MetadataRequest.API_KEY: (MetadataRequest, MetadataResponse, 0, 12),
    DescribeTopicPartitionsRequest.API_KEY: (DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, 0, 0),
}

_Topic = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
_Partition = _Topic.DescribeTopicPartitionsResponsePartition
_Cursor = DescribeTopicPartitionsResponse.Cursor


def topic_name(prefix: str, i: int) -> str:
    return f"{prefix}{i:05d}"


def unhealthy(topic_index: int, partition: int, partitions: int, every: int) -> bool:
    """Whether a partition has ISR [1] and ELR [2, 3] (the others are fully in sync)."""
    return every > 0 and (topic_index * partitions + partition) % every == 0


class Cluster:
    """The topics and the encoded DescribeTopicPartitions answers (response bodies, no header)."""

    def __init__(self, prefix: str, topics: int, partitions: int, every: int) -> None:
        self.prefix, self.partitions, self.every = prefix, partitions, every
        self.names = [topic_name(prefix, i) for i in range(topics)]  # in name order (zero-padded)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.ids = {n: uuid.uuid5(uuid.NAMESPACE_URL, f"kafka-monitor-bench/{n}") for n in self.names}
        self._bodies: dict[tuple, bytes] = {}
        self._lock = threading.Lock()
        self.served = 0

    def _partition(self, ti: int, p: int) -> Any:
        if unhealthy(ti, p, self.partitions, self.every):
            isr, elr = [1], [2, 3]
        else:
            isr, elr = list(REPLICAS), []
        return _Partition(error_code=0, partition_index=p, leader_id=1, leader_epoch=7, replica_nodes=list(REPLICAS),
                          isr_nodes=isr, eligible_leader_replicas=elr, last_known_elr=[], offline_replicas=[])

    def page(self, topics: tuple[str, ...], limit: int, cursor: Optional[tuple[str, int]]) -> Any:
        """The answer as Kafka's broker gives it (see the module's docstring)."""
        names = sorted(set(topics)) if topics else self.names
        if cursor is not None:
            names = [n for n in names if n >= cursor[0]]
        remaining = max(1, min(limit, SERVER_PARTITION_LIMIT))
        out, next_cursor = [], None
        for name in names:
            if remaining <= 0:
                next_cursor = _Cursor(topic_name=name, partition_index=0)
                break
            ti = self.index.get(name)
            if ti is None:
                out.append(_Topic(error_code=UNKNOWN_TOPIC_OR_PARTITION, name=name, topic_id=uuid.UUID(int=0),
                                  is_internal=False, partitions=[], topic_authorized_operations=-2147483648))
                continue
            first = cursor[1] if cursor is not None and name == cursor[0] else 0
            last = min(self.partitions, first + remaining)
            out.append(_Topic(error_code=0, name=name, topic_id=self.ids[name], is_internal=False,
                              partitions=[self._partition(ti, p) for p in range(first, last)],
                              topic_authorized_operations=-2147483648))
            remaining -= last - first
            if last < self.partitions:
                next_cursor = _Cursor(topic_name=name, partition_index=last)
                break
        return DescribeTopicPartitionsResponse(version=0, throttle_time_ms=0, topics=out, next_cursor=next_cursor)

    def body(self, topics: tuple[str, ...], limit: int, cursor: Optional[tuple[str, int]]) -> bytes:
        key = (topics, limit, cursor)
        with self._lock:
            body = self._bodies.get(key)
        if body is None:
            body = self.page(topics, limit, cursor).encode(version=0)
            with self._lock:
                self._bodies[key] = body
        return body

    def prepare(self, limit: int) -> int:
        """Encode a whole sweep's answers (all topics, ``limit`` partitions a request); the number of pages."""
        cursor, pages = None, 0
        while True:
            resp = self.page((), limit, cursor)
            with self._lock:
                self._bodies[((), limit, cursor)] = resp.encode(version=0)
            pages += 1
            if resp.next_cursor is None:
                return pages
            cursor = (resp.next_cursor.topic_name, resp.next_cursor.partition_index)


def _frame(correlation_id: int, body: bytes, flexible_header: bool) -> bytes:
    """Size, response header (v1 with an empty tagged-field section when flexible, else v0), body."""
    head = struct.pack(">i", correlation_id) + (b"\x00" if flexible_header else b"")
    return struct.pack(">i", len(head) + len(body)) + head + body


class Broker(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.cluster = cluster
        self.host, self.port = self.server_address[:2]


class Handler(socketserver.BaseRequestHandler):
    server: Broker

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.request.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                (size,) = struct.unpack(">i", self._read(4))
                payload = self._read(size)
                api_key, version = struct.unpack(">hh", payload[:4])
                self.request.sendall(self.answer(api_key, version, payload))
        except (ConnectionError, OSError):
            return

    def answer(self, api_key: int, version: int, payload: bytes) -> bytes:
        api = APIS.get(api_key)
        if api is None:
            print(f"[dtp_broker] API key {api_key} v{version} not served: closing", file=sys.stderr, flush=True)
            raise ConnectionError("not served")
        req_cls, resp_cls, lo, hi = api
        if api_key == ApiVersionsRequest.API_KEY and not lo <= version <= hi:
            # KIP-511: an ApiVersions the broker does not know is answered at v0 with the versions it has
            (cid,) = struct.unpack(">i", payload[4:8])
            return self._encode(ApiVersionsResponse(version=0, error_code=UNSUPPORTED_VERSION,
                                                    api_keys=self._api_keys()), 0, cid)
        req = req_cls.decode(payload, version=version, header=True)
        cid = req.header.correlation_id
        if api_key == ApiVersionsRequest.API_KEY:
            kw: dict[str, Any] = {"error_code": 0, "api_keys": self._api_keys(), "throttle_time_ms": 0}
            if version >= 3:
                kw.update(supported_features=[ApiVersionsResponse.SupportedFeatureKey(
                              name=ELR_FEATURE, min_version=0, max_version=1)],
                          finalized_features_epoch=1,
                          finalized_features=[ApiVersionsResponse.FinalizedFeatureKey(
                              name=ELR_FEATURE, max_version_level=1, min_version_level=1)])
            return self._encode(ApiVersionsResponse(version=version, **kw), version, cid)
        if api_key == MetadataRequest.API_KEY:
            b = MetadataResponse.MetadataResponseBroker(node_id=NODE_ID, host=self.server.host, port=self.server.port,
                                                        rack=None)
            return self._encode(MetadataResponse(version=version, throttle_time_ms=0, brokers=[b],
                                                 cluster_id="bench-elr", controller_id=NODE_ID, topics=[]),
                                version, cid)
        topics = tuple(t.name for t in (req.topics or []))
        cursor = None if req.cursor is None else (req.cursor.topic_name, req.cursor.partition_index)
        body = self.server.cluster.body(topics, req.response_partition_limit, cursor)
        self.server.cluster.served += 1
        return _frame(cid, body, flexible_header=True)

    @staticmethod
    def _api_keys() -> list[Any]:
        return [ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (_, _, lo, hi) in sorted(APIS.items())]

    @staticmethod
    def _encode(resp: Any, version: int, cid: int) -> bytes:
        resp.with_header(correlation_id=cid)  # after the version: encode(version=) would set it on the header
        return resp.encode(header=True, framed=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=1000, help="number of topics (default 1000)")
    ap.add_argument("--partitions", type=int, default=100, help="partitions per topic (default 100)")
    ap.add_argument("--prefix", default="elr-", help="topic names: PREFIX00000, PREFIX00001, ...")
    ap.add_argument("--unhealthy-every", type=int, default=97,
                    help="every N-th partition has ISR [1] and ELR [2, 3] (default 97: ~1%%; 0: none)")
    ap.add_argument("--page", type=int, action="append", default=None,
                    help="response_partition_limit of the sweeps to encode at start (repeatable; default 2000)")
    ap.add_argument("--no-stdin-watch", action="store_true", help="do not exit when stdin closes")
    args = ap.parse_args()
    cluster = Cluster(args.prefix, args.topics, args.partitions, args.unhealthy_every)
    pages = sum(cluster.prepare(limit) for limit in (args.page or [2000]))
    broker = Broker(cluster)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=broker.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    print(f"[dtp_broker] {args.topics} topics x {args.partitions} partitions, {pages} answers encoded",
          file=sys.stderr, flush=True)
    print(f"BOOTSTRAP {broker.host}:{broker.port}", flush=True)
    if not args.no_stdin_watch:
        from mock_cluster_server import stop_when_stdin_closes  # bench/, the script's own dir

        stop_when_stdin_closes(stop)
    while not stop.wait(1.0):
        pass
    broker.shutdown()
    broker.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
