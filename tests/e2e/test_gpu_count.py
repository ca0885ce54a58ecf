"""A recording made where the process saw several GPUs, replayed by a worker that sees one.

``flor replay`` gives each worker one GPU (``CUDA_VISIBLE_DEVICES``), while a plain ``python
train.py --flor NAME`` on an 8-GPU node captures all 8 CUDA generators. Before, a worker that
started from a checkpoint failed ("the recording saw 8 CUDA devices, this process sees 1")
and one that did not reported every block diverged ("cuda random state"). Now the devices
both see are restored and compared, and a device the worker lacks is no difference as long
as nothing drew from it (its Philox offset is 0); one that did is named.

CI has no GPU, so the scripts give themselves and the real flor a CUDA view: each imports the
module ``fakecuda`` right after torch, before flor (``FAKE_CUDA_DEVICES`` devices; the
generators of those listed in ``FAKE_CUDA_DRAWN`` advance with the script's own CPU draws, the
others stay at their seed; ``set_rng_state`` calls are written to ``FAKE_CUDA_LOG``). Everything
else, the capture, the store, the decode, the restore and the checks, is flor's own code path.
(The view was a ``sitecustomize`` on ``PYTHONPATH``; an import in the script lets the scripts be
forked from the suite's warm interpreter, which a changed ``PYTHONPATH`` rules out.)
"""

from __future__ import annotations

from helpers import PROBED_LOG, Runner


FAKE_CUDA = '''
import os, struct, torch

_N = int(os.environ["FAKE_CUDA_DEVICES"])
_DRAWN = {int(d) for d in os.environ.get("FAKE_CUDA_DRAWN", "").split(",") if d}


def _state(device):
    offset = 4 * (1 + int(torch.get_rng_state().sum())) if device in _DRAWN else 0
    return torch.tensor([42, offset], dtype=torch.int64).view(torch.uint8)


def _set(state, device="cuda"):
    seed, offset = struct.unpack("=Qq", state.numpy().tobytes())
    with open(os.environ["FAKE_CUDA_LOG"], "a") as f:
        f.write(f"{int(device)} {seed} {offset}\\n")


torch.cuda.is_available = lambda: True
torch.cuda.is_initialized = lambda: True
torch.cuda.device_count = lambda: _N
torch.cuda.manual_seed_all = lambda seed: None
torch.cuda.get_rng_state_all = lambda: [_state(i) for i in range(_N)]
torch.cuda.set_rng_state = _set
torch.cuda.set_rng_state_all = lambda states: [_set(s, i) for i, s in enumerate(states)]
'''


#: the edit that gives a script the fake CUDA view, before it imports flor
FAKE_CUDA_IMPORT = {"import torch\n": "import torch\nimport fakecuda  # the test's CUDA view (FAKE_CUDA_*)\n"}


def _gpus(runner: Runner, devices: int, drawn: str = "0") -> dict[str, str]:
    """The environment of a script edited with ``FAKE_CUDA_IMPORT`` that sees ``devices`` GPUs."""
    (runner.cwd / "fakecuda.py").write_text(FAKE_CUDA)
    return runner.env(FAKE_CUDA_DEVICES=str(devices), FAKE_CUDA_DRAWN=drawn,
                      FAKE_CUDA_LOG=str(runner.cwd / f"set_rng_state.{devices}.log"))


def test_a_recording_on_4_gpus_replays_on_workers_that_see_one(runner):
    runner.run(runner.script(edits=FAKE_CUDA_IMPORT), "--epochs", "4", "--flor", "multi", env=_gpus(runner, 4))
    probed = runner.script(edits={**FAKE_CUDA_IMPORT, **PROBED_LOG}, dest="probed.py")
    log = runner.cwd / "set_rng_state.1.log"
    for part in ("0/2", "1/2"):
        worker = runner.run(probed, "--epochs", "4", "--flor", "multi", "--replay_flor", part,
                            env=_gpus(runner, 1))
        assert "replay verified exact" in worker.stderr and "(0 diverged)" in worker.stderr, worker.stderr
    # the second worker restored epoch 1's checkpoint: device 0's generator, as recorded (drawn
    # from), and no other device
    restored = [line.split() for line in log.read_text().splitlines()]
    assert restored and {device for device, _, _ in restored} == {"0"}
    assert all(seed == "42" and int(offset) > 0 for _, seed, offset in restored)
    # the recording's generators: 4 devices, device 0 drawn from, the others at their seed
    show = {**FAKE_CUDA_IMPORT, "# AFTER": "print('CUDA', torch.cuda.get_rng_state_all())"}
    recorded = runner.run(runner.script(edits=show, dest="show.py"), "--epochs", "1", env=_gpus(runner, 4))
    assert recorded.stdout.count("tensor(") == 4


def test_a_device_the_worker_lacks_that_drew_numbers_is_named(runner):
    runner.run(runner.script(edits=FAKE_CUDA_IMPORT), "--epochs", "4", "--flor", "multi",
               env=_gpus(runner, 4, drawn="0,2"))
    probed = runner.script(edits={**FAKE_CUDA_IMPORT, **PROBED_LOG}, dest="probed.py")
    # the first worker sets each block's starting state as recorded; the second restores a
    # checkpoint: neither can, and both say why and what to do (not "checkpoint unusable")
    for part in ("0/2", "1/2"):
        worker = runner.run(probed, "--epochs", "4", "--flor", "multi", "--replay_flor", part,
                            env=_gpus(runner, 1), check=False)
        assert worker.returncode == 2, worker.stderr
        assert "flor: error: the recording drew random numbers on CUDA device 2 (it saw 4 GPUs) and this process " \
               "sees 1; replay where 3 or more GPUs are visible (CUDA_VISIBLE_DEVICES)" in worker.stderr
        assert "FL315" not in worker.stderr
    # with the GPUs it drew on, the same replay is exact
    again = runner.run(probed, "--epochs", "4", "--flor", "multi", "--replay_flor", "1/2",
                       env=_gpus(runner, 4, drawn="0,2"))
    assert "replay verified exact" in again.stderr and "(0 diverged)" in again.stderr
