"""Attributes: of the script's own objects (plain data, noted and restored like variables) and
of modules given to ``end()`` (named: a state_dict does not hold them)."""

from __future__ import annotations

from typing import Any, Collection

from .frames import own_object, OWN_TYPES, plain_now, skipped_name
from .limits import LIMITS
from .plain import encode
from .probe import Probe, Say, View

__all__ = ["ModuleAttrProbe", "object_attrs", "restore_attrs"]




def object_attrs(variables: dict[str, Any], skip: Collection[int] = ()) -> dict[str, dict[str, Any]]:
    """``{variable: {attribute: encoded}}`` of the plain-data attributes of the script's own
    objects among ``variables`` (``own_object``: ``self`` in a Trainer's method), and of such
    objects they hold (``"state.global_step"``, ``LIMITS.attr_depth`` names deep), but for those whose
    ids are in ``skip`` (given to ``end()``: checkpointed whole)."""
    out: dict[str, dict[str, Any]] = {}
    for var, value in variables.items():
        own = OWN_TYPES.get(type(value))  # most variables are models, tensors, functions: one lookup
        if own is False or id(value) in skip or not (own or own_object(value)) or skipped_name(var):
            continue
        attrs: dict[str, Any] = {}
        _plain_attrs(value, "", skip, attrs, 1)
        if attrs:
            out[var] = attrs
    return out



def _plain_attrs(obj: Any, prefix: str, skip: Collection[int], out: dict[str, Any], depth: int) -> None:
    for attr, v in list(vars(obj).items()):
        if type(attr) is not str or not attr.isidentifier() or skipped_name(attr) or id(v) in skip:
            continue
        own = OWN_TYPES.get(type(v))
        if own is not False and (own or own_object(v)):  # an object of the script's own in an attribute
            if depth < LIMITS.attr_depth:
                _plain_attrs(v, f"{prefix}{attr}.", skip, out, depth + 1)
            continue
        try:
            out[prefix + attr] = encode(v, LIMITS.block_items)
        except Exception:  # noqa: BLE001 - NotPlain, or an odd value: not noted
            continue



def restore_attrs(variables: dict[str, Any], values: dict[str, dict[str, Any]]) -> list[str]:
    """Set ``{variable: {attribute: value}}`` (an attribute a dotted path through objects of
    the script's own, ``"state.global_step"``) on the script's own objects the variables hold
    now (``own_object``), only where the attribute holds plain data or nothing now and the
    class has no descriptor for it (a property's setter is never run); return the
    ``variable.attribute`` names left as they are."""
    left = []
    for var, attrs in values.items():
        for path, value in attrs.items():
            obj, *parts = [variables.get(var), *path.split(".")]
            for part in parts[:-1]:  # through the script's own objects only, never a property
                obj = vars(obj).get(part) if obj is not None and own_object(obj) else None
            attr = parts[-1]
            if obj is None or not own_object(obj) or len(parts) > LIMITS.attr_depth:
                left.append(f"{var}.{path}")
                continue
            own = vars(obj)
            if (attr in own and not plain_now(own[attr])) \
                    or (hasattr(type(obj), attr) and not plain_now(getattr(type(obj), attr))):  # a method, property
                left.append(f"{var}.{path}")
            else:
                own[attr] = value
    return sorted(left)


_PLAIN = (bool, int, float, str, list, dict, tuple)



def _module_attrs(variables: dict) -> dict[tuple[int, str], tuple[object, int, str]]:
    """``{(id of the variable's module, dotted name): (value or (type, length), id of the owning
    module, attribute)}``. A module with its own ``get_extra_state`` is passed over: what it
    keeps there (a count, a history) is in its state_dict, and flor cannot tell which
    attributes that covers."""
    import torch

    own_extra = torch.nn.Module.get_extra_state
    out: dict[tuple[int, str], tuple[object, int, str]] = {}
    for var, value in variables.items():
        if not isinstance(value, torch.nn.Module) or var.startswith("__"):
            continue
        for sub, m in value.named_modules():
            if getattr(type(m), "get_extra_state", own_extra) is not own_extra:
                continue
            for attr, v in vars(m).items():
                if not attr.startswith("_") and attr != "training" and type(v) in _PLAIN:
                    key = f"{var}.{sub}.{attr}" if sub else f"{var}.{attr}"
                    seen = (type(v), len(v)) if isinstance(v, (list, dict, tuple)) else v
                    out[(id(value), key)] = (seen, id(m), attr)
    return out



class ModuleAttrProbe(Probe):
    """A plain attribute of a module given to ``end()`` that a block's first run changed
    (``model.temperature *= 0.9``, a list it appends to): a module is checkpointed through its
    ``state_dict``, which does not hold it, so a replay that restores the block leaves it as it
    was. Named once per (module, attribute), under the first name that reaches it."""

    quiet = frozenset({"leave"})  # the first end() that comes (a first run may be left open) (Probe.quiet)
    steady = frozenset()  # ... has come once the block ended twice (Probe.steady)

    def __init__(self) -> None:
        self.watched: dict[str, dict[tuple[int, str], tuple[object, int, str]]] = {}

    def enter(self, view: View, say: Say) -> None:
        if view.first:
            self.watched[view.block] = _module_attrs(view.variables)

    def leave(self, view: View, say: Say) -> None:
        watched = self.watched.pop(view.block, None)
        if not watched:
            return
        now = _module_attrs(view.variables)
        named: set[tuple[int, str]] = set()  # (module, attribute)
        for (root, key), before in watched.items():
            if root in view.given and (root, key) in now and now[(root, key)] != before and before[1:] not in named:
                named.add(before[1:])
                say("FL206", (view.block, key),
                    f"SkipBlock.end({view.block!r}): the block changed `{key}`, a plain attribute of a module given to "
                    "end(): a module is checkpointed through its state_dict, which does not hold it, so a replay that "
                    f"restores {view.block!r} leaves `{key}` as it was; keep it in a buffer (module.register_buffer) "
                    "or pass end() an object that holds it")
