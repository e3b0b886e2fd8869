"""The client's request encoding: numpy vectors written straight from their buffers, every value
read back exactly as the standard library would have written it."""

import json

import numpy as np
import pytest

from memory_app.client.client import _encode, _with_vector


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_numpy_vectors_round_trip_exactly(dtype):
    vector = np.random.default_rng(7).standard_normal(384).astype(dtype)
    body = {"messages": [_with_vector({"role": "user", "text": "x"}, vector, "m")]}
    sent = json.loads(_encode(body))["messages"][0]
    assert sent["vector_model"] == "m"
    assert np.array_equal(np.asarray(sent["vector"], dtype=dtype), vector)


def test_arrays_orjson_cannot_read_in_place_and_big_integers_still_encode():
    strided = np.arange(12, dtype=np.float64)[::3]  # not contiguous
    big = 2**70
    decoded = json.loads(_encode({"v": _with_vector({}, strided, None)["vector"], "n": big}))
    assert decoded == {"v": [0.0, 3.0, 6.0, 9.0], "n": big}


def test_plain_sequences_become_floats():
    assert json.loads(_encode(_with_vector({}, (1, 2), None))) == {"vector": [1.0, 2.0]}
