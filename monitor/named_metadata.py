"""Metadata requests that name topics, through kafka-python (issue 49).

A probe of an HA group that does not hold the cluster shard needs the metadata of its own shards'
topics only.  librdkafka cannot be asked for that from confluent-kafka (``list_topics()`` asks for
every topic, or for one), so such a probe names its topics in a Metadata request sent through
kafka-python, the client its quorum, ELR, log dir and transaction watchers already use.  Its answer
is decoded without ``to_dict()`` (a quarter of 100,000 partitions: 0.09 CPU-s,
``bench/results/metadata-decode.json``) and turned into a view by
``ClusterView.from_metadata_response``.

Kafka has no listing of topic names without their partitions, so new topics are still found by
the whole listing (librdkafka's), which such a probe sends every ``HA_DISCOVERY_S``, after its
shards move, and whenever a named request fails (docs/ha.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from monitor.quorum import QuorumConfigError, close_quietly, kafka_python_admin, kafka_python_conf

log = logging.getLogger("monitor.probe")

#: after a client that could not connect at all (no bootstrap), named requests wait this long, s
BOOTSTRAP_RETRY_S = 600.0


class NamedMetadataError(RuntimeError):
    """A named Metadata request that got no answer; the probe lists the whole metadata instead."""


class NamedMetadata:
    """Metadata requests naming topics, one kafka-python client made at the first request.

    ``fetch(topics, timeout_s)`` returns ``(response, node_id)``: kafka-python's decoded
    ``MetadataResponse`` and the broker that answered, or raises :class:`NamedMetadataError`.
    ``available()`` is false while a client could not be made (for ``BOOTSTRAP_RETRY_S``)."""

    def __init__(self, conf: dict[str, Any], request_timeout_s: float, client_id: str = "kafka-monitor-metadata"):
        #: kafka-python's settings; QuorumConfigError (a security setting it lacks) is the caller's to say
        self._kp_conf = kafka_python_conf(conf, purpose="named Metadata requests (--ha-group)",
                                          off="running the probe without --ha-group")
        self._timeout_s = request_timeout_s
        self._client_id = client_id
        self._admin: Any = None
        self._no_client_until = float("-inf")

    def available(self) -> bool:
        return time.monotonic() >= self._no_client_until

    def _client(self, timeout_s: float) -> Any:
        if self._admin is None:
            try:
                self._admin = kafka_python_admin(self._kp_conf, max(1.0, timeout_s), self._client_id)
            except Exception as e:  # noqa: BLE001 - any failure to connect: the whole listing stands in
                self._no_client_until = time.monotonic() + BOOTSTRAP_RETRY_S
                raise NamedMetadataError(f"no kafka-python client ({type(e).__name__}: {e}); named metadata "
                                         f"requests tried again in {BOOTSTRAP_RETRY_S:.0f} s") from None
        return self._admin

    def fetch(self, topics: list[str], timeout_s: float) -> tuple[Any, Optional[int]]:
        from kafka.protocol.metadata import MetadataRequest

        admin = self._client(timeout_s)
        manager = admin._manager  # kafka-python's connection manager: a request to one node, awaited
        request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
                                  allow_auto_topic_creation=False)
        ms = max(500, int(timeout_s * 1000))
        node: list[Optional[int]] = [None]

        async def ask() -> Any:
            node[0] = manager.least_loaded_node()
            return await manager.wait_for(manager.send(request, node_id=node[0], request_timeout_ms=ms), ms)

        try:
            return manager.run(ask), node[0]
        except Exception as e:  # noqa: BLE001 - timeout, disconnect, closed client: the whole listing stands in
            self.close()  # made again at the next request (a minute on): no connection kept to a stuck broker
            raise NamedMetadataError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None

    def close(self) -> None:
        admin, self._admin = self._admin, None
        close_quietly(admin)


def named_metadata(conf: dict[str, Any], request_timeout_s: float) -> Optional[NamedMetadata]:
    """The client, or None (said at INFO) when a security setting has no kafka-python equivalent:
    the probe then lists the whole metadata at each refresh, as without an HA group."""
    try:
        return NamedMetadata(conf, request_timeout_s)
    except QuorumConfigError as e:
        log.info("named metadata requests off, every refresh lists the whole metadata: %s", e)
        return None
