"""flor.watch.plain: the plain data that a block's variables and the outer loop's state are
noted as, in the state codec's vocabulary. Collections, NumPy arrays and scalars, small tensors and
flor.leaves' leaves round trip with their types; what is too large or not plain is refused; a
hostile node does not decode.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from flor.watch.plain import decode, encode


def test_the_values_come_back_of_their_type():
    for value in (collections.deque([1.5, 2], maxlen=3), collections.Counter(a=3),
                  collections.OrderedDict(x=(1, "a")), collections.defaultdict(list, k=[0.5])):
        back = decode(json.loads(json.dumps(encode(value))))
        assert type(back) is type(value) and back == value
    assert decode(encode(collections.deque([1]))).maxlen is None
    assert decode(encode(collections.defaultdict(int))).default_factory is int
    for array in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([np.nan, -0.0], np.float16),
                  np.array(7, np.int64), np.array([True, False])):
        back = decode(json.loads(json.dumps(encode(array))))
        assert back.dtype == array.dtype and back.shape == array.shape
        assert np.array_equal(back, array, equal_nan=True) and np.signbit(back).tolist() == np.signbit(array).tolist()


def test_an_array_of_more_than_256_values_is_not_noted():
    """A label array the script loaded would be encoded and compared at every block run."""
    from flor.watch.limits import LIMITS
    from flor.watch.plain import NotPlain

    encode(np.zeros((16, 16)), LIMITS.block_items)
    with pytest.raises(NotPlain):
        encode(np.zeros(257, dtype=np.int64), LIMITS.block_items)


@pytest.mark.parametrize("node", [
    {"t": "ndarray", "dtype": "<f8", "shape": [10 ** 9], "v": [1.0]},  # a shape its values do not fill: never allocated
    {"t": "ndarray", "dtype": "<f8", "shape": [-1, -1], "v": [1.0]},
    {"t": "ndarray", "dtype": "|O", "shape": [1], "v": [1]},  # objects
    {"t": "ndarray", "dtype": "<i8", "shape": [1], "v": [10 ** 30]},  # an int its dtype cannot hold
    {"t": "ndarray", "dtype": "<f8", "shape": [1], "v": ["1"]},
    {"t": "defaultdict", "factory": "os.system", "k": [], "v": []},  # a factory is a builtin, by name
    {"t": "defaultdict", "factory": ["list"], "k": [], "v": []},
    {"t": "deque", "maxlen": -1, "v": [1]},
    {"t": "deque", "maxlen": "3", "v": [1]},
    {"t": "counter", "k": [{"t": "list", "v": [1]}], "v": [1]},  # an unhashable key
    {"t": "dict", "k": ["a", "b"], "v": [1]},  # keys and values that do not pair
    {"t": "enum", "cls": "os.system", "name": "x"},  # a class is never imported to decode
    {"t": "complex", "v": []},
])
def test_a_hostile_value_does_not_decode(node):
    with pytest.raises(ValueError):
        decode(node)



def test_outer_values_round_trip_with_their_types():
    import numpy as np
    import torch

    from flor.watch.plain import NotPlain, decode, encode

    for value in (3, -2.5, float("inf"), "s", True, None, (1, [2.0, {"k": None}]), {1: "a", (2, 3): [True]},
                  np.float32(1.25), np.int64(7), torch.tensor(0.5, dtype=torch.bfloat16), torch.tensor(3)):
        back = decode(json.loads(json.dumps(encode(value))))
        assert type(back) is type(value) and (back == value if not isinstance(value, torch.Tensor)
                                              else back.dtype == value.dtype and torch.equal(back, value))
    for value in (list(range(1000)), torch.zeros(3), object(), "x" * 10_000, {1, object()}):
        with pytest.raises(NotPlain):
            encode(value)
    for bad in ({"t": "tensor", "dtype": "os.system", "shape": [], "v": 1}, {"t": "npscalar", "dtype": "O", "v": 1},
                {"zz": 1}, [1], {"t": "list"}):
        with pytest.raises((ValueError, TypeError)):
            decode(bad)

