"""A module's train/eval mode is checkpointed and restored with it (``scripts/eval_mode.py``).

A module was captured through its ``state_dict``, which does not hold ``training``. A block that
left its model in eval mode (validation inside the block) and a replay that restored it left the
model in the mode it had before: hindsight code after ``end()`` that evaluated it drew dropout
masks where a full run does not (a loss of 2.2 against 1.1), and said "verified exact". A
module's node now keeps the names of its submodules in eval mode, and a restore sets each one's
mode as recorded (a frozen BatchNorm inside a model in training mode too).
"""

from __future__ import annotations


import pytest

from helpers import Runner, record_and_full_run

HINDSIGHT = {"    # HINDSIGHT": '    import copy\n'
                                '    with torch.random.fork_rng(), torch.no_grad():  # on a copy: training left alone\n'
                                '        flor.log("after", ((copy.deepcopy(net)(X) - Y) ** 2).mean().item())\n'
                                '    flor.log("training", [net.training, net.bn.training, net.drop.training].count(True))'}
NAMES = {"val", "after", "training"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("eval_mode"))
    edited, full = record_and_full_run(r, "eval_mode.py", HINDSIGHT, NAMES)
    assert [full[("training", e, None)] for e in range(6)] == [3, 0, 3, 0, 2, 0]
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 3])
def test_a_restored_model_is_in_the_mode_the_block_left_it(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "r", workers, NAMES)
    assert got == full
