"""Accelerate: a loop of your own under ``accelerate launch`` works with ``flor.it`` and
``SkipBlock`` as it is; ``checkpointables`` gives ``SkipBlock.end`` what
``accelerator.save_state`` would save. See docs/accelerate.md.

    for epoch in flor.it(range(epochs)):
        if flor.SkipBlock.step_into("training"):
            for batch in train_dataloader:
                ...                                   # accelerator.backward(loss), optimizer.step()
        flor.SkipBlock.end(*checkpointables(accelerator))
"""

from __future__ import annotations

from typing import Any

__all__ = ["checkpointables"]


def checkpointables(accelerator: Any) -> list[Any]:
    """The objects ``accelerator.save_state`` saves, in its order, for ``SkipBlock.end``: the
    prepared models, optimizers and LR schedulers, the gradient scaler (mixed precision), the
    data loaders that keep their own position (``use_stateful_dataloader=True``) and the objects
    given to ``register_for_checkpointing``. The random generators are flor's own capture.

    The list has the same length in record and replay as long as the script prepares and
    registers the same objects, which a replay of the same script does.
    """
    objs: list[Any] = [*accelerator._models, *accelerator._optimizers, *accelerator._schedulers]
    if getattr(accelerator, "scaler", None) is not None:
        objs.append(accelerator.scaler)
    objs += [dl for dl in accelerator._dataloaders if getattr(dl, "use_stateful_dataloader", False)]
    objs += list(accelerator._custom_objects)
    return objs
