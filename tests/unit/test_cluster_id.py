"""A managed cluster's id is one kafka-storage accepts: never read as an option."""
import base64
import uuid

from kafka_monitor.local import kafka_cluster


def test_cluster_ids_never_start_with_a_dash(monkeypatch):
    # the first uuid encodes to "-..." (0xf8 → "-" in urlsafe base64); it must be skipped
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    plain = uuid.UUID(bytes=bytes([0x10]) + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    ids = iter([dashed, plain])
    monkeypatch.setattr(kafka_cluster.uuid, "uuid4", lambda: next(ids))
    cid = kafka_cluster._new_cluster_id()
    assert cid == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert len(cid) == 22


def test_cluster_ids_are_22_url_safe_characters():
    for _ in range(2000):
        cid = kafka_cluster._new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
