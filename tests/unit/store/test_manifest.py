"""flor.store.manifest: the validator accepts every leaf the encoder writes, and checks a
checkpoint's gradients.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import pathlib
import typing
import uuid
import zoneinfo

import numpy as np
import pytest
import torch

from flor.errors import FlorError
from flor.state import snapshot


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 4
    W = 2


Point = collections.namedtuple("Point", "x y")


class Span(typing.NamedTuple):
    start: int
    label: str = "s"


@dataclasses.dataclass
class Config:
    lr: float = 0.1
    tags: set = dataclasses.field(default_factory=lambda: {"a", "b"})
    where: pathlib.Path = pathlib.Path("out")


@dataclasses.dataclass(frozen=True)
class Frozen:
    n: int = 1
    when: datetime.date = datetime.date(2020, 1, 2)


@dataclasses.dataclass(slots=True)
class Slotted:
    a: int = 1
    b: tuple = (1, 2)


class MemoryBlobs(dict):
    def put(self, data, digest):  # noqa: ANN001
        self[digest] = bytes(data)


VALUES = [
    3 + 4j, complex(float("inf"), -0.0),
    pathlib.PurePosixPath("a/b"), pathlib.Path("/tmp/x"), pathlib.PureWindowsPath(r"C:\\data\\x"),
    datetime.datetime(2024, 5, 6, 7, 8, 9, 123456),
    datetime.datetime(2024, 5, 6, 7, 8, tzinfo=datetime.timezone(datetime.timedelta(hours=-3))),
    datetime.datetime(2024, 11, 3, 1, 30, tzinfo=zoneinfo.ZoneInfo("America/New_York"), fold=1),
    datetime.date(1999, 12, 31), datetime.time(23, 59, 1, 5), datetime.timedelta(days=-2, seconds=5, microseconds=7),
    decimal.Decimal("1.10"), decimal.Decimal("-Infinity"), uuid.UUID(int=12345),
    Color.BLUE, Level.HIGH, Perm.R | Perm.W,
    frozenset({"x", 2, ("t", 1)}), {"s", "t"},
    b"\x00bytes", bytearray(b"mutable"),
    Point(1, [2, 3]), Span(5),
    Config(), Frozen(), Slotted(),
    torch.float16, torch.bfloat16, torch.device("cpu"), np.dtype("<f4"), np.dtype("<U3"),
    np.float32(1.5), np.complex64(1 - 2j), np.datetime64("2020-01-01T00:00:00.123456789"), np.timedelta64(5, "h"),
    np.bool_(True), np.int16(-7),
]


@pytest.mark.filterwarnings("ignore:flor")
def test_the_manifest_validator_accepts_every_leaf_the_encoder_writes() -> None:
    from flor.state import capture_rng
    from flor.store.manifest import check_manifest, seal

    blobs = MemoryBlobs()
    objs = [*VALUES, torch.nn.Linear(2, 2), np.arange(3), {"k": (1, None)}, collections.Counter(a=1)]
    manifest = seal({"block": "b", "epoch": 3, "occurrence": 1, "count": len(objs),
                     "objects": snapshot(objs).materialize(blobs.put), "rng": snapshot(capture_rng()).materialize()})
    read_back = json.loads(json.dumps(manifest))
    assert check_manifest(read_back, "3-1.json", block="b", epoch=3, occurrence=1) == manifest
    with pytest.raises(FlorError, match="of epoch 3 .*its file of epoch 4"):  # copied over another epoch's file
        check_manifest(read_back, "4.json", block="b", epoch=4, occurrence=0)


def test_the_manifest_validator_checks_a_checkpoints_gradients() -> None:
    from flor.state import capture_rng
    from flor.state.grads import module_grads
    from flor.store.manifest import check_manifest, seal

    net = torch.nn.Linear(2, 2)
    net(torch.ones(1, 2)).sum().backward()
    base = {"block": "b", "epoch": 3, "occurrence": 0, "count": 1, "objects": snapshot([net]).materialize(),
            "rng": snapshot(capture_rng()).materialize()}
    good = seal({**base, "grads": snapshot(module_grads([net])).materialize()})
    assert check_manifest(json.loads(json.dumps(good)), "3.json") == good
    bad_hash = json.loads(json.dumps(good))
    bad_hash["grads"]["v"][0]["v"][0]["h"] = "../../etc"
    for grads, problem in [([1], "not a dict node"), ({"t": "list", "v": []}, "not a dict node"),
                           (bad_hash["grads"], "grads")]:
        with pytest.raises(FlorError, match=problem):
            check_manifest(seal({**base, "grads": grads}), "3.json")
