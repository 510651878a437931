"""``monitor.access.again_if_timed_out``: a metadata request sent again through a new client when
(and only when) it timed out -- the probe's refresh and the job's source both rely on it."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from monitor.access import again_if_timed_out


def failing(code: int):
    def first():
        raise KafkaException(KafkaError(code))
    return first


def test_a_timed_out_request_is_asked_again():
    assert again_if_timed_out(failing(KafkaError._TIMED_OUT), lambda: "again") == "again"


def test_an_answer_is_not_asked_again():
    asked = []
    assert again_if_timed_out(lambda: "first", lambda: asked.append(1)) == "first" and asked == []


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError.TOPIC_AUTHORIZATION_FAILED])
def test_other_errors_are_raised_as_they_are(code):
    with pytest.raises(KafkaException) as got:
        again_if_timed_out(failing(code), lambda: "again")
    assert got.value.args[0].code() == code


def test_without_a_second_client_a_timeout_is_raised():
    with pytest.raises(KafkaException):
        again_if_timed_out(failing(KafkaError._TIMED_OUT), None)
