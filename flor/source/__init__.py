"""The script's syntax tree, and nothing else: pure, no torch.

``blocks``: what a block binds that the code after ``end()`` reads, and wrappers around
``flor.it``; ``edits``: which edits are logging only (replay, verification, sweeps);
``transplant``: today's logging moved into an older version of the script (``flor replay --all``).
"""
