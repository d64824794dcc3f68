"""The greedy kernels' log buffers: grown only when full, their entries kept."""

import numpy as np

from kvsched.csp.incumbents.log import with_room


def test_a_buffer_with_room_is_kept_and_a_full_one_at_least_doubles_with_its_entries():
    buf = np.arange(12, dtype=np.int64).reshape(2, 6)
    assert with_room(buf, 6) is buf
    grown = with_room(buf, 7)
    assert grown.shape == (2, 12) and grown.dtype == buf.dtype
    assert np.array_equal(grown[:, :6], buf) and not grown[:, 6:].any()
    assert with_room(np.zeros(4), 100).shape == (100,)  # more than double where more is needed
