"""Gradients a block run adds to those its previous run left (no ``zero_grad`` between): noticed
by a hook at its second run, so the checkpoints carry them (``flor.state.grads``)."""

from __future__ import annotations

from typing import Any, Callable

from .probe import Probe, Say, View

__all__ = ["CarriedGrad", "GradProbe", "grad_probe"]

def grad_probe(objs: tuple) -> Any:
    """A parameter to watch for gradients carried into the block's next run: the first one that
    requires grad of the first module among ``objs`` (``flor.state.grads.modules_among``); None."""
    from ..state.grads import modules_among

    try:
        for _, m in modules_among(objs):
            for p in m.parameters():
                if p.requires_grad:
                    return p
    except Exception:  # noqa: BLE001 - advice only
        pass
    return None



class CarriedGrad:
    """Whether the block's second run accumulates into the gradient its first run left.

    A module's state_dict holds no gradients, so a block that starts by adding to the previous
    epoch's leftover gradient (gradient accumulation whose last partial window spans the
    epoch's end, or no ``zero_grad`` before the first backward) trains differently after a
    restored block unless its gradients are restored too. A gradient hook on one parameter
    sees, at the block's first backward, whether a nonzero gradient is still there; from then
    on the block's checkpoints keep ``p.grad`` (``flor.state.grads``). Armed once a block, at
    its second entry, only when a leftover exists; removed by ``close``. Never raises."""

    def __init__(self, name: str, param: Any) -> None:
        self.name, self.param, self.handle, self.carried, self.fired = name, param, None, False, False
        try:
            grad = param.grad
            if grad is not None and bool(grad.detach().ne(0).any()):
                self.handle = param.register_hook(self._first_backward)
        except Exception:  # noqa: BLE001 - advice only
            self.handle = None

    def _first_backward(self, grad: Any) -> None:
        if self.fired:  # later backward passes of the block: nothing to look at
            return
        self.fired = True  # the hook stays until close(): removing it while autograd runs it is not safe
        try:
            left = self.param.grad  # what this backward is about to add to
            self.carried = left is not None and bool(left.detach().ne(0).any())
        except Exception:  # noqa: BLE001 - a hook must never break the backward pass
            pass

    def close(self) -> bool:
        """Remove the hook (idempotent); True if the block accumulated into a carried gradient."""
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:  # noqa: BLE001
                pass
        if not self.carried:
            return False
        self.carried = False
        return True


class GradProbe(Probe):
    """Gradients a block's second run adds to those its first left: a parameter is picked at the
    first ``end()`` (``grad_probe``), watched through the second run (``CarriedGrad``), and where
    it carried, ``carried(block)`` is told (the recording then keeps the block's gradients in its
    checkpoints: run.json ``grads_carried``)."""

    #: its second run's enter and leave (the first picks the parameter) are over once the block ended
    #: twice: a steady run calls neither (Probe.steady)
    steady = frozenset()

    def __init__(self, carried: Callable[[str], None]) -> None:
        self.carried = carried
        self.params: dict[str, Any] = {}
        self.active: CarriedGrad | None = None

    def enter(self, view: View, say: Say) -> None:
        param = None if view.first else self.params.pop(view.block, None)
        if param is not None:
            self.active = CarriedGrad(view.block, param)

    def leave(self, view: View, say: Say) -> None:
        if view.first:
            self.params[view.block] = grad_probe(view.objs)
        active, self.active = self.active, None
        if active is not None and active.close():
            self.carried(active.name)
            say("FL208", active.name,
                f"SkipBlock {active.name!r} added to the gradients its previous run left (no zero_grad before its "
                "first backward, or an accumulation window that spans the end of an epoch): its checkpoints now "
                "keep p.grad too, so a replay restores them; the checkpoint of its first run has none, and a replay "
                "re-executes that run. If the carry-over is not intended, call optimizer.zero_grad() at the start "
                "of the block")
