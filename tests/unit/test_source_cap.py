"""maxOffsetsPerTrigger: the cap shared across partitions."""

import pytest

from streaming.source import cap


@pytest.mark.parametrize("begin, end, limit, expected", [
    ({0: 0, 1: 0}, {0: 10, 1: 10}, 100, {0: 10, 1: 10}),          # under the cap: everything
    ({0: 0, 1: 0}, {0: 100, 1: 300}, 40, {0: 10, 1: 30}),         # proportional to backlog
    ({0: 50, 1: 0}, {0: 50, 1: 10}, 5, {0: 50, 1: 5}),            # no backlog: does not move
    ({0: 0, 1: 0, 2: 0}, {0: 1000, 1: 1, 2: 1}, 3, {0: 2, 1: 1, 2: 1}),  # every backlog moves by >= 1
    ({}, {0: 100}, 10, {0: 10}),                                  # new partition starts at earliest (0)
])
def test_cap(begin, end, limit, expected):
    assert cap(begin, end, limit, earliest={p: 0 for p in end}) == expected
