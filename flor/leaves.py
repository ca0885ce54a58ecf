"""Native JSON forms of common plain leaves, so they need no pickle (``flor.state`` uses them).

A pickle can run code when loaded, so a replay loads one only from a manifest signed with the
user's key (``flor.store.trust``). The values scripts most often pass to ``SkipBlock.end``
besides tensors and state_dicts have plain forms instead::

    {"t": "complex", "v": [re, im]}
    {"t": "path", "cls": "PosixPath", "v": "runs/a"}        pathlib classes only
    {"t": "datetime"|"date"|"time", "v": iso, "tz": zone?}  zone: a zoneinfo key
    {"t": "timedelta", "v": [days, seconds, microseconds]}
    {"t": "decimal", "v": "1.10"}   {"t": "uuid", "v": hex}
    {"t": "enum", "cls": "mod.Color", "name": "RED"}     a Flag by its value: {..., "v": 6}

Classes (of an enum, a dataclass, a namedtuple) are taken from the live object being restored
or found among the modules this process has already imported, by static lookup: a checkpoint
never makes flor import a module or run code to find one.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import inspect
import pathlib
import sys
import uuid
from typing import Any, Callable, cast

from .errors import StateError

__all__ = ["LEAF_KINDS", "decode_leaf", "encode_leaf", "find_class", "qualname", "sort_key"]

LEAF_KINDS = ("complex", "path", "datetime", "date", "time", "timedelta", "decimal", "uuid", "enum")
_PATHS = {c.__name__: c for c in (pathlib.Path, pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePath,
                                  pathlib.PurePosixPath, pathlib.PureWindowsPath)}


def qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _zone(tz: Any) -> tuple[bool, str | None]:
    """(encodable, zone key): no zone, a fixed offset (in the ISO text) or a zoneinfo zone."""
    if tz is None or type(tz) is _dt.timezone:
        return True, None
    key = getattr(tz, "key", None)
    if type(tz).__module__ == "zoneinfo" and isinstance(key, str):
        return True, key
    return False, None


def encode_leaf(obj: Any) -> dict | None:
    """The plain node of ``obj``, or None when it is not one of these leaves."""
    if isinstance(obj, enum.Flag) and isinstance(obj.value, int):  # a combination has no one name: its value
        return {"t": "enum", "cls": qualname(obj), "v": obj.value}
    if isinstance(obj, enum.Enum):
        return {"t": "enum", "cls": qualname(obj), "name": obj.name}
    if type(obj) is complex:
        return {"t": "complex", "v": [obj.real, obj.imag]}
    if type(obj) in _PATHS.values():
        return {"t": "path", "cls": type(obj).__name__, "v": str(obj)}
    if type(obj) in (_dt.datetime, _dt.time):
        ok, key = _zone(obj.tzinfo)
        if not ok:
            return None
        node = {"t": type(obj).__name__, "v": obj.isoformat()}
        if key is not None:
            node["tz"] = key
        if obj.fold:
            node["fold"] = 1
        return node
    if type(obj) is _dt.date:
        return {"t": "date", "v": obj.isoformat()}
    if type(obj) is _dt.timedelta:
        return {"t": "timedelta", "v": [obj.days, obj.seconds, obj.microseconds]}
    if type(obj) is decimal.Decimal:
        return {"t": "decimal", "v": str(obj)}
    if type(obj) is uuid.UUID:
        return {"t": "uuid", "v": obj.hex}
    return None


def decode_leaf(node: dict, live: Any, path: str) -> Any:
    """The value of a plain leaf node (``live``, the object being restored, names an enum's class)."""
    kind = node["t"]
    v: Any = node.get("v")  # data from the store: the constructor of its kind checks it
    if kind == "complex":
        return complex(float(v[0]), float(v[1]))
    if kind == "path":
        cls = _PATHS.get(node.get("cls", ""))
        if cls is None:
            raise StateError(f"{path}: {node.get('cls')!r} is not a pathlib class")
        try:
            return cls(v)
        except NotImplementedError:  # a WindowsPath recorded on Windows, replayed elsewhere
            return pathlib.PureWindowsPath(v)
    if kind in ("datetime", "time"):
        value = getattr(_dt, kind).fromisoformat(v)
        if node.get("tz"):
            import zoneinfo

            value = value.replace(tzinfo=zoneinfo.ZoneInfo(node["tz"]))
        return value.replace(fold=1) if node.get("fold") else value
    if kind == "date":
        return _dt.date.fromisoformat(v)
    if kind == "timedelta":
        return _dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    if kind == "decimal":
        return decimal.Decimal(v)
    if kind == "uuid":
        return uuid.UUID(hex=v)
    if kind == "enum":
        if "v" in node:
            flag = find_class(node["cls"], live, lambda c: issubclass(c, enum.Flag), path)
            return flag(int(node["v"]))
        enum_cls = cast("type[enum.Enum]", find_class(node["cls"], live, lambda c: issubclass(c, enum.Enum), path))
        try:
            return enum_cls.__members__[node["name"]]
        except KeyError:
            raise StateError(f"{path}: the enum {node['cls']} has no member {node['name']!r} now; was it "
                             "renamed since the recording?") from None
    raise StateError(f"{path}: {kind!r} is not a plain leaf")


def find_class(name: str, live: Any, ok: Callable[[type], bool], path: str) -> type:
    """The class called ``name`` (``module.Qual.Name``): ``live``'s own when it matches, else one
    already imported (looked up statically: nothing is imported, no ``__getattr__`` runs)."""
    if live is not None and qualname(live) == name and ok(type(live)):
        return type(live)
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[i:]:
            if attr.startswith("__") or "<" in attr:
                obj = None
                break
            obj = inspect.getattr_static(obj, attr, None)
        if isinstance(obj, type) and ok(obj):
            return obj
        break
    raise StateError(
        f"cannot restore {path or 'a value'}: its class {name} is not loaded in this process, or is no longer "
        "that kind of class (flor never imports a module a checkpoint names); pass SkipBlock.end the same "
        "objects, in the same order, as when recording"
    )


def sort_key(item: Any) -> tuple[str, str]:
    """An order for the members of a set that is the same in every process (a set of strings
    iterates in a per-process order), so the same set has the same digest."""
    try:
        return type(item).__qualname__, repr(item)
    except Exception:  # noqa: BLE001 - a repr that fails: keep the iteration order for it
        return type(item).__qualname__, ""
