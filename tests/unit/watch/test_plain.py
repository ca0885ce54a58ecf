"""flor.watch.plain: the plain data that a block's variables and the outer loop's state are
noted as. Collections, NumPy arrays and scalars and small tensors round trip with their types;
what is too large or not plain is refused; a hostile value does not decode.
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
    from flor.watch.plain import BLOCK_MAX_ITEMS, NotPlain

    encode(np.zeros((16, 16)), BLOCK_MAX_ITEMS)
    with pytest.raises(NotPlain):
        encode(np.zeros(257, dtype=np.int64), BLOCK_MAX_ITEMS)


@pytest.mark.parametrize("node", [
    {"nd": "<f8", "s": [10 ** 9], "v": [1.0]},  # a shape its values do not fill: never allocated
    {"nd": "<f8", "s": [-1, -1], "v": [1.0]},
    {"nd": "|O", "s": [1], "v": [1]},  # objects
    {"nd": "<i8", "s": [1], "v": [10 ** 30]},  # an int its dtype cannot hold
    {"nd": "<f8", "s": [1], "v": ["1"]},
    {"dd": "os.system", "d": []},  # a factory is one of five builtins, by name
    {"dd": ["list"], "d": []},
    {"q": [1], "m": -1},
    {"q": [1], "m": "3"},
    {"C": [[{"l": [1]}, 1]]},  # an unhashable key
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
    for value in (list(range(1000)), torch.zeros(3), object(), "x" * 10_000, {1, 2}):
        with pytest.raises(NotPlain):
            encode(value)
    for bad in ({"pt": "os.system", "v": 1}, {"np": "O", "v": 1}, {"zz": 1}, [1]):
        with pytest.raises((ValueError, TypeError)):
            decode(bad)
