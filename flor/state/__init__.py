"""Capture and restore the state of the objects given to ``SkipBlock.end`` and of the RNGs.

State is encoded as a JSON tree whose tensor leaves point at raw-byte blobs by hash, so
modules, optimizers, schedulers, grad scalers and RNG states never go through pickle, nor do
the common plain leaves (``flor.leaves``: complex, pathlib paths, dates and times, decimals,
UUIDs, enums; here: bytes, sets, namedtuples, dataclasses, torch and numpy dtypes, devices,
numpy generators). Only what remains falls back to cloudpickle (``{"t": "pickle"}``), with a
warning once per type; a replay loads such a leaf only when ``PickleTrust`` allows it (a
manifest signed with the user's key, or ``--flor_trust_pickles``), since loading a pickle
can run code. Everything read back is checked: a damaged tree is a ``StateError`` or
``CheckpointError``, never an internal exception.

Node forms (plain JSON values stand for themselves: None, bool, int, float, str)::

    {"t": "list"|"tuple", "v": [node...]}
    {"t": "dict"|"odict", "k": [node...], "v": [node...], "meta": node?}
    {"t": "tensor", "h": hash, "dtype": str, "shape": [int], "device": str, "rg": bool}
    {..., "stride": [int]}                         a dense layout other than row-major (channels_last):
                                                   the bytes are row-major, a restore lays them out so
    {"t": "ndarray", "h": hash, "dtype": str, "shape": [int]}
    {"t": "npscalar", "dtype": str, "v": value}
    {"t": "stateful", "cls": str, "v": node}       state_dict()/load_state_dict(); a module's also
    {..., "frozen": [str]}                         its parameters that do not require grad
    {..., "eval": [str]}                           its submodules in eval mode ("" itself)
    {"t": "generator", "device": str, "v": node}   torch.Generator
    {"t": "pyrandom"|"nprandomstate"|"npgenerator", "v": node}
    {"t": "npbitgen", "cls": "PCG64"|..., "v": node}
    {"t": "object", "cls": str, "v": node}         restored attribute by attribute, in place
    {"t": "dataclass", "cls": str, "v": node}      in place, or a new one when frozen
    {"t": "namedtuple", "cls": str, "k": [str], "v": [node...]}
    {"t": "set"|"frozenset", "v": [node...]}       members in a fixed order
    {"t": "bytes"|"bytearray", "h": hash}
    {"t": "torchdtype"|"torchdevice"|"npdtype", "v": str}
    {"t": "pickle", "h": hash, "cls": str, "sha256": hex}
    flor.leaves' plain leaves: complex, path, datetime, date, time, timedelta, decimal, uuid, enum

A leaf of under ``PACK_LEAF_BYTES`` recorded by a checkpoint (every leaf, where they add up
to at most ``PACK_ALL_BYTES``) lives in a pack, one blob per checkpoint holding its leaves end
to end: its node adds ``"o"`` and ``"n"`` (offset and size in the pack named by ``"h"``) and
``"x"`` (the leaf's own hash).

Capture is split in two so the training thread pays only for copies: ``snapshot`` builds the
tree and copies every tensor (``Pending``); ``hash_and_pack`` (or ``Pending.materialize``)
hashes and stores them, normally on the background writer.

The modules: ``encode`` (``snapshot``), ``cache`` (its fast path, ``TreeCache``), ``pending``
(buffers, ``Pending``, packs), ``decode`` (``decode``, ``restore``, ``PickleTrust``), ``rng``
(the global generators), ``compare`` (``diff_nodes``), ``nodes`` (what they share).
"""

from __future__ import annotations

from .cache import TreeCache
from .compare import diff_nodes, diff_rng
from .decode import REFUSE_PICKLES, PickleTrust, decode, restore, restore_all
from .encode import snapshot, snapshot_rng
from .nodes import Loader
from .pending import PACK_ALL_BYTES, PACK_LEAF_BYTES, BufferPool, PackIndex, Pending, hash_and_pack
from .rng import RNG_BYTES, capture_rng, cuda_undrawn, restore_rng, same_rng

__all__ = [
    "BufferPool",
    "Loader",
    "PACK_ALL_BYTES",
    "PACK_LEAF_BYTES",
    "PackIndex",
    "Pending",
    "PickleTrust",
    "REFUSE_PICKLES",
    "RNG_BYTES",
    "TreeCache",
    "capture_rng",
    "cuda_undrawn",
    "same_rng",
    "decode",
    "diff_nodes",
    "diff_rng",
    "hash_and_pack",
    "restore",
    "restore_all",
    "restore_rng",
    "snapshot",
    "snapshot_rng",
]
