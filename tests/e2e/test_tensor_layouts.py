"""A tensor's memory layout (its strides) is restored with its values (``scripts/layouts.py``).

Tensors are stored as their values in row-major order. An optimizer's moments for a
channels_last model are channels_last too, and came back contiguous: a fused AdamW, which
walks a parameter and its moments as flat memory, then added each moment to another element
(the epochs a sparse replay re-executed from a checkpoint trained otherwise than the
recording: DIVERGED), and a norm of a moment read after a restore summed in another order
(a hindsight value off in its last bits, with the replay "verified exact").
"""

from __future__ import annotations

import pytest

from helpers import Runner, record_and_full_run

HINDSIGHT = {"    # HINDSIGHT": '    w = net[0].weight\n'
                                '    flor.log("exp_avg", opt.state[w]["exp_avg"].norm().item())\n'
                                '    flor.log("channels_last", opt.state[w]["exp_avg_sq"].is_contiguous('
                                'memory_format=torch.channels_last))'}
NAMES = {"loss", "exp_avg", "channels_last"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("layouts"))
    edited, full = record_and_full_run(r, "layouts.py", HINDSIGHT, NAMES)
    assert len(full) == 6 * len(NAMES) and {full[("channels_last", e, None)] for e in range(6)} == {True}
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 3])
def test_a_replay_restores_channels_last_moments_and_equals_a_full_run(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "r", workers, NAMES)
    assert got == full
