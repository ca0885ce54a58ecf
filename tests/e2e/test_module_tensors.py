"""A module's tensors outside its state_dict are checkpointed and restored with it
(``scripts/module_tensors.py``).

A module was checkpointed through its state_dict alone, which holds neither its
non-persistent buffers (``register_buffer(..., persistent=False)``) nor tensors kept as plain
attributes, such as the ``weight`` that the legacy ``torch.nn.utils.weight_norm`` and
``spectral_norm`` compute before each forward. A replay that restored the block read them as
they were before it (a sample count of 0, the weight of another epoch) and said "verified exact".
A tensor attribute is put back in place, unless it shares a parameter's memory (the legacy
spectral_norm's ``weight`` before the first forward), which writing through would change.
"""

from __future__ import annotations

import pytest

from helpers import Runner, record_and_full_run

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("seen", net.seen.item())\n'
                                '    flor.log("mean_in", net.mean_in.sum().item())\n'
                                '    flor.log("last_mean", net.last_mean.item())\n'
                                '    flor.log("out_weight", net.out.weight.norm().item())\n'
                                '    flor.log("hidden_weight", net.hidden.weight.norm().item())'}
NAMES = {"loss", "seen", "mean_in", "last_mean", "out_weight", "hidden_weight"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("module_tensors"))
    edited, full = record_and_full_run(r, "module_tensors.py", HINDSIGHT, NAMES)
    assert len(full) == 6 * len(NAMES)
    assert [full[("seen", e, None)] for e in range(6)] == [64, 128, 192, 256, 320, 384]
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 3])
def test_a_restored_module_has_its_non_persistent_buffers_and_tensor_attributes(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "r", workers, NAMES)
    assert got == full
