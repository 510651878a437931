"""What an authorization or authentication error tells the operator.

Kafka answers a request the user may not make with an error that names a resource type, not the
ACL: TOPIC_AUTHORIZATION_FAILED does not say whether DESCRIBE, DESCRIBE_CONFIGS or WRITE was
missing.  The caller knows what it asked for, so it says which ACL to grant:
``missing_acl(err, topic=("DESCRIBE_CONFIGS", "orders"))`` is
``" -- permission missing: DESCRIBE_CONFIGS on Topic:orders"`` for an authorization error and
``""`` for anything else (docs/security.md: the ACLs a monitor needs).

``fatal_reason(err)``: the errors that retrying cannot fix -- the brokers refused the credentials
(SASL authentication failed), or a client reached a fatal state (an idempotent producer refused
a producer id) -- as a message for the operator; None for the rest.  Messages carry the broker's
error text and the ACL, never a client property: no password can end up in them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from confluent_kafka import KafkaError, KafkaException

#: authorization error code -> the resource type it is about (Kafka's ACL names)
_RESOURCE_OF_CODE = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional_id",
}
_RESOURCE_NAME = {"topic": "Topic", "group": "Group", "cluster": "Cluster", "transactional_id": "TransactionalId"}


class FatalClientError(RuntimeError):
    """A client error that retrying cannot fix; the message says what to change."""


def kafka_error(e: Any) -> Optional[KafkaError]:
    """The KafkaError in ``e`` (a KafkaError, or a KafkaException wrapping one), else None."""
    if isinstance(e, KafkaError):
        return e
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0]
    return None


def timed_out(e: Any) -> bool:
    """Whether ``e`` is a request that timed out (librdkafka's _TIMED_OUT: no answer, or the
    broker it waits for never came up)."""
    err = kafka_error(e)
    return err is not None and err.code() == KafkaError._TIMED_OUT


T = TypeVar("T")


def again_if_timed_out(first: Callable[[], T], again: Optional[Callable[[], T]]) -> T:
    """``first()`` (a metadata request); when it timed out, ``again()`` (the same request through
    a new client), when given.  librdkafka sends a client's metadata request to the broker it last
    used, and asked again it goes there again: with that broker paused every try waits out its
    timeout.  A new client's connection to a paused broker never gets past ApiVersion, so it asks
    another.  Errors other than a timeout are raised as they are."""
    try:
        return first()
    except KafkaException as e:
        if again is None or not timed_out(e):
            raise
    return again()


def authorization_resource(e: Any) -> Optional[str]:
    """``topic``, ``group``, ``cluster`` or ``transactional_id`` for an authorization error, else None."""
    err = kafka_error(e)
    return _RESOURCE_OF_CODE.get(err.code()) if err is not None else None


def missing_acl(e: Any, **needed: tuple[str, str]) -> str:
    """``" -- permission missing: <OPERATION> on <Resource>:<name>"`` when ``e`` is an authorization
    error about a resource type given in ``needed`` (``topic=("DESCRIBE", "orders")``,
    ``group=("DESCRIBE", "billing")``, ``cluster=(...)``); ``""`` otherwise."""
    resource = authorization_resource(e)
    if resource is None or resource not in needed:
        return ""
    operation, name = needed[resource]
    return f" -- permission missing: {operation} on {_RESOURCE_NAME[resource]}:{name}"


def fatal_reason(e: Any, write_topic: Optional[str] = None) -> Optional[str]:
    """The operator's message for an error retrying cannot fix, else None.  ``write_topic``: the
    topic the client produces to, named when an idempotent producer is refused its producer id."""
    err = kafka_error(e)
    if err is None:
        return None
    if err.code() == KafkaError._AUTHENTICATION:
        return (f"authentication failed: {err.str()} -- the brokers refuse these credentials; check "
                f"sasl.username, sasl.password, sasl.mechanisms and the ssl.* settings (stopping: retrying "
                f"cannot fix them)")
    if err.fatal():
        hint = ""
        if write_topic and err.code() in (KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                          KafkaError.TOPIC_AUTHORIZATION_FAILED):
            # an idempotent producer's InitProducerId is allowed with WRITE on any topic (KIP-679,
            # Kafka 3.0+); without it the broker answers CLUSTER_AUTHORIZATION_FAILED
            hint = (f" -- permission missing: WRITE on Topic:{write_topic} (an idempotent producer needs it for "
                    f"its producer id; brokers before Kafka 3.0 want IDEMPOTENT_WRITE on Cluster:kafka-cluster)")
        return f"fatal client error {err.name()}: {err.str()}{hint}"
    return None


def permanent_error(e: Any) -> Optional[str]:
    """What to tell the operator about an error that retrying cannot fix (authorization refused,
    or ``fatal_reason``), else None: every other broker or network error is transient to a
    reader that asks again (a broker down, paused or fenced, a leader moving, a timeout)."""
    if authorization_resource(e) is not None:
        err = kafka_error(e)
        return f"{err.name()}: {err.str()}" if err is not None else str(e)
    return fatal_reason(e)
