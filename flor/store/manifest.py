"""Checkpoint manifests as untrusted input: canonical bytes, a checksum over all of them, and
one validation of their structure.

A store may be shared (a bucket, a team directory), so a manifest read back is checked
before anything in it is used:

- ``sha256`` covers the whole manifest, inline values included (step counters, the Python
  RNG state): the canonical JSON of every field but ``sha256`` and ``hmac``. A flipped digit
  makes the checkpoint unusable, and replay re-executes from an earlier one.
- ``check_manifest`` validates the node tree (``flor.state`` documents the node forms): every
  node kind, hashes 32 hex digits, dtypes from an allow-list, shapes lists of non-negative
  ints with a sane product, a bounded depth. A damaged but valid JSON file is a
  ``CheckpointError`` naming the file and the problem, never an internal exception.

The checksum detects damage, not an attacker (anyone can recompute it); what stops a planted
pickle is ``flor.store.trust``'s HMAC, made with the user's own key.
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring_ascii
import math
import re
from typing import Any, NoReturn

from ..errors import CheckpointError
from .ids import is_blob_hash, is_block_name

__all__ = [
    "FORMAT", "NP_KINDS", "PATH_CLASSES", "TORCH_DTYPES", "canonical_bytes", "check_manifest", "check_node",
    "canonical_json", "dense_stride", "has_pickles", "seal", "sealed_bytes",
]

#: the manifest format this flor writes and reads. 3 (flor 0.1.0): a whole-manifest ``sha256``
#: (format 2 added it), Python's RNG words as raw bytes, and a module's ``frozen`` and ``eval``
#: lists in its node. Earlier formats are refused (``check_manifest``), not read with fallbacks.
FORMAT = 3

#: torch dtypes a tensor leaf may name, with their size in bytes (a damaged name never reaches torch)
TORCH_DTYPES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}
#: numpy dtype kinds an array or scalar leaf may have (no object, structured or void arrays)
NP_KINDS = "biufcSUmM"
#: a collections.defaultdict's default_factory flor stores by name (None: no factory); any other is pickled
DEFAULT_FACTORIES = {None: None, "list": list, "dict": dict, "int": int, "float": float, "str": str, "set": set,
                     "tuple": tuple}
#: pathlib classes a path leaf may name
PATH_CLASSES = ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")
#: numpy bit generators a generator leaf may name
NP_BITGENS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hpu|npu)(:[0-9]{1,4})?$")
_NP_DTYPE = re.compile(r"^[<>|=]?[a-zA-Z][0-9]{0,4}(\[[0-9]{0,4}[a-zA-Z]{1,2}\])?$")  # '<M8[D]', '<m8[10ms]'
_CLS = re.compile(r"^[A-Za-z_][A-Za-z0-9_.<>]{0,255}$")
_MAX_MODULES = 1 << 20  # the most submodule names an "eval" list holds
_PARAM = re.compile(r"^[^\x00-\x1f]{1,1024}$")  # a state_dict key: module names are free text, not control characters
_MAX_DEPTH = 100
_MAX_PACKED = 1 << 30  # bytes of one leaf inside a pack (packed leaves are small: flor.state.PACK_LEAF_BYTES)
_MAX_ELEMENTS = 1 << 48  # elements of one tensor: far beyond any real one, small enough to compute on
_UNSIGNED = ("sha256", "hmac")  # the fields the checksum and the signature do not cover

_CONTAINERS = {"list", "tuple", "set", "frozenset"}


def canonical_bytes(manifest: dict) -> bytes:
    """The bytes ``sha256`` and the HMAC cover: sorted, compact JSON of every other field.

    The same for the dict a recording writes and for the dict parsed back from its file
    (floats round-trip exactly; tuples are written as lists either way).
    """
    body = {k: v for k, v in manifest.items() if k not in _UNSIGNED}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True).encode()


def seal(manifest: dict, *, sign: Any = None) -> dict:
    """Set ``format`` and ``sha256`` (and ``hmac`` with ``sign(canonical_bytes)``, when given).

    ``sign`` returns the ``hmac`` field (see ``flor.store.trust.signer``), or None to leave it out.
    """
    manifest["format"] = FORMAT
    data = canonical_bytes(manifest)
    manifest["sha256"] = hashlib.sha256(data).hexdigest()
    if sign is not None:
        mac = sign(data)
        if mac is not None:
            manifest["hmac"] = mac
    return manifest


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)


_NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def canonical_json(value: Any) -> str:
    """Sorted, compact JSON of ``value``: the form ``canonical_bytes`` is made of. (One encoder
    for every call: ``json.dumps`` with options makes a new one each time, and a checkpoint's
    manifest takes ~30 calls, most of them for a key or a number: plain values are written
    here directly, as the encoder writes them; the writer renders a snapshot's values with it
    too, ``flor.state.cache``.)

    >>> values = ("é", 3, True, None, -0.0, float("nan"), 1e300, 2**70, [1, {"b": 2, "a": 1}])
    >>> [canonical_json(v) for v in values] == [json.dumps(v, sort_keys=True, separators=(",", ":")) for v in values]
    True
    """
    t = type(value)
    if t is str:
        return encode_basestring_ascii(value)
    if t is int:
        return int.__repr__(value)
    if t is float:
        text = float.__repr__(value)
        return _NONFINITE.get(text, text)
    if value is None or t is bool:
        return "null" if value is None else "true" if value else "false"
    return _CANONICAL.encode(value)


#: what the state digest covers: the objects given to end(), the random state at its end, and what
#: flor.watch noted of the block run outside end() (the gradients and rng_start are left out)
DIGESTED = ("objects", "rng", "watch")


def state_digest(rendered: dict[str, str]) -> str:
    """The state digest of a checkpoint from the canonical JSON of its parts (``DIGESTED``, those
    present): a recording passes the texts it rendered once; ``digest_of`` reads a manifest."""
    from .hashing import hash_bytes

    parts = [f"{canonical_json(k)}:{rendered[k]}" for k in DIGESTED if k in rendered]
    return hash_bytes(("{" + ",".join(parts) + "}").encode())


def digest_of(manifest: dict) -> str:
    """``state_digest`` of a manifest as read: what its ``digest`` should say."""
    return state_digest({k: canonical_json(manifest[k]) for k in DIGESTED if k in manifest})


def sealed_bytes(manifest: dict, *, sign: Any = None, done: dict[str, str] | None = None) -> bytes:
    """``seal(manifest, sign=sign)`` and the bytes of its file, from one serialization.

    ``done`` holds fields already serialized by ``canonical_json`` (a recording serializes the
    state trees once, for the state digest, and reuses them here). The file is the canonical
    JSON with ``sha256`` (and ``hmac``) put first: a reader's ``canonical_bytes`` of the
    parsed file gives back exactly the bytes that were hashed.

    >>> m = {"block": "b", "epoch": 1, "objects": {"t": "list", "v": [1.5]}}
    >>> data = sealed_bytes(dict(m), done={"objects": canonical_json(m["objects"])})
    >>> json.loads(data) == seal(dict(m))
    True
    """
    manifest["format"] = FORMAT
    done = done or {}
    fields = sorted((k, v) for k, v in manifest.items() if k not in _UNSIGNED)  # keys are unique: v is never compared
    text = "{" + ",".join(f"{canonical_json(k)}:{done[k] if k in done else canonical_json(v)}"
                          for k, v in fields) + "}"
    data = text.encode()
    manifest["sha256"] = hashlib.sha256(data).hexdigest()
    head = {"sha256": manifest["sha256"]}
    if sign is not None:
        mac = sign(data)
        if mac is not None:
            manifest["hmac"] = head["hmac"] = mac
    first = ",".join(f"{canonical_json(k)}:{canonical_json(v)}" for k, v in head.items())
    return ("{" + first + "," + text[1:]).encode()


def has_pickles(node: Any) -> bool:
    """Whether a node tree holds a pickled leaf."""
    if isinstance(node, dict):
        return node.get("t") == "pickle" or any(has_pickles(v) for v in node.values())
    if isinstance(node, list):
        return any(has_pickles(v) for v in node)
    return False


class _Bad(Exception):
    """A structural problem at a path of the tree; turned into one CheckpointError."""


def _fail(path: str, text: str) -> NoReturn:
    raise _Bad(f"{path or '<root>'}: {text}")


def _int(value: Any, path: str, what: str, *, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        _fail(path, f"{what} is {value!r:.40}, expected a whole number >= {low}")
    return value


def _str(value: Any, path: str, what: str, pattern: re.Pattern | None = None) -> str:
    if not isinstance(value, str) or (pattern is not None and not pattern.match(value)):
        _fail(path, f"{what} is {value!r:.60}, which is not valid here")
    return value


def _hash(node: dict, path: str) -> None:
    if not is_blob_hash(node.get("h")):
        _fail(path, f"the blob hash {node.get('h')!r:.60} is not a blob hash")
    if "o" in node or "n" in node or "x" in node:  # a small leaf inside a pack (flor.state.hash_and_pack)
        _int(node.get("o"), path, "the offset in its pack")
        _int(node.get("n"), path, "the size in its pack", high=_MAX_PACKED)
        if not is_blob_hash(node.get("x")):
            _fail(path, f"the leaf hash {node.get('x')!r:.60} is not a blob hash")


def _np_dtype(text: Any, path: str) -> None:
    import numpy as np

    _str(text, path, "the numpy dtype", _NP_DTYPE)
    try:
        dt = np.dtype(text)
    except (TypeError, ValueError):
        _fail(path, f"the numpy dtype {text!r} is unknown")
    if dt.kind not in NP_KINDS or dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        _fail(path, f"the numpy dtype {text!r} is not an allowed kind (bool, numbers, strings, dates)")


def _shape(shape: Any, path: str) -> int:
    if not isinstance(shape, list) or len(shape) > 64:
        _fail(path, f"the shape {shape!r:.60} is not a list of at most 64 sizes")
    n = 1
    for d in shape:
        n *= _int(d, path, "a dimension", high=_MAX_ELEMENTS)
        if n > _MAX_ELEMENTS:
            _fail(path, f"the shape {shape} has more than 2**48 elements")
    return n


def dense_stride(shape: Any, stride: Any) -> bool:
    """Whether ``stride`` lays ``shape`` out densely, without overlap, in an order other than
    row-major (channels_last, a transposed matrix): the layouts a tensor node keeps as its
    ``"stride"``, which take exactly the tensor's bytes (a damaged one cannot make a replay
    allocate more).

    >>> dense_stride([2, 3, 4, 5], [60, 1, 15, 3]), dense_stride([2, 3], [3, 1]), dense_stride([2, 3], [1, 1])
    (True, False, False)
    """
    if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride) \
            or not all(type(d) is int and d >= 0 for d in shape) or not all(type(s) is int and s >= 0 for s in stride):
        return False
    if 0 in shape:
        return False
    expected = 1
    for s, d in sorted((s, d) for s, d in zip(stride, shape) if d != 1):  # innermost first
        if s != expected:
            return False
        expected *= d
    return not _row_major(shape, stride)


def _row_major(shape: list, stride: list) -> bool:
    """Whether a dense ``stride`` is row-major (a contiguous tensor's, dims of size 1 aside)."""
    expected = 1
    for s, d in zip(reversed(stride), reversed(shape)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _children(node: dict, key: str, path: str) -> list:
    value = node.get(key)
    if not isinstance(value, list):
        _fail(path, f"{node['t']!r} node's {key!r} is {type(value).__name__}, expected a list")
    return value


def check_node(node: Any, path: str = "", depth: int = 0) -> None:
    """Raise ``_Bad`` naming the first problem of a node tree (``flor.state``'s node forms)."""
    if depth > _MAX_DEPTH:
        _fail(path, f"nested more than {_MAX_DEPTH} levels deep")
    if node is None or isinstance(node, (bool, int, str)):
        return
    if isinstance(node, float):
        return
    if not isinstance(node, dict):
        _fail(path, f"a {type(node).__name__} where a node belongs")
    kind = node.get("t")
    if not isinstance(kind, str):
        _fail(path, f"a node without a kind ('t' is {kind!r:.40})")
    check = _KINDS.get(kind)
    if check is None:
        _fail(path, f"unknown node kind {kind!r:.40} (from another flor version, or damaged)")
    check(node, path, depth + 1)


def _seq(node: dict, path: str, depth: int) -> None:
    for i, child in enumerate(_children(node, "v", path)):
        check_node(child, f"{path}[{i}]", depth)


def _mapping(node: dict, path: str, depth: int) -> None:
    keys, values = _children(node, "k", path), _children(node, "v", path)
    if len(keys) != len(values):
        _fail(path, f"{len(keys)} keys but {len(values)} values")
    for i, (k, v) in enumerate(zip(keys, values)):
        check_node(k, f"{path}.<key {i}>", depth)
        if isinstance(k, dict) and k.get("t") not in ("tuple", "frozenset", "enum", "complex", "bytes", "path",
                                                       "datetime", "date", "time", "timedelta", "decimal", "uuid",
                                                       "npscalar", "namedtuple", "torchdtype", "torchdevice"):
            _fail(path, f"a dict key of kind {k.get('t')!r} cannot be hashed")
        check_node(v, f"{path}.{k if isinstance(k, (str, int)) else i}", depth)
    if "meta" in node:
        check_node(node["meta"], f"{path}._metadata", depth)


def _attrs(node: dict, path: str, depth: int) -> None:
    _str(node.get("cls"), path, "the class name", _CLS)
    inner = node.get("v")
    if not isinstance(inner, dict) or inner.get("t") != "dict":
        _fail(path, f"{node['t']!r} node's attributes are not a dict node")
    for k in _children(inner, "k", path):
        if not isinstance(k, str) or not k.isidentifier():
            _fail(path, f"attribute name {k!r:.40} is not an identifier")
    _mapping(inner, path, depth)


def _tensor(node: dict, path: str, depth: int) -> None:
    _hash(node, path)
    dtype = _str(node.get("dtype"), path, "the torch dtype")
    if dtype not in TORCH_DTYPES:
        _fail(path, f"the torch dtype {dtype!r:.40} is not one flor stores")
    _shape(node.get("shape"), path)
    _str(node.get("device", "cpu"), path, "the device", _DEVICE)
    rg = node.get("rg", False)
    if not isinstance(rg, bool) or (rg and not (dtype.startswith(("float", "complex", "bfloat")))):
        _fail(path, f"requires_grad {rg!r:.20} does not fit dtype {dtype}")
    if "stride" in node and not dense_stride(node.get("shape"), node["stride"]):
        _fail(path, f"the strides {node['stride']!r:.60} are not a dense layout of shape {node.get('shape')!r:.60}")


def _ndarray(node: dict, path: str, depth: int) -> None:
    _hash(node, path)
    _np_dtype(node.get("dtype"), path)
    _shape(node.get("shape"), path)


def _npscalar(node: dict, path: str, depth: int) -> None:
    _np_dtype(node.get("dtype"), path)
    check_node(node.get("v"), path, depth)


def _with_v(node: dict, path: str, depth: int) -> None:
    if "v" not in node:
        _fail(path, f"{node['t']!r} node has no value")
    check_node(node["v"], path, depth)


def _stateful(node: dict, path: str, depth: int) -> None:
    _str(node.get("cls"), path, "the class name", _CLS)
    if ("frozen" in node) != ("eval" in node):  # a module's node has both, any other neither
        _fail(path, "a module's frozen parameters and its modules in eval mode are not both given")
    if "frozen" in node:  # a module's parameters that do not require grad, by state_dict name
        frozen = node["frozen"]
        if not isinstance(frozen, list):
            _fail(path, "the frozen parameters are not a list")
        for name in frozen:
            _str(name, path, "a frozen parameter's name", _PARAM)
    if "eval" in node:  # a module's submodules in eval mode, by name ("" for itself)
        evaluating = node["eval"]
        if not isinstance(evaluating, list) or len(evaluating) > _MAX_MODULES:
            _fail(path, "the modules in eval mode are not a list")
        for name in evaluating:
            if name != "":
                _str(name, path, "the name of a module in eval mode", _PARAM)
    if "aux" in node:  # a module's tensors outside its state_dict, by dotted name
        aux = node["aux"]
        if not isinstance(aux, dict) or aux.get("t") != "dict":
            _fail(path, "a module's tensors outside its state_dict are not a dict node")
        for name, value in zip(_children(aux, "k", path), _children(aux, "v", path)):
            _str(name, path, "a module tensor's name", _PARAM)
            if not isinstance(value, dict) or value.get("t") != "tensor":
                _fail(path, f"the module tensor {name!r:.60} is not a tensor node")
        _mapping(aux, f"{path}.<aux>", depth)
    _with_v(node, path, depth)


def _generator(node: dict, path: str, depth: int) -> None:
    _str(node.get("device"), path, "the device", _DEVICE)
    state = node.get("v")
    if not isinstance(state, dict) or state.get("t") != "tensor" or state.get("dtype") != "uint8":
        _fail(path, "a torch Generator's state is not a uint8 tensor")
    _tensor(state, path, depth)


def _npbitgen(node: dict, path: str, depth: int) -> None:
    _str(node.get("cls"), path, "the bit generator", re.compile("^(" + "|".join(NP_BITGENS) + ")$"))
    _with_v(node, path, depth)


def _pickle(node: dict, path: str, depth: int) -> None:
    _hash(node, path)
    _str(node.get("cls"), path, "the class name", _CLS)
    _str(node.get("sha256"), path, "the pickle's sha256", _HEX64)


def _complex(node: dict, path: str, depth: int) -> None:
    v = node.get("v")
    if not (isinstance(v, list) and len(v) == 2 and all(type(x) in (int, float) for x in v)):
        _fail(path, f"a complex number is {v!r:.40}, expected [real, imag]")


def _text(node: dict, path: str, depth: int) -> None:
    v = node.get("v")
    if not isinstance(v, str) or len(v) > 4096:
        _fail(path, f"{node['t']!r} node's value is {v!r:.40}, expected a string")
    if node["t"] == "path":
        _str(node.get("cls"), path, "the path class", re.compile("^(" + "|".join(PATH_CLASSES) + ")$"))
    if "tz" in node and node["tz"] is not None:
        _str(node["tz"], path, "the time zone", re.compile(r"^[A-Za-z0-9_+\-/]{1,64}$"))


def _timedelta(node: dict, path: str, depth: int) -> None:
    v = node.get("v")
    if not (isinstance(v, list) and len(v) == 3 and all(type(x) is int and abs(x) < 10**12 for x in v)):
        _fail(path, f"a timedelta is {v!r:.40}, expected [days, seconds, microseconds]")


def _enum(node: dict, path: str, depth: int) -> None:
    _str(node.get("cls"), path, "the enum class", _CLS)
    if "v" in node:  # a Flag, by its value
        _int(node["v"], path, "the flag value", high=1 << 64)
    else:
        _str(node.get("name"), path, "the member name", re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$"))


def _namedtuple(node: dict, path: str, depth: int) -> None:
    _str(node.get("cls"), path, "the class name", _CLS)
    names = _children(node, "k", path)
    if not all(isinstance(k, str) and k.isidentifier() for k in names) or len(names) != len(_children(node, "v", path)):
        _fail(path, "a namedtuple's field names do not match its values")
    _seq(node, path, depth)


def _bytes(node: dict, path: str, depth: int) -> None:
    _hash(node, path)


def _deque(node: dict, path: str, depth: int) -> None:
    maxlen = node.get("maxlen")
    if maxlen is not None:
        _int(maxlen, path, "a deque's maxlen", high=1 << 62)
    _seq(node, path, depth)


def _defaultdict(node: dict, path: str, depth: int) -> None:
    if node.get("factory") not in DEFAULT_FACTORIES:
        _fail(path, f"a defaultdict's factory {node.get('factory')!r:.40} is not one flor stores")
    _mapping(node, path, depth)


_KINDS = {
    "list": _seq, "tuple": _seq, "set": _seq, "frozenset": _seq, "deque": _deque,
    "dict": _mapping, "odict": _mapping, "defaultdict": _defaultdict,
    "tensor": _tensor, "ndarray": _ndarray, "npscalar": _npscalar,
    "stateful": _stateful, "generator": _generator,
    "pyrandom": _with_v, "nprandomstate": _with_v, "npgenerator": _with_v, "npbitgen": _npbitgen,
    "object": _attrs, "dataclass": _attrs,
    "pickle": _pickle,
    "complex": _complex, "bytes": _bytes, "bytearray": _bytes,
    "path": _text, "datetime": _text, "date": _text, "time": _text, "decimal": _text, "uuid": _text,
    "npdtype": _text, "torchdevice": _text, "torchdtype": _text,
    "timedelta": _timedelta, "enum": _enum, "namedtuple": _namedtuple,
}


def _number(value: Any, path: str, what: str) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        _fail(path, f"{what} is {value!r:.40}, expected a non-negative number")


#: the parts of a manifest's "watch" (flor.watch.variables): {name: node}, {name: {path: node}}, [names]
_WATCH_PARTS = {"vars": 1, "globals": 1, "attrs": 2, "named": 0}


def _watch(watch: Any) -> None:
    """The shape of a manifest's ``watch``: the variables, globals and attributes a block run changed
    outside ``end()`` (plain-value nodes under string names; ``flor.watch.plain.decode`` checks the
    nodes, ``flor.watch.variables`` the names) and the names ever noted for the block."""
    if not isinstance(watch, dict) or not set(watch) <= set(_WATCH_PARTS):
        _fail("watch", "the noted state is not a dict of vars, globals, attrs and named")
    for part, levels in _WATCH_PARTS.items():
        found = watch.get(part, [] if levels == 0 else {})
        if levels == 0:
            if not isinstance(found, list) or not all(isinstance(n, str) and len(n) <= 400 for n in found):
                _fail(f"watch.{part}", "not a list of names")
            continue
        if not isinstance(found, dict) or not all(isinstance(k, str) and len(k) <= 400 for k in found):
            _fail(f"watch.{part}", "not a dict of names")
        if levels == 2 and not all(isinstance(v, dict) and all(isinstance(k, str) and len(k) <= 400 for k in v)
                                   for v in found.values()):
            _fail(f"watch.{part}", "not a dict of attribute paths")


def check_manifest(obj: Any, where: str, *, block: str | None = None, epoch: int | None = None,
                   occurrence: int | None = None, check_sum: bool = True) -> dict:
    """Return ``obj`` when it is a well-formed manifest whose checksum holds; else a
    CheckpointError naming ``where`` (the file) and the problem.

    ``block``, ``epoch`` and ``occurrence``, when given, must be the ones the manifest says it
    is of (a manifest copied over another epoch's file would restore the wrong state).
    """
    fmt = obj.get("format") if isinstance(obj, dict) else None
    if type(fmt) is int and 1 <= fmt < FORMAT:
        raise CheckpointError(f"checkpoint manifest {where} was recorded by flor older than 0.1.0 (format {fmt}); "
                              f"record again: this flor reads format {FORMAT} only")
    if type(fmt) is int and FORMAT < fmt < 1000:
        raise CheckpointError(f"checkpoint manifest {where} was written by a newer flor (format {fmt}; this flor "
                              f"reads format {FORMAT}): upgrade flor to replay it")
    try:
        if not isinstance(obj, dict):
            _fail("", f"expected a JSON object, found {type(obj).__name__}")
        if fmt != FORMAT or type(fmt) is not int:
            _fail("format", f"format {fmt!r:.20} is not a manifest format")
        if not is_block_name(obj.get("block")):
            _fail("block", f"the block name {obj.get('block')!r:.60} is not valid")
        if obj.get("epoch") is not None:
            _int(obj["epoch"], "epoch", "the epoch")
        _int(obj.get("occurrence"), "occurrence", "the occurrence")
        _int(obj.get("count"), "count", "the object count", high=1 << 20)
        for name in ("bytes", "new_bytes"):
            if name in obj:
                _int(obj[name], name, name)
        for name in ("block_s", "snapshot_s", "created"):
            if name in obj:
                _number(obj[name], name, name)
        if "digest" in obj and not is_blob_hash(obj["digest"]):
            _fail("digest", f"the state digest {obj['digest']!r:.60} is not a hash")
        for name in ("objects", "rng"):
            if name not in obj:
                _fail(name, "missing")
        objects = obj["objects"]
        if not isinstance(objects, dict) or objects.get("t") != "list":
            _fail("objects", "the objects given to end() are not a list node")
        check_node(objects, "objects")
        if len(objects["v"]) != obj["count"]:
            _fail("count", f"{obj['count']} objects announced, {len(objects['v'])} stored")
        for name in ("rng", "rng_start"):
            if name not in obj:
                continue
            rng = obj[name]
            if not isinstance(rng, dict) or rng.get("t") != "dict":
                _fail(name, "the random state is not a dict node")
            check_node(rng, name)
            if not {"python", "numpy", "torch"} <= {k for k in rng["k"] if isinstance(k, str)}:
                _fail(name, "the random state lacks the python, numpy or torch generator")
        if "watch" in obj:  # what flor.watch noted of the block run outside end(): plain nodes by name
            _watch(obj["watch"])
        if "grads" in obj:  # the modules' gradients (flor.state.grads): {where: {parameter: tensor}}
            grads = obj["grads"]
            if not isinstance(grads, dict) or grads.get("t") != "dict":
                _fail("grads", "the gradients are not a dict node")
            check_node(grads, "grads")
        _str(obj.get("sha256"), "sha256", "the manifest checksum", _HEX64)
        if "hmac" in obj:
            mac = obj["hmac"]
            if not (isinstance(mac, dict) and set(mac) == {"key", "mac"} and isinstance(mac["key"], str)
                    and _KEY_ID.match(mac["key"]) and isinstance(mac["mac"], str) and _HEX64.match(mac["mac"])):
                _fail("hmac", "the signature is not {key: 16 hex digits, mac: 64 hex digits}")
        if block is not None and obj["block"] != block:
            _fail("block", f"the manifest is of block {obj['block']!r}, its file of {block!r}")
        if (epoch, occurrence) != (None, None) or block is not None:
            if obj.get("epoch") != epoch or obj["occurrence"] != (occurrence or 0):
                _fail("epoch", f"the manifest is of epoch {obj.get('epoch')} (occurrence {obj['occurrence']}), "
                      f"its file of epoch {epoch} (occurrence {occurrence or 0})")
    except _Bad as exc:
        raise CheckpointError(f"checkpoint manifest {where} is damaged ({exc}); that checkpoint cannot be "
                              "used (`flor verify NAME` lists every problem)") from None
    if check_sum:
        actual = hashlib.sha256(canonical_bytes(obj)).hexdigest()
        if actual != obj["sha256"]:
            raise CheckpointError(
                f"checkpoint manifest {where} was changed after it was written: its content hashes to "
                f"{actual[:16]}..., its checksum says {obj['sha256'][:16]}...; that checkpoint cannot be used")
    return obj
