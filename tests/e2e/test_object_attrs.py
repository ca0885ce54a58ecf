"""Plain attributes a block changes on the script's own objects (``self.step += 1`` in a
Trainer's method) are set as recorded where a replay restores the block
(``flor.watch.attributes.object_attrs``, ``scripts/trainer_attrs.py``).

A Trainer that gives ``end()`` its model and optimizer only recorded without a word; a replay
that restored the block left ``self.step`` at 0 for every epoch where a full run has 4, 8, ...
24, and said "verified exact".
"""

from __future__ import annotations


import pytest

from helpers import Runner, reseal_manifest, said, values

HINDSIGHT = {"            # HINDSIGHT": '            flor.log("step", self.step)\n'
                                       '            flor.log("best", self.best)\n'
                                       '            flor.log("epochs_seen", self.epochs_seen)\n'
                                       '            flor.log("seen", self.meters.seen)\n'
                                       '            flor.log("kind", self.kind)'}
NAMES = {"step", "best", "epochs_seen", "kind", "seen"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    r = Runner(tmp_path_factory.mktemp("oa"))
    env = r.env(FLOR_EVERY="2")
    r.run(r.script("trainer_attrs.py"), "--flor", "t", env=env)
    edited = r.script("trainer_attrs.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, "--flor", "full", env=env)
    full = values(r.logs("full"), "record")
    assert [full[("step", e, None)] for e in range(6)] == [4, 8, 12, 16, 20, 24]
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_attributes_of_self_a_restored_block_changed_equal_a_full_run(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "t", workers)
    assert {k: v for k, v in got.items() if k[0] in NAMES} == {k: v for k, v in full.items() if k[0] in NAMES}


def test_the_replay_names_the_attributes_it_set(recorded):
    r, edited, _ = recorded
    proc = r.run(edited, "--flor", "t", "--replay_flor")
    assert "variables block 'train' changes outside end() are set as recorded where it is restored: i, loss, " \
           "self.best, self.history, self.kind, self.meters.seen, self.step" in proc.stderr, proc.stderr


def test_a_hostile_file_sets_no_method_property_module_or_other_object(tmp_path):
    r = Runner(tmp_path)
    r.run(r.script("trainer_attrs.py"), "--flor", "t", "--epochs", "2")
    def plant(manifest):  # the attributes a restore of epoch 0 sets, as a writer to the store plants them
        attrs = manifest["watch"]["attrs"]
        attrs["self"].update({"fit": 1, "net": 2, "epochs_seen": 3, "__class__": 4, "step": {"py": "os.system"},
                              "net.weight": 5, "meters.__class__": 6, "fit.__doc__": 7, "net.training": 8})
        attrs.update({"torch": {"manual_seed": 1}, "flor": {"log": 2}, "missing": {"x": 1}, "1bad": {"x": 1}})

    reseal_manifest(next((r.home / "t" / "runs").glob("*/checkpoints/train/0.json")), plant)
    edited = r.script("trainer_attrs.py", {"            # HINDSIGHT": '            flor.log("kinds", type(self.net).__name__ '
                                           '+ type(self.fit).__name__ + str(self.epochs_seen))'}, dest="hindsight.py")
    proc = r.run(edited, "--flor", "t", "--replay_flor", "--epochs", "2", check=False)
    # what it refused to set is named (FL337), and the verdict counts it: not exact, exit 3
    assert proc.returncode == 3 and said(proc.stderr, "FL337", "flor.log, missing.x, self.epochs_seen, self.fit, "
                                         "self.net, self.net.training, self.net.weight, self.step, torch.manual_seed")
    assert proc.stderr.splitlines()[-1].startswith("flor: replay NOT EXACT") and "FL337" in proc.stderr.splitlines()[-1]
    # torch, flor: not this frame's variables; a model is not the script's own plain object
    got = values(r.logs("t"), "replay")
    assert [got[("kinds", e, None)] for e in range(2)] == ["Linearmethod1", "Linearmethod2"]


def test_a_copy_of_the_best_weights_kept_on_self_is_named_once(tmp_path):
    """State that is not plain data, which the block binds to an attribute of the script's own
    object (``self.best_state``), cannot be noted: the recording names it, once, and nothing else."""
    r = Runner(tmp_path)
    script = r.script("trainer_attrs.py", {'                self.kind = "trained"':
                                           '                self.kind = "trained"\n'
                                           '                self.best_state = {k: v.clone() for k, v in '
                                           'self.net.state_dict().items()}'})
    proc = r.run(script, "--flor", "t")
    assert proc.stderr.count("SkipBlock 'train' bound `self.best_state` outside end() at epoch 0 to state that is "
                             "not plain data") == 1, proc.stderr
    assert proc.stderr.count("outside end()") == 1, proc.stderr  # self.history, self.step ...: noted, not named
