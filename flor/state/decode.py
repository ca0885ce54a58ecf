"""Reading a state tree back: ``decode`` makes new values, ``restore`` puts them into the live
objects in place where it can, ``restore_all`` sets the random generators last. Pickled
leaves load only as ``PickleTrust`` allows; a damaged tree is a ``StateError`` or
``CheckpointError``, never an internal exception.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ..errors import CheckpointError, FlorError, StateError
from ..leaves import LEAF_KINDS, decode_leaf, find_class, qualname
from ..store.manifest import DEFAULT_FACTORIES, NP_BITGENS, NP_KINDS, dense_stride
from .nodes import Loader, DTYPES, set_eval, set_frozen
from .rng import as_tuple, restore_rng

__all__ = ["PickleTrust", "REFUSE_PICKLES", "decode", "restore", "restore_all"]


@dataclass(frozen=True)
class PickleTrust:
    """Whether a replay may load pickled leaves (a pickle can run code), and if not, why not.

    ``allowed``: the manifest is signed with the user's key, or the user passed
    ``--flor_trust_pickles``. ``why`` and ``key_file`` make the refusal say how to allow it.
    """

    allowed: bool = False
    why: str = "nothing allowed it"
    key_file: str = "~/.config/flor/key"

    def check(self, path: str, cls: str) -> None:
        if self.allowed:
            return
        raise StateError(
            f"{path or 'a leaf'} is a pickled {cls} in this checkpoint, and flor loads pickles from a store only "
            f"when told to (loading one can run any code); not loaded because {self.why}. If you trust whoever "
            "can write to this store, replay with --flor_trust_pickles (or FLOR_TRUST_PICKLES=1); or put the "
            f"recording machine's key in {self.key_file}, so its signature verifies here"
        )


REFUSE_PICKLES = PickleTrust()


_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "npu")


def _torch_dtype(name: Any, path: str) -> torch.dtype:
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise CheckpointError(f"{path or 'a tensor'}: dtype {name!r:.40} is not one flor stores; the checkpoint "
                              "is damaged")
    return dtype


def _np_dtype(text: Any, path: str) -> np.dtype:
    try:
        dtype = np.dtype(text) if isinstance(text, str) and len(text) <= 16 else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in NP_KINDS or dtype.hasobject or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise CheckpointError(f"{path or 'an array'}: numpy dtype {text!r:.40} is not one flor stores; the "
                              "checkpoint is damaged")
    return dtype


def _sized(node: dict, itemsize: int, data: bytes, path: str) -> list[int]:
    """The node's shape, once it is checked against the blob it describes."""
    shape = node.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 64:
        raise CheckpointError(f"{path or 'a tensor'}: shape {shape!r:.60} is not a list of sizes; the checkpoint "
                              "is damaged")
    numel = 1
    for d in shape:
        numel *= d
    if numel * itemsize != len(data):
        raise CheckpointError(f"{path or 'a tensor'}: shape {shape} of {itemsize}-byte items needs "
                              f"{numel * itemsize} bytes, its blob has {len(data)}; the checkpoint is damaged")
    return shape


def _leaf_bytes(node: dict, load: Loader, path: str) -> bytes:
    """A leaf's bytes: its blob, or its slice of a pack (``"o"``, ``"n"``; see ``hash_and_pack``)."""
    data = load(node["h"])
    if "o" not in node and "n" not in node:
        return data
    off, n = node.get("o"), node.get("n")
    if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > len(data):
        raise CheckpointError(f"{path or 'a leaf'}: offset {off!r:.20} and size {n!r:.20} do not lie inside its "
                              f"{len(data)}-byte pack; the checkpoint is damaged")
    return data[off:off + n]


def _decode_tensor(node: dict, load: Loader, *, to_device: bool, path: str = "") -> torch.Tensor:
    dtype = _torch_dtype(node.get("dtype"), path)
    data = _leaf_bytes(node, load, path)
    shape = _sized(node, torch.empty(0, dtype=dtype).element_size(), data, path)
    if len(data) == 0:
        t = torch.empty(shape, dtype=dtype)
    else:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    if "stride" in node:  # the recorded layout: a fused optimizer reads a moment's memory in its parameter's order
        if not dense_stride(shape, node["stride"]):
            raise CheckpointError(f"{path or 'a tensor'}: strides {node['stride']!r:.60} are not a dense layout of "
                                  f"shape {shape}; the checkpoint is damaged")
        t = torch.empty_strided(shape, node["stride"], dtype=dtype).copy_(t)
    device = node.get("device", "cpu")
    if to_device and device != "cpu":
        if not isinstance(device, str) or device.partition(":")[0] not in _DEVICE_TYPES:
            raise CheckpointError(f"{path or 'a tensor'}: device {device!r:.40} is not a device; the checkpoint is "
                                  "damaged")
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError) as exc:
            raise StateError(
                f"a tensor was recorded on {device}, which this process cannot use ({exc}); "
                "replay on a machine with that device"
            ) from exc
    if node.get("rg") is True and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _unpickle(node: dict, load: Loader, path: str, pickles: PickleTrust) -> Any:
    pickles.check(path, str(node.get("cls")))  # before its bytes are even fetched
    data = _leaf_bytes(node, load, path)
    if hashlib.sha256(data).hexdigest() != node.get("sha256"):
        raise CheckpointError(f"{path or 'a leaf'}: the pickled {node.get('cls')}'s bytes do not match the SHA-256 "
                              "its manifest names; not loaded")
    import cloudpickle

    return cloudpickle.loads(data)  # allowed: the manifest is signed with our key, or the user opted in


def decode(node: Any, load: Loader, *, to_device: bool = False, path: str = "",
           pickles: PickleTrust = REFUSE_PICKLES) -> Any:
    """Rebuild plain values from a node (tensors on CPU unless ``to_device``).

    Pickled leaves load only as ``pickles`` allows; a damaged node is a StateError or
    CheckpointError naming ``path``.
    """
    try:
        return _decode(node, load, to_device, path, pickles)
    except FlorError:
        raise
    except Exception as exc:  # data from a store: whatever it makes fail is named
        raise StateError(f"cannot decode {path or 'a value'} ({type(exc).__name__}: {exc}); the checkpoint is "
                         "damaged, or from another flor") from exc


def _decode(node: Any, load: Loader, to_device: bool, path: str, pickles: PickleTrust, live: Any = None) -> Any:
    if not isinstance(node, dict):
        return node
    kind = node["t"]
    if kind in ("list", "tuple", "set", "frozenset", "deque"):
        items = [_decode(x, load, to_device, f"{path}[{i}]", pickles) for i, x in enumerate(node["v"])]
        if kind == "deque":
            return deque(items, node.get("maxlen"))
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind in ("dict", "odict", "defaultdict"):
        pairs = ((_decode(k, load, to_device, f"{path}.<key>", pickles),
                  _decode(v, load, to_device, f"{path}.{k}", pickles)) for k, v in zip(node["k"], node["v"]))
        if kind == "defaultdict":
            return defaultdict(DEFAULT_FACTORIES[node.get("factory")], pairs)
        out: Any = (OrderedDict if kind == "odict" else dict)(pairs)
        if "meta" in node:
            out._metadata = _decode(node["meta"], load, False, path, pickles)
        return out
    if kind == "tensor":
        return _decode_tensor(node, load, to_device=to_device, path=path)
    if kind == "ndarray":
        dtype = _np_dtype(node.get("dtype"), path)
        data = _leaf_bytes(node, load, path)
        return np.frombuffer(bytearray(data), dtype=dtype).reshape(_sized(node, dtype.itemsize, data, path)).copy()
    if kind == "npscalar":
        dtype = _np_dtype(node.get("dtype"), path)
        if dtype.kind in "mM":
            return np.array(int(node["v"]), dtype=np.int64).view(dtype)[()]
        return dtype.type(_decode(node["v"], load, False, path, pickles))
    if kind in LEAF_KINDS:
        return decode_leaf(node, live, path)
    if kind in ("bytes", "bytearray"):
        return (bytes if kind == "bytes" else bytearray)(_leaf_bytes(node, load, path))
    if kind == "torchdtype":
        return _torch_dtype(node["v"], path)
    if kind == "torchdevice":
        if not isinstance(node["v"], str) or node["v"].partition(":")[0] not in _DEVICE_TYPES:
            raise CheckpointError(f"{path}: {node['v']!r:.40} is not a device; the checkpoint is damaged")
        return torch.device(node["v"])
    if kind == "npdtype":
        return _np_dtype(node["v"], path)
    if kind == "namedtuple":
        cls = cast("type[tuple]", find_class(node["cls"], live,
                                             lambda c: issubclass(c, tuple) and hasattr(c, "_fields"), path))
        old = live if isinstance(live, tuple) else ()
        items = [_restore(old[i] if i < len(old) else None, n, load, f"{path}.{k}", pickles)
                 for i, (k, n) in enumerate(zip(node["k"], node["v"]))]
        return tuple.__new__(cls, items)
    if kind == "dataclass":
        cls = find_class(node["cls"], live, dataclasses.is_dataclass, path)
        return _fill(cls.__new__(cls), node, load, path, pickles, in_place=False)
    if kind == "npgenerator":
        state = _decode(node["v"], load, False, path, pickles)
        name = state.get("bit_generator") if isinstance(state, dict) else None
        if name not in NP_BITGENS:
            raise CheckpointError(f"{path}: bit generator {name!r:.40} is not a numpy one; the checkpoint is damaged")
        gen = np.random.Generator(getattr(np.random, name)())
        gen.bit_generator.state = state
        return gen
    if kind == "npbitgen":
        if node.get("cls") not in NP_BITGENS:
            raise CheckpointError(f"{path}: bit generator {node.get('cls')!r:.40} is not a numpy one")
        bitgen = getattr(np.random, node["cls"])()
        bitgen.state = _decode(node["v"], load, False, path, pickles)
        return bitgen
    if kind == "pickle":
        return _unpickle(node, load, path, pickles)
    raise StateError(f"cannot decode a {kind!r:.40} node outside a live object ({path or 'a value'}); the "
                     "checkpoint is from another flor, or damaged")


def _fill(target: Any, node: dict, load: Loader, path: str, pickles: PickleTrust, *, in_place: bool) -> Any:
    """Set the attributes of an ``object``/``dataclass`` node on ``target``: through its own
    ``setattr`` in place, or with ``object.__setattr__`` on a new (maybe frozen) instance."""
    attrs = node["v"]
    for k_node, v_node in zip(attrs["k"], attrs["v"]):
        if not isinstance(k_node, str):
            raise CheckpointError(f"{path}: attribute name {k_node!r:.40} is not a string; the checkpoint is damaged")
        current = getattr(target, k_node, _ABSENT) if in_place else _ABSENT
        value = _restore(None if current is _ABSENT else current, v_node, load, f"{path}.{k_node}", pickles)
        if current is not _ABSENT and _unchanged(current, value):
            continue  # restored in place, or equal: no setattr (a DataLoader refuses one to `dataset` once built)
        (setattr if in_place else object.__setattr__)(target, k_node, value)
    return target


_ABSENT = object()


def _unchanged(current: Any, value: Any) -> bool:
    """Whether setting ``value`` over ``current`` would change nothing: the same object (restored
    in place), or an equal value of the same plain type.

    >>> _unchanged(64, int("64")), _unchanged(1, True), _unchanged(float("nan"), float("nan"))
    (True, False, False)
    """
    if value is current:
        return True
    return type(value) is type(current) and type(value) in (int, float, str, bool, bytes) and value == current


def restore(live: Any, node: Any, load: Loader, path: str = "", *, pickles: PickleTrust = REFUSE_PICKLES) -> Any:
    """Put the state in ``node`` back into ``live`` in place where it can; return the result.

    Mutable objects come back as the same objects; immutable values come back as new ones.
    Pickled leaves load only as ``pickles`` allows.
    """
    return _restore(live, node, load, path, pickles)


def _restore(live: Any, node: Any, load: Loader, path: str, pickles: PickleTrust) -> Any:
    if not isinstance(node, dict):
        return node
    kind = node.get("t")
    try:
        if kind == "stateful":
            if not callable(getattr(live, "load_state_dict", None)):
                raise StateError(
                    f"{path} was recorded as a {node['cls']} with state_dict(); now it is a "
                    f"{qualname(live)}: pass SkipBlock.end the same objects, in the same order, as when recording"
                )
            state = _decode(node["v"], load, False, path, pickles)
            if isinstance(live, torch.optim.Optimizer):
                _same_groups(live, state, path)
            live.load_state_dict(state)
            if "frozen" in node and isinstance(live, torch.nn.Module):  # a module's node: both lists (checked)
                set_frozen(live, node["frozen"])
                set_eval(live, node["eval"])
            if "aux" in node and isinstance(live, torch.nn.Module):
                _restore_module_tensors(live, node["aux"], load, path)
            return live
        if kind == "tensor":
            value = _decode_tensor(node, load, to_device=True, path=path)
            if isinstance(live, torch.Tensor) and live.shape == value.shape and live.dtype == value.dtype:
                with torch.no_grad():
                    live.copy_(value)
                return live
            return value
        if kind == "list":
            items = [_restore(live[i] if isinstance(live, list) and i < len(live) else None, n, load, f"{path}[{i}]",
                              pickles) for i, n in enumerate(node["v"])]
            if isinstance(live, list):
                live[:] = items
                return live
            return items
        if kind == "tuple":
            old = live if isinstance(live, tuple) else ()
            return tuple(_restore(old[i] if i < len(old) else None, n, load, f"{path}[{i}]", pickles)
                         for i, n in enumerate(node["v"]))
        if kind == "set" and type(live) is set:
            live.clear()
            live.update(_decode(node, load, True, path, pickles))
            return live
        if kind == "bytearray" and type(live) is bytearray:
            live[:] = _leaf_bytes(node, load, path)
            return live
        if kind == "deque" and type(live) is deque and live.maxlen == node.get("maxlen"):
            items = _decode(node, load, True, path, pickles)
            live.clear()
            live.extend(items)
            return live
        if kind == "defaultdict" and type(live) is defaultdict \
                and live.default_factory is DEFAULT_FACTORIES[node.get("factory")]:
            items = _decode(node, load, True, path, pickles)
            live.clear()
            live.update(items)
            return live
        if kind in ("dict", "odict"):
            keys = [_decode(k, load, False, f"{path}.<key>", pickles) for k in node["k"]]
            old_map = live if isinstance(live, dict) else {}
            values = [_restore(old_map.get(k), n, load, f"{path}.{k}", pickles) for k, n in zip(keys, node["v"])]
            if isinstance(live, dict):
                live.clear()
                live.update(zip(keys, values))
                return live
            return _decode(node, load, True, path, pickles)
        if kind == "generator":
            state = _decode_tensor(node["v"], load, to_device=False, path=path)
            if isinstance(live, torch.Generator):
                live.set_state(state)
                return live
            gen = torch.Generator(device=node["device"])
            gen.set_state(state)
            return gen
        if kind == "pyrandom":
            target = live if isinstance(live, random.Random) else random.Random()
            target.setstate(as_tuple(_decode(node["v"], load, False, path, pickles)))
            return target
        if kind == "nprandomstate":
            np_target = live if isinstance(live, np.random.RandomState) else np.random.RandomState()
            np_target.set_state(_decode(node["v"], load, False, path, pickles))
            return np_target
        if kind == "npgenerator" and isinstance(live, np.random.Generator):
            live.bit_generator.state = _decode(node["v"], load, False, path, pickles)
            return live
        if kind == "npbitgen" and type(live).__name__ == node.get("cls") and isinstance(live, np.random.BitGenerator):
            live.state = _decode(node["v"], load, False, path, pickles)
            return live
        if kind == "dataclass" and live is not None and qualname(live) == node["cls"] \
                and dataclasses.is_dataclass(live) and not cast(Any, type(live)).__dataclass_params__.frozen:
            return _fill(live, node, load, path, pickles, in_place=True)
        if kind == "object":
            if live is None or not hasattr(live, "__dict__"):
                raise StateError(
                    f"{path} was recorded as a {node['cls']} but is now {live!r:.80}: pass SkipBlock.end "
                    "the same objects, in the same order, as when recording"
                )
            return _fill(live, node, load, path, pickles, in_place=True)
        return _decode(node, load, True, path, pickles, live)
    except FlorError:
        raise
    except Exception as exc:  # user objects' load_state_dict, or damaged data: named either way
        raise StateError(
            f"cannot restore {path or 'an object'} ({node.get('cls', kind)}): {type(exc).__name__}: {exc}; was the "
            "object built differently from the recording (architecture, parameter groups)?"
        ) from exc


def _restore_module_tensors(module: torch.nn.Module, node: Any, load: Loader, path: str) -> None:
    """Put back a module's tensors outside its state_dict (a "stateful" node's "aux":
    ``module_parts``), after its state_dict. The names come from a store: each must reach,
    through submodules only, a non-persistent buffer or a tensor attribute the module has now;
    another (a parameter, a method, a name the script no longer has) is left alone, never
    created.

    One that already holds the recorded value stays as it is (a view of a parameter: restored
    with it). Another is copied into in place where it has the recorded shape and dtype (what
    else holds it sees the value too), but one that shares a parameter's or buffer's memory
    is rebound to a tensor of its own: the legacy ``spectral_norm`` leaves ``weight`` over its
    ``weight_orig`` until the first forward, and writing through it would change the parameter.
    """
    if not isinstance(node, dict) or node.get("t") != "dict" or not isinstance(node.get("k"), list) \
            or not isinstance(node.get("v"), list) or len(node["k"]) != len(node["v"]):
        raise CheckpointError(f"{path}: a module's tensors outside its state_dict are not a dict; the checkpoint is "
                              "damaged")
    owned: dict[int, list[torch.Tensor]] = {}
    for t in (*module.parameters(), *module.buffers()):
        owned.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    for name, value in zip(node["k"], node["v"]):
        if not isinstance(name, str) or not isinstance(value, dict) or value.get("t") != "tensor":
            raise CheckpointError(f"{path}: module tensor {name!r:.60} is not a named tensor; the checkpoint is "
                                  "damaged")
        *parents, attr = name.split(".")
        owner: Any = module
        for part in parents:
            owner = owner._modules.get(part) if isinstance(owner, torch.nn.Module) else None
        if not isinstance(owner, torch.nn.Module) or not attr.isidentifier() or attr.startswith("__"):
            continue
        if attr in owner._non_persistent_buffers_set and isinstance(owner._buffers.get(attr), torch.Tensor):
            where = owner._buffers
        elif type(owner.__dict__.get(attr)) is torch.Tensor:
            where = owner.__dict__
        else:
            continue
        current = where[attr]
        assert current is not None  # both branches above found a tensor there
        recorded = _decode_tensor(value, load, to_device=True, path=f"{path}.{name}")
        same = current.shape == recorded.shape and current.dtype == recorded.dtype \
            and current.device == recorded.device
        if same and torch.equal(current, recorded):
            continue
        shared = any(t is not current for t in owned.get(current.untyped_storage().data_ptr(), ()))
        if same and not shared:
            with torch.no_grad():
                current.copy_(recorded)
        else:
            where[attr] = recorded


def _same_groups(live: torch.optim.Optimizer, state: Any, path: str) -> None:
    """An optimizer whose parameter groups are not the checkpoint's cannot take its state
    (torch says only "a different number of parameter groups"): name both, and the fix."""
    try:
        recorded = [len(g["params"]) for g in state["param_groups"]]
    except (KeyError, TypeError):
        return  # not an optimizer's usual state: its own load_state_dict decides
    now = [len(g["params"]) for g in live.param_groups]
    if recorded == now:
        return
    raise StateError(
        f"{path or 'the optimizer'} ({qualname(live)}) had {len(recorded)} parameter group(s) of {recorded} "
        f"parameters at this checkpoint and has {len(now)} of {now} now: code that changes the optimizer "
        "(add_param_group, a group's params) ran in the recording before this checkpoint but not in this "
        "replay, inside a block that was restored or in an epoch this worker skipped. Make the change follow "
        "from the epoch rather than from what ran before: at the top of each epoch, outside the SkipBlock, "
        "`if epoch >= K and len(opt.param_groups) == 1: opt.add_param_group(...)`"
    )


def restore_all(objs: list, objects: Any, rng: Any, load: Loader, *, pickles: PickleTrust = REFUSE_PICKLES) -> list:
    """Restore ``objs`` from ``objects`` in place, then the global RNGs from ``rng``.

    RNG state goes last: restoring an object may itself draw random numbers (a sampler
    re-seeding, a module re-initializing), and those draws must not leak into training.
    """
    restored = _restore(objs, objects, load, "", pickles)
    restore_rng(decode(rng, load, path="rng", pickles=pickles))
    return restored
