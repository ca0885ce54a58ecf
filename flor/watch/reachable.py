"""State the script can reach that ``end()`` was not given: three probes.

Three mistakes are easy to make and costly to find later:

- an optimizer is given but its LR scheduler or GradScaler is not, so their state is not
  checkpointed and a replay that restores the block starts them fresh. ``forgotten`` finds
  them, once per block, among the variables of the frame that calls ``end()`` (``SchedulerProbe``);
- a random generator of the script's own (``torch.Generator()`` behind a shuffling DataLoader,
  ``np.random.default_rng(0)``, ``random.Random(0)``) is drawn from inside the block but not
  given, and it is none of the global generators flor captures (``flor.state.rng``): a replay
  that restores the block leaves it where it was, and later epochs draw other numbers.
  ``watch_generators`` fingerprints those in the calling frame (and a DataLoader's) when a
  block is first entered, ``drawn_generators`` keeps the ones that changed by its end, and
  ``GeneratorProbe`` names those the next entry finds untouched since (not reseeded);
- a list, dict, set or deque of the script's own (a history of batch losses) grows inside the
  block but is not given: a replay that restores the block leaves it as it was.
  ``watch_containers`` notes their lengths when a block is first entered and
  ``grown_containers`` the ones that changed by its end (``ContainerProbe``).

>>> import torch
>>> net = torch.nn.Linear(2, 1)
>>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
>>> sched = torch.optim.lr_scheduler.StepLR(opt, 1)
>>> [(name, kind) for name, kind, _ in forgotten((net, opt), {"net": net, "opt": opt, "sched": sched})]
[('sched', 'torch.optim.lr_scheduler.StepLR')]
>>> forgotten((net, opt, sched), {"net": net, "opt": opt, "sched": sched})
[]
"""

from __future__ import annotations

import pickle
import random
from collections import deque
from typing import Any, Iterable, Mapping

from ..state.describe import article, describe
from .frames import own_object, given_ids
from .limits import LIMITS
from .probe import Probe, Say, View

__all__ = ["ContainerProbe", "GeneratorProbe", "SchedulerProbe", "drawn_generators", "forgotten",
           "generators", "grown_containers", "watch_containers", "watch_generators"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def forgotten(objs: tuple, variables: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(variable, type, why)`` for each LR scheduler of an optimizer in ``objs`` and each enabled
    GradScaler (when an optimizer is given) found in ``variables`` but not given."""
    import torch

    passed = given_ids(objs)
    optimizers = {id(o) for o in objs if isinstance(o, torch.optim.Optimizer)}
    optimizers |= {i for o in objs if isinstance(o, (list, tuple)) for x in o
                   if isinstance(x, torch.optim.Optimizer) for i in [id(x)]}
    if not optimizers:
        return []
    scalers = tuple(c for c in (getattr(torch.amp, "GradScaler", None),
                                getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)) if c is not None)
    lr = torch.optim.lr_scheduler
    schedulers = getattr(lr, "LRScheduler", None) or lr._LRScheduler  # the name before torch 2.0
    found: dict[int, tuple[str, str, str]] = {}
    for var, value in variables.items():
        if var.startswith("__") or id(value) in passed or id(value) in found or isinstance(value, _PLAIN):
            continue
        if isinstance(value, schedulers):
            if id(getattr(value, "optimizer", None)) in optimizers:
                found[id(value)] = (var, describe(value), "the LR scheduler of the optimizer it was given")
        elif scalers and isinstance(value, scalers):
            enabled = getattr(value, "is_enabled", lambda: True)()
            if enabled:
                found[id(value)] = (var, describe(value), "a GradScaler beside the optimizer it was given")
    return sorted(found.values())


# -- random generators of the script's own ------------------------------------------------

#: where a DataLoader keeps what it draws from: its workers' seeds, its sampler's order, and
#: a dataset that shuffles or augments with a generator of its own
_LOADER_PARTS = ("generator", "sampler", "batch_sampler", "dataset")


def _generator_kinds() -> tuple[type, ...]:
    import numpy as np
    import torch

    return torch.Generator, np.random.Generator, np.random.RandomState, random.Random


def _global_generators() -> set[int]:
    """Ids of the generators flor captures at every ``end()`` anyway (``flor.state.rng``)."""
    import numpy as np
    import torch

    ids = {id(getattr(random, "_inst", None)), id(torch.default_generator),
           id(getattr(np.random.mtrand, "_rand", None))}
    if torch.cuda.is_initialized():
        ids.update(id(g) for g in torch.cuda.default_generators)
    return ids


def _parts(value: Any) -> list[tuple[str, Any]]:
    """``(path suffix, object)`` of what ``value`` holds where a generator may be kept: a
    DataLoader's generator, sampler, batch sampler and dataset; the attributes of a sampler or
    dataset (``RandomSampler.generator``, a sampler of the script's own holding ``self.g``) and
    of an object of the script's own (a Trainer, a dataset that shuffles itself); the items of a
    list, tuple or dict (``loaders = {"train": ...}``). Nothing for anything else: a model, a
    tensor, a module."""
    import torch.utils.data

    if isinstance(value, torch.utils.data.DataLoader):
        return [(f".{attr}", getattr(value, attr, None)) for attr in _LOADER_PARTS]
    if isinstance(value, dict):
        return [(f"[{key!r}]", v) for key, v in list(value.items())[:LIMITS.reach_items]
                if isinstance(key, (str, int))]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value[:LIMITS.reach_items])]
    if isinstance(value, (torch.utils.data.Sampler, torch.utils.data.Dataset)) or own_object(value):
        attrs = getattr(value, "__dict__", None)
        if type(attrs) is dict:
            return [(f".{attr}", v) for attr, v in list(attrs.items()) if not attr.startswith("__")]
    return []


def _walk_generators(roots: Iterable[tuple[str, Any]], found: dict[int, tuple[str, Any]]) -> None:
    """Add to ``found`` (by id) each generator among ``roots`` and up to ``LIMITS.reach``
    references into them (``_parts``), nearest first, named by the path that reaches it."""
    kinds, skip = _generator_kinds(), _global_generators()
    seen: set[int] = set()
    level = [(name, value) for name, value in roots if not isinstance(value, _PLAIN)]
    for depth in range(LIMITS.reach + 1):
        deeper = []
        for name, value in level:
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, kinds):
                if not isinstance(value, random.SystemRandom) and id(value) not in skip and id(value) not in found:
                    found[id(value)] = (name, value)
            elif depth < LIMITS.reach:
                deeper += [(name + suffix, inner) for suffix, inner in _parts(value)
                           if inner is not None and not isinstance(inner, _PLAIN)]
        level = deeper


def generators(variables: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(path, generator)`` of each random generator among ``variables`` and a few references
    into their DataLoaders, samplers, datasets, containers and objects of the script's own
    (``_parts``), but the global ones flor captures itself. The nearest path names it.

    >>> import numpy as np, torch
    >>> loader = torch.utils.data.DataLoader(list(range(4)), shuffle=True, generator=torch.Generator())
    >>> [name for name, _ in generators({"rng": np.random.default_rng(0), "loader": loader,
    ...                                  "r": random.Random(0), "np": np, "torch": torch})]
    ['rng', 'r', 'loader.generator']
    >>> [name for name, _ in generators({"loaders": {"train": loader}})]
    ["loaders['train'].generator"]
    """
    found: dict[int, tuple[str, Any]] = {}
    _walk_generators(((var, value) for var, value in variables.items() if not var.startswith("__")), found)
    return list(found.values())


def _held_generators(objs: Iterable[Any]) -> set[int]:
    """Ids of the generators given to ``end()`` or held by what it was given, as ``generators``
    finds them (a DataLoader's, a sampler's ``self.g``, a dataset's own ``Random``): the objects'
    checkpoints capture them."""
    found: dict[int, tuple[str, Any]] = {}
    _walk_generators(((str(i), o) for i, o in enumerate(objs)), found)
    return set(found)


def _fingerprint(gen: Any) -> bytes:
    """A generator's whole state as bytes (a few kB at most): equal iff it drew nothing."""
    import numpy as np
    import torch

    if isinstance(gen, torch.Generator):
        return gen.get_state().numpy().tobytes()
    if isinstance(gen, np.random.Generator):
        return pickle.dumps(gen.bit_generator.state)
    if isinstance(gen, np.random.RandomState):
        return pickle.dumps(gen.get_state(legacy=False))
    return pickle.dumps(gen.getstate())


def watch_generators(variables: Mapping[str, Any]) -> list[tuple[str, Any, bytes]]:
    """``(name, generator, fingerprint)`` of the script's own generators among ``variables``,
    taken as a block is first entered; ``drawn_generators`` compares them at its end. Never
    raises: nothing is watched then."""
    return [(name, gen, _fingerprint(gen)) for name, gen in generators(variables)]


def drawn_generators(watched: list[tuple[str, Any, bytes]], objs: tuple) -> list[tuple[str, Any, bytes]]:
    """``(name, generator, fingerprint now)`` of each generator in ``watched`` that the block drew
    from (its state changed) but that ``end(*objs)`` was not given (itself, or a DataLoader
    holding it); ``warn_generators`` decides at the block's next entry. The Watch runner catches what it raises."""
    passed = given_ids(objs) | _held_generators(objs)
    return [(var, gen, now) for var, gen, before in watched
            if id(gen) not in passed for now in [_fingerprint(gen)] if now != before]


# -- containers of the script's own ----------------------------------------------------------

#: and their subclasses: a Counter, a defaultdict(list), an OrderedDict
_WATCHED_CONTAINERS = (list, dict, set, deque)


def watch_containers(variables: Mapping[str, Any]) -> list[tuple[str, Any, int]]:
    """``(name, container, length)`` of each list, dict, set or deque among ``variables`` (a
    frame's), taken as a block is first entered; ``grown_containers`` looks at them at its end.
    (The Watch runner catches what it raises.)

    >>> import sys
    >>> history = [0.5]
    >>> [(n, k) for n, _, k in watch_containers(sys._getframe().f_locals) if n == "history"]
    [('history', 1)]
    """
    return [(var, value, len(value)) for var, value in variables.items()
            if not var.startswith("__") and isinstance(value, _WATCHED_CONTAINERS)]


def grown_containers(watched: list[tuple[str, Any, int]], objs: tuple) -> list[tuple[str, str, int, int]]:
    """``(name, type, length before, length after)`` of each container in ``watched`` whose length
    the block changed (an ``append``, a new key) but that ``end(*objs)`` was not given (itself,
    inside a container given, or an attribute of an object given). The Watch runner catches what it raises."""
    passed = given_ids(objs)
    for o in objs:
        own = getattr(o, "__dict__", None)
        if type(own) is dict:
            passed.update(id(v) for v in own.values())
    return [(var, type(value).__name__, before, len(value)) for var, value, before in watched
            if id(value) not in passed and len(value) != before]


# -- the probes ------------------------------------------------------------------------------


class SchedulerProbe(Probe):
    """Names, once a block, an LR scheduler or GradScaler of a given optimizer that ``end()`` was
    not given (``forgotten``): at its first ``end()`` while recording, at its first restore while
    replaying (the restore cannot set it, so the verdict names it)."""

    quiet = frozenset()  # at a block's first run only (Probe.quiet)

    def __init__(self) -> None:
        self.checked: set[str] = set()  # blocks a replay restored once

    def leave(self, view: View, say: Say) -> None:
        if not view.first or view.replay:
            return
        for var, kind, why in forgotten(view.objs, view.variables):
            say("FL201", (view.block, var),
                f"SkipBlock.end({view.block!r}) was not given `{var}` ({article(kind)}, {why}): its state is not "
                f"checkpointed, so a replay that restores {view.block!r} starts it fresh and its values diverge; "
                f"pass it to SkipBlock.end(..., {var})")

    def restore(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        if view.block in self.checked:
            return []
        self.checked.add(view.block)
        found = forgotten(view.objs, view.variables)
        for var, kind, why in found:
            say("FL201", (view.block, var),
                f"SkipBlock.end({view.block!r}) is not given `{var}` ({article(kind)}, {why}): this replay cannot "
                f"restore its state, so values read from it (a learning rate, a plateau count, a loss scale) may "
                f"differ from a full re-execution although the blocks verify; pass it to SkipBlock.end(..., {var}) "
                "and record again")
        return [var for var, _, _ in found]


class GeneratorProbe(Probe):
    """A random generator of the script's own that a block's first run drew from and ``end()``
    was not given: fingerprinted at the block's first entry, compared at its end, and named at
    its second entry if still where the first run left it (``watch_generators``,
    ``drawn_generators``): a reseed in between makes it the same in a replay."""

    quiet = frozenset({"enter"})  # its second entry names what the first run drew (Probe.quiet)
    steady = frozenset()  # ... and comes before the block's second end (Probe.steady)

    def __init__(self) -> None:
        self.watched: dict[str, list[tuple[str, Any, bytes]]] = {}
        self.drawn: dict[str, list[tuple[str, Any, bytes]]] = {}

    def enter(self, view: View, say: Say) -> None:
        if view.first:
            self.watched[view.block] = watch_generators(view.variables)
            return
        for var, gen, after in self.drawn.pop(view.block, []):
            if _fingerprint(gen) == after:
                say("FL202", (view.block, var),
                    f"SkipBlock.end({view.block!r}) was not given `{var}` ({article(describe(gen))}, a random "
                    "generator the block drew from): flor checkpoints the generators given to end() and the global "
                    f"ones (Python's, NumPy's, torch's) only, so a replay that restores {view.block!r} leaves `{var}` "
                    "where it was and later epochs draw other numbers than the recording did (a DataLoader's "
                    f"shuffling order, random crops); pass it to SkipBlock.end(..., {var})")

    def leave(self, view: View, say: Say) -> None:
        if view.first:
            self.drawn[view.block] = drawn_generators(self.watched.pop(view.block, []), view.objs)


class ContainerProbe(Probe):
    """A list, dict, set or deque of the script's own that a block's first run resized and that
    ``end()`` was not given, nor noted as plain data by ``VariablesProbe`` (which runs first)."""

    quiet = frozenset()  # at a block's first run only (Probe.quiet)

    def __init__(self) -> None:
        self.watched: dict[str, list[tuple[str, Any, int]]] = {}

    def enter(self, view: View, say: Say) -> None:
        if view.first:
            self.watched[view.block] = watch_containers(view.variables)

    def leave(self, view: View, say: Say) -> None:
        if not view.first:
            return
        noted = view.noted.get("vars", {})
        for var, kind, before, after in grown_containers(self.watched.pop(view.block, []), view.objs):
            if var in noted:  # set as recorded by a replay that restores the block
                continue
            say("FL203", (view.block, var),
                f"SkipBlock.end({view.block!r}) was not given `{var}` ({article(kind)} the block changed from "
                f"{before} to {after} items): flor checkpoints only what end() is given, so a replay that restores "
                f"{view.block!r} leaves `{var}` as it was and values read from it after the block differ from the "
                f"recording's; pass it to SkipBlock.end(..., {var})")
