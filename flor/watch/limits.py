"""How much of the script's state outside ``end()`` flor notes or looks through: one budget.

Noting runs on the training thread at every block run and epoch end, so each walk is bounded.
What a bound leaves out is never silently wrong: a variable too big to note is named with the
fix (pass it to ``end()``), a generator or tensor past a bound is simply not watched.

=================  =======  ===================================================================
``items``          256      scalars one loop variable may hold (its containers together)
``block_items``    4096     ... one variable a block changes may hold (a history of batch losses)
``array``          256      values of a NumPy array noted, whatever the above (a label array the
                            script loaded would be encoded and compared at every block run)
``string``         4096     characters of a string
``depth``          4        containers nested in one value
``variables``      512      variables of the loop noted per epoch (a notebook's globals)
``outside``        64       tensors named per block run as changed in place outside the blocks
``attr_depth``     2        attribute names deep through the script's own objects
                            (``self.state.global_step``)
``reach``          3        references from a variable to a random generator
                            (``loaders['train'].sampler.generator``)
``reach_items``    32       items of a list, tuple or dict looked at on the way
``carried``        64 MiB   bytes of the tensors and arrays a block run carries into its next
                            (a prefetched batch: nanoGPT's ``X, Y``), kept with its checkpoint
                            (``flor.watch.carried``); more is named with the fix (FL211)
=================  =======  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LIMITS", "Limits"]


@dataclass(frozen=True)
class Limits:
    items: int = 256
    block_items: int = 4096
    array: int = 256
    string: int = 4096
    depth: int = 4
    variables: int = 512
    outside: int = 64
    attr_depth: int = 2
    reach: int = 3
    reach_items: int = 32
    carried: int = 64 * 2**20


LIMITS = Limits()
