"""Random state a data pipeline keeps of its own (``scripts/loaders.py``): a sampler holding a
``torch.Generator`` as ``self.g``, an IterableDataset shuffling with its own ``random.Random``,
their loaders kept in a dict.

The recording said nothing about them, since flor looked for generators only among the
variables and at a DataLoader's ``generator`` and ``sampler.generator``; a replay that restored
a block and re-executed the next (probed, or without a checkpoint) drew another order, and where
the next had no checkpoint either nothing could notice (a batch loss 0.000364 where a full run
logs 0.000433, and the replay ended "checked nothing" with status 0).
flor now looks a few references into loaders, samplers, datasets, containers and objects of the
script's own (``flor.watch.reachable.generators``). Given to ``end()``, they replay exactly,
DistributedSampler and worker processes included.
"""

from __future__ import annotations

from helpers import Runner, values

DREW = "a random generator the block drew from"
PROBED = {'step_into("train")': 'step_into("train", probed=True)',
          "                # INNER": '                flor.log("loss", loss.item(), step=step)'}


def test_the_recording_names_generators_a_sampler_and_a_dataset_hold(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("loaders.py"), "--epochs", "3", "--flor", "l")
    assert proc.stderr.count(DREW) == 2, proc.stderr
    assert "was not given `stream.rng` (a random.Random, " + DREW in proc.stderr, proc.stderr
    assert "was not given `sampler.g` (a torch._C.Generator, " + DREW in proc.stderr, proc.stderr
    assert "pass it to SkipBlock.end(..., sampler.g)" in proc.stderr


def test_generators_given_to_end_replay_exactly_from_mid_run(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("loaders.py"), "--given", "--flor", "l", env=r.env(FLOR_EVERY="2"))
    assert "FL202" not in proc.stderr, proc.stderr
    edited = r.script("loaders.py", PROBED, dest="probed.py")
    r.run(edited, "--given", "--flor", "full")
    full = values(r.logs("full"), "record")
    assert len(full) == 4 * 17, len(full)
    got = {}
    for pid in range(2):  # worker 1 restores epoch 0's checkpoint and re-executes epoch 1 to start at 2
        proc = r.run(edited, "--given", "--flor", "l", f"--replay_flor={pid}/2")
        assert "replay verified exact" in proc.stderr, proc.stderr
        got.update(values([x for x in r.logs("l") if x["source"] == "replay"]))
    assert got == full
