"""Bad input: one clear error, exit status 2 where the CLI or flags are at fault, and
nothing already recorded lost or changed."""

from __future__ import annotations

import pytest

from helpers import Runner


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("bad"))
    r.run(r.script(), "--epochs", "3", "--flor", "toy")
    return r


def _recorded_files(r: Runner) -> dict[str, bytes]:
    """The recording's files (replays may add their own logs beside them, never change these)."""
    return {k: v for k, v in r.tree().items() if "/replay-" not in k and "/logs/replay-" not in k}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--flor", "toy", "--replay_flor", "a/b"], "not PID/NGPUS"),
        (["--flor", "toy", "--replay_flor", "3/2"], "out of range"),
        (["--flor", "toy", "--replay_flor", "-1/2"], "not PID/NGPUS"),
        (["--flor", "toy", "--replay_flor", "0/0"], "at least 1"),
        (["--flor", "toy", "--replay_flor", "1/"], "not PID/NGPUS"),
        (["--flor", "never-recorded", "--replay_flor"], "nothing recorded"),
        (["--flor", "../x"], "invalid experiment name"),
        (["--flor", "/abs"], "invalid experiment name"),
        (["--flor="], "invalid experiment name"),
        (["--replay_flor"], "needs an experiment"),
    ],
)
def test_bad_flags_exit_2_and_lose_nothing(recorded, args, message):
    before = recorded.tree()
    proc = recorded.run(recorded.cwd / "toy.py", "--epochs", "3", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("flor: error:") and message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert recorded.tree() == before
    assert not (recorded.home.parent / "x").exists() and not (recorded.cwd / "x").exists()


@pytest.mark.parametrize(
    "edits, args, error, message",
    [
        ({}, ["--epochs", "4"], "ReplayError", "the epoch loop now has 4 epochs but the recording"),
        ({'step_into("training_loop")': 'step_into("train")'}, ["--epochs", "3"], "ReplayError",
         "SkipBlock 'train' (occurrence 0) at epoch 0 is not in the recording"),
        ({"net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)":
          "net, optimizer, step = flor.SkipBlock.end(net, optimizer, step)"}, ["--epochs", "3"], "StateError",
         "SkipBlock.end('training_loop') was given 3 objects at epoch 0, the recording had 4"),
    ],
)
def test_script_that_no_longer_matches(recorded, edits, args, error, message):
    before = _recorded_files(recorded)
    script = recorded.script(edits=edits, dest="mismatch.py")
    proc = recorded.run(script, *args, "--flor", "toy", "--replay_flor", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr  # a FlorError: one line to act on
    assert f"flor: error: {message}" in proc.stderr
    assert f"flor: replay FAILED ({error}: {message}" in proc.stderr.splitlines()[-1]  # the summary names why
    assert _recorded_files(recorded) == before


def test_nested_blocks_are_closed_with_one_warning(runner: Runner):
    """A block entered while another is open (nesting, or an exception that skipped the outer
    block's end) closes the open one without a checkpoint: training goes on, and says so once."""
    script = runner.script(edits={"        for xb, yb in loader:": "        flor.SkipBlock.step_into('inner')\n        for xb, yb in loader:"},
                           dest="nested.py")
    proc = runner.run(script, "--epochs", "2", "--flor", "nested", check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("SkipBlock 'training_loop' at epoch 0 was still open when SkipBlock 'inner' was entered") == 1


NESTED_ENDS = """
import torch, flor
torch.manual_seed(0)
net = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("outer"):
        for i in range(2):
            if flor.SkipBlock.step_into("inner"):
                loss = net(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
            flor.SkipBlock.end(net, opt)
    flor.SkipBlock.end(net, opt)
"""


def test_nested_blocks_with_both_ends_say_nesting(runner: Runner):
    """Nested blocks that both call end(): the outer end() has no block left, and the error
    says that blocks were nested, not that step_into was missing (the script has one)."""
    script = runner.cwd / "nested_ends.py"
    script.write_text(NESTED_ENDS)
    proc = runner.run(script, "--flor", "nested", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("flor: error: SkipBlocks cannot be nested: SkipBlock 'outer' was still open when SkipBlock "
            "'inner' was entered") in proc.stderr, proc.stderr
    assert "without SkipBlock.step_into" not in proc.stderr


def test_cli_errors_exit_2(recorded):
    for args, message in ((["logs", "nope"], "no experiment 'nope'"), (["logs", "../x"], "invalid experiment name"),
                          (["ls", "nope"], "no experiment 'nope'"), (["logs", "toy", "--run", "1999"], "unknown")):
        proc = recorded.flor(*args, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith("flor: error:") and message in proc.stderr, proc.stderr


def test_ls_and_logs_csv(recorded):
    listing = recorded.flor("ls").stdout
    assert "toy" in listing
    runs = recorded.flor("ls", "toy").stdout.splitlines()
    assert "finished" in runs[1] and " 3 " in runs[1]
    csv_out = recorded.flor("logs", "toy", "--format", "csv").stdout.splitlines()
    assert csv_out[0].startswith("run,source,replay,worker,epoch,step,name,value")
    assert len(csv_out) == 1 + 9 and csv_out[1].split(",")[1] == "record"
