"""Plain leaves are stored without pickle (issue #10) and come back equal, of the same type, and
in place where the object is mutable."""

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

from flor.errors import FlorError, StateError
from flor.state import PickleTrust, diff_nodes, restore, snapshot


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


def roundtrip(obj):  # noqa: ANN001, ANN201
    blobs = MemoryBlobs()
    tree = snapshot([obj]).materialize(blobs.put)
    assert '"pickle"' not in json.dumps(tree), f"{type(obj)} went through pickle: {tree}"
    json.loads(json.dumps(tree))  # JSON through and through
    return tree, blobs


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


def _same(a, b) -> bool:  # noqa: ANN001
    if isinstance(a, float) or isinstance(a, complex):
        return repr(a) == repr(b)
    return a == b


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_plain_leaves_roundtrip_without_pickle(value) -> None:  # noqa: ANN001
    tree, blobs = roundtrip(value)
    fresh = restore([None], tree, blobs.__getitem__)[0]  # no live object to go by
    assert type(fresh) is type(value) and _same(fresh, value)
    live = [value]
    again = restore(live, tree, blobs.__getitem__)[0]
    assert type(again) is type(value) and _same(again, value)
    if isinstance(value, datetime.datetime):
        assert again.tzinfo == value.tzinfo and again.fold == value.fold


@pytest.mark.parametrize("value, base", [(np.str_("np"), str), (np.float64(0.5), float)], ids=["str_", "float64"])
def test_subclasses_of_plain_types_are_recorded_as_the_plain_type(value, base) -> None:  # noqa: ANN001
    """np.str_ and np.float64 subclass str and float: they are recorded as a str and a float,
    which is what a manifest reads back as, so a replay holding the same value compares equal
    (it compares types exactly; the in-memory tree used to keep the subclass)."""
    tree, blobs = roundtrip(value)
    read = json.loads(json.dumps(tree))  # as a manifest is read
    for t in (tree, read):
        fresh = restore([None], t, blobs.__getitem__)[0]
        assert type(fresh) is base and fresh == value
    assert diff_nodes(read, snapshot([value], copy=False).materialize()) == []


def test_mutable_leaves_are_restored_in_place() -> None:
    s, ba, cfg = {"a"}, bytearray(b"abc"), Config(lr=0.5)
    tree, blobs = roundtrip((s, ba, cfg))
    s.add("b")
    ba[:] = b"zz"
    cfg.lr, cfg.tags = 9.0, set()
    out = restore([(s, ba, cfg)], tree, blobs.__getitem__)[0]
    assert out[0] is s and s == {"a"}
    assert out[1] is ba and ba == bytearray(b"abc")
    assert out[2] is cfg and cfg == Config(lr=0.5)


def test_numpy_generators_without_pickle_in_place_or_new() -> None:
    gen, bitgen = np.random.Generator(np.random.MT19937(3)), np.random.PCG64(4)
    tree, blobs = roundtrip((gen, bitgen))
    expected = (gen.random(), bitgen.random_raw())
    gen.random(), bitgen.random_raw()  # advance: restore must rewind
    out = restore([(gen, bitgen)], tree, blobs.__getitem__)[0]
    assert out[0] is gen and out[1] is bitgen and (gen.random(), bitgen.random_raw()) == expected
    fresh = restore([None], tree, blobs.__getitem__)[0]
    assert isinstance(fresh[0].bit_generator, np.random.MT19937) and fresh[0].random() == expected[0]


def test_sets_compare_by_members_not_by_order() -> None:
    a = snapshot([{"alpha", "beta", "gamma"}], copy=False).materialize()
    b = snapshot([{"gamma", "alpha", "beta"}], copy=False).materialize()
    assert diff_nodes(a, b) == [] and json.dumps(a) == json.dumps(b)
    c = snapshot([{"alpha"}], copy=False).materialize()
    assert diff_nodes(a, c) == ["[0]"]
    assert diff_nodes(snapshot([Color.RED]).tree, snapshot([Color.BLUE]).tree) == ["[0]"]


def test_classes_come_only_from_loaded_modules() -> None:
    enum_node = {"t": "list", "v": [{"t": "enum", "cls": "antigravity.Fly", "name": "X"}]}
    with pytest.raises(StateError, match="not loaded in this process"):
        restore([None], enum_node, {}.__getitem__)
    assert "antigravity" not in __import__("sys").modules  # nothing was imported to find it
    for cls in ("os.system", "builtins.eval", "subprocess.Popen"):  # loaded, but not enums
        with pytest.raises(StateError, match="not loaded in this process, or is no longer"):
            restore([None], {"t": "list", "v": [{"t": "enum", "cls": cls, "name": "X"}]}, {}.__getitem__)
    dc_node = {"t": "list", "v": [{"t": "dataclass", "cls": "os.PathLike", "v": {"t": "dict", "k": [], "v": []}}]}
    with pytest.raises(StateError):
        restore([None], dc_node, {}.__getitem__)


@pytest.mark.filterwarnings("ignore:flor")
def test_what_remains_is_pickled_with_a_digest_and_refused_by_default() -> None:
    blobs = MemoryBlobs()
    tree = snapshot([collections.Counter(a=2)]).materialize(blobs.put)
    node = tree["v"][0]
    assert node["t"] == "pickle" and len(node["sha256"]) == 64
    with pytest.raises(StateError, match=r"\[0\] is a pickled collections.Counter.*--flor_trust_pickles"):
        restore([None], tree, blobs.__getitem__)
    assert restore([None], tree, blobs.__getitem__, pickles=PickleTrust(True))[0] == collections.Counter(a=2)
    blobs[node["h"]] = blobs[node["h"]] + b"."  # bytes that are not the signed ones
    with pytest.raises(FlorError, match="do not match the SHA-256"):
        restore([None], tree, blobs.__getitem__, pickles=PickleTrust(True))


def test_arrays_torch_has_no_tensor_for_are_stored_as_their_bytes() -> None:
    """Strings, bytes, dates and durations of any unit, another byte order, long doubles:
    torch cannot view them, so the encoder raised on them and every checkpoint of a block
    holding one failed (a replay re-executed every epoch); and a reader refused a manifest
    with a date of days, months or years (``'<M8[D]'``) as damaged. They are stored as their
    bytes and come back equal, with their dtype, through the manifest validator."""
    from flor.store.manifest import check_node

    arrays = [np.array(["ab", "ü"]), np.array([b"x", b"yz"]), np.arange(3, dtype=">i4"),
              np.array(["2024-01-02", "NaT"], dtype="datetime64[D]"), np.array([1, 2], dtype="timedelta64[10ms]"),
              np.array(["2024"], dtype="datetime64[Y]"), np.arange(4, dtype=np.longdouble).reshape(2, 2),
              np.asfortranarray(np.array([["a", "b"], ["c", "d"]])), np.array([], dtype="<U3")]
    scalars = [np.datetime64("2024-01", "M"), np.timedelta64(3, "D")]
    tree, blobs = roundtrip([arrays, scalars])
    check_node(json.loads(json.dumps(tree)))
    back = restore([None], json.loads(json.dumps(tree)), blobs.__getitem__)[0]
    for a, b in zip(arrays, back[0]):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fmM"), a
    assert [(type(x), x) for x in back[1]] == [(type(x), x) for x in scalars]


def test_deques_and_defaultdicts_are_stored_natively_and_restored_in_place() -> None:
    """A ``deque(maxlen=N)`` of recent losses and a ``defaultdict(list)`` of histories were
    pickled (a warning, and a colleague's replay from a shared bucket refused them); they are
    nodes of their own now, restored in place. A defaultdict whose factory is not a builtin
    type is still pickled; a manifest naming any other factory is refused as damaged."""
    from flor.store.manifest import check_node

    recent = collections.deque([torch.ones(2), 0.5], maxlen=3)
    hist = collections.defaultdict(list, {"loss": [1.0, 0.5], "acc": []})
    objs = [recent, hist, collections.defaultdict(int, {3: 4}), collections.deque()]
    tree, blobs = roundtrip(objs)
    check_node(json.loads(json.dumps(tree)))
    live = [collections.deque(maxlen=3), collections.defaultdict(list), collections.defaultdict(int),
            collections.deque()]
    originals = list(live)
    back = restore([live], tree, blobs.__getitem__)[0]
    assert len(back) == 4 and all(b is x for b, x in zip(back, originals))  # in place
    assert back[0].maxlen == 3 and torch.equal(back[0][0], torch.ones(2)) and back[0][1] == 0.5
    assert back[1] == hist and back[1]["new"] == [] and back[2] == {3: 4} and back[2]["x"] == 0
    other = restore([None], tree, blobs.__getitem__)[0]  # no live objects: new ones, the same
    assert other[0].maxlen == 3 and other[1].default_factory is list and dict(other[1]) == dict(hist)
    with pytest.warns(RuntimeWarning, match="pickle"):
        pickled = snapshot([collections.defaultdict(lambda: 7, {"a": 1})]).materialize()
    assert '"pickle"' in json.dumps(pickled)
    hostile = json.loads(json.dumps(tree))
    hostile["v"][0]["v"][1]["factory"] = "os.system"
    with pytest.raises(Exception, match="factory"):
        check_node(hostile)
    with pytest.raises(FlorError):
        restore([None], hostile, blobs.__getitem__)
