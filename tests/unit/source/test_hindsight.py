"""flor.source.hindsight: the flor.log calls an edit adds, where they sit and which blocks run them."""

from __future__ import annotations

import pytest

from flor.source.hindsight import NewLog, new_logs

RECORDED = '''
def step(x):
    return model(x)

def train(epoch):
    for x in data:
        loss = step(x)
    flor.log("epoch_loss", loss)

for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        train(epoch)
    if flor.SkipBlock.step_into("eval"):
        acc = evaluate()
    model = flor.SkipBlock.end(model)
    flor.log("acc", acc)
'''


def test_a_log_in_a_function_a_block_calls_through_another_names_that_block():
    current = RECORDED.replace("    return model(x)", "    out = model(x)\n    flor.log('out', out.sum())\n    return out")
    assert new_logs(RECORDED, current) == [NewLog("out", 4, "step", ("train",))]


def test_a_log_in_a_block_after_end_and_a_repeated_one_are_told_apart():
    current = RECORDED.replace("        acc = evaluate()\n", "        acc = evaluate()\n        flor.log('acc', acc)\n")
    current = current.replace('    flor.log("acc", acc)\n', '    flor.log("acc", acc)\n    flor.log(f"acc{epoch}", acc)\n')
    found = new_logs(RECORDED, current)
    assert [(log.name, log.function, log.blocks) for log in found] == [("acc", None, ("eval",)), (None, None, ())]
    assert found[0].where() == "line 15" and found[1].call() == "flor.log(...)"


def test_nothing_new_or_a_script_that_does_not_parse_gives_nothing():
    assert new_logs(RECORDED, RECORDED) == [] and new_logs(RECORDED, "def (") == []


# -- a framework's Trainer runs the script's training hooks in flor.hooks' block -------------------

HF = '''\
import flor
from transformers import Trainer
from flor.integrations.transformers import FlorCallback

def helper(loss):
    return float(loss)

class Classifier(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        return loss

def compute_metrics(pred):
    return {"acc": 1.0}

Classifier(model=m, compute_metrics=compute_metrics, callbacks=[FlorCallback()]).train()
'''


@pytest.mark.parametrize("old, new, blocks", [
    ("        return loss", "        flor.log('step_loss', float(loss))\n        return loss", ("training",)),
    ("        return loss", "        flor.log('l', helper(loss))\n        return loss", ("training",)),
    ("    return float(loss)", "    flor.log('l', loss)\n    return float(loss)", ()),  # nothing calls it
    ('    return {"acc": 1.0}', '    flor.log("m", 1)\n    return {"acc": 1.0}', ()),  # evaluation, not training
], ids=["compute_loss", "in-the-hook-calling-a-helper", "uncalled-helper", "compute_metrics"])
def test_a_new_log_in_a_trainers_training_hook_is_run_by_the_framework_block(old, new, blocks):
    (log,) = new_logs(HF, HF.replace(old, new))
    assert log.blocks == blocks


def test_without_an_integration_a_training_hook_is_a_plain_function():
    plain = HF.replace("from flor.integrations.transformers import FlorCallback\n", "")
    (log,) = new_logs(plain, plain.replace("        return loss", "        flor.log('l', loss)\n        return loss"))
    assert log.blocks == ()


def test_a_new_log_in_a_lightning_training_step_is_run_by_the_framework_block():
    script = ("import flor\nfrom lightning.pytorch import LightningModule, Trainer\n"
              "from flor.integrations.lightning import FlorCallback\n"
              "class Net(LightningModule):\n    def training_step(self, batch, i):\n        loss = self.f(batch)\n"
              "        return loss\n    def validation_step(self, batch, i):\n        self.log('v', self.f(batch))\n"
              "Trainer(callbacks=[FlorCallback()]).fit(Net())\n")
    edited = script.replace("        return loss", "        flor.log('loss', loss)\n        return loss")
    edited = edited.replace("        self.log('v'", "        flor.log('v2', 1)\n        self.log('w', 2)\n        self.log('v'")
    edited = edited.replace("        return loss", "        self.log('wmax', self.w.max())\n        return loss")
    assert [(log.call(), log.function, log.blocks) for log in new_logs(script, edited)] == \
        [("flor.log('loss', ...)", "training_step", ("training",)),
         ("self.log('wmax', ...)", "training_step", ("training",)),
         ("flor.log('v2', ...)", "validation_step", ()), ("self.log('w', ...)", "validation_step", ())]


def test_self_log_is_a_new_log_only_where_a_flor_integration_trains():
    script = "class Net(Module):\n    def training_step(self, b, i):\n        return self.f(b)\n"
    edited = script.replace("        return", "        self.log('x', 1)\n        return")
    assert new_logs(script, edited) == []
