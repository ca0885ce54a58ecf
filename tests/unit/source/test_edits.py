"""flor.source.edits: which edits of a script are logging only (a replay then says nothing) and
which change what it computes ("changed by more than logging").
"""

from __future__ import annotations

import pytest

from flor.source.edits import non_logging_changes

from helpers import ROOT

# -- the "changed by more than logging" check ----------------------------------------------

BASE = """\
import logging
import torch, flor
log = logging.getLogger(__name__)
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        loss = step(net)
    net = flor.SkipBlock.end(net)
    acc = evaluate(net)
"""


@pytest.mark.parametrize("old, new, changed", [
    (BASE, BASE.replace('step_into("train")', 'step_into("train", probed=True)'), False),
    (BASE, BASE.replace("        loss = step(net)\n", "        loss = step(net)\n"
                        "        gn = net.weight.grad.norm().item()  # used only by the log\n"
                        "        flor.log('grad_norm', gn)\n"), False),
    (BASE, BASE + "    print(f'{epoch} {acc}')\n    logging.info('acc %s', acc)\n    log.warning('x')\n", False),
    (BASE, BASE + "    if epoch % 2 == 0:\n        print(acc)\n", False),
    (BASE, BASE.replace("acc = evaluate(net)", "acc = flor.log('acc', evaluate(net))"), False),
    (BASE, BASE + "    wandb.log({'acc': acc})\n    writer.add_scalar('acc', acc, epoch)\n", False),
    (BASE, BASE.replace("loss = step(net)", "loss = step(net, lr=0.1)"), True),  # training changed
    (BASE, BASE + "    acc = acc * 2\n    print(acc)\n", True),  # rebinds a value the script uses
    (BASE, BASE + "    net.weight.data.zero_()\n", True),
    (BASE, BASE + "    torch.log(acc)\n", True),  # torch.log is math, not logging
    (BASE.replace("        loss = step(net)\n", "        loss = step(net)\n        clip(net)\n"),
     BASE.replace("        loss = step(net)\n", "        loss = step(net)\n        gn = clip(net)\n"
                  "        flor.log('gn', gn)\n"), False),  # the recording's call, its result kept for a log
    (BASE, BASE.replace("        loss = step(net)\n", "        loss = step(net)\n        gn = clip(net)\n"
                        "        flor.log('gn', gn)\n"), False),  # a value computed for a log (it may draw: FL325)
    (BASE, "def wnorm(m):\n    return m.weight.norm()\n" + BASE + "    flor.log('wn', wnorm(net))\n", False),
    (BASE, "def wnorm(m):\n    return m.weight.norm()\n" + BASE + "    acc = wnorm(net)\n", True),  # not for a log
], ids=["probed", "assignment-for-a-log", "print-logging-logger", "if-only-prints", "flor.log-wraps-value",
        "trackers", "training-arg", "rebinds-used-value", "mutates-object", "torch.log", "kept-call-result",
        "new-call-for-a-log", "helper-def-for-a-log", "helper-def-used"])
def test_what_counts_as_logging(old, new, changed):
    assert non_logging_changes(old, new) is changed


def test_the_readme_probed_edit_is_logging():
    cnn = (ROOT / "examples" / "cnn.py").read_text()
    for edited in ("cnn_probed.py", "cnn_hindsight.py"):
        assert not non_logging_changes(cnn, (ROOT / "examples" / edited).read_text()), edited


# -- the frameworks' logging sinks: compute_metrics, and self.log in a LightningModule --------

HF = """\
from transformers import Trainer
def compute_metrics(pred):
    logits, labels = pred
    metrics = {"accuracy": float((logits.argmax(-1) == labels).mean())}
    return metrics
trainer = Trainer(model=model, args=args, compute_metrics=compute_metrics, callbacks=[FlorCallback()])
trainer.train()
"""
HF_DICT = """\
def metrics_of(pred):
    logits, labels = pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}
Trainer(model=model, compute_metrics=metrics_of).train()
"""
LIGHTNING = """\
class Net(LightningModule):
    def training_step(self, batch, batch_idx):
        loss = cross_entropy(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss
    def validation_step(self, batch, batch_idx):
        logits = self.net(batch[0])
        self.log("val_loss", cross_entropy(logits, batch[1]))
    def on_validation_epoch_end(self):
        pass
Trainer(max_epochs=4, callbacks=[FlorCallback()]).fit(Net())
"""
CONFIG = """\
def config():
    cfg = {"lr": 0.1}
    return cfg
opt = SGD(net.parameters(), **config())
"""


@pytest.mark.parametrize("old, new, changed", [
    (HF, HF.replace("    return metrics", '    metrics["max_logit"] = float(logits.max())\n    return metrics'), False),
    (HF, HF.replace("    return metrics", '    metrics.update(top2=top2(logits, labels))\n    return metrics'), False),
    (HF, HF.replace("    return metrics", '    m = logits.max()\n    metrics["max"] = float(m)\n    return metrics'),
     False),  # a value computed for the new entry goes with it
    (HF_DICT, HF_DICT.replace("mean())}", 'mean()), "max_logit": float(logits.max())}'), False),
    (HF, HF.replace("callbacks=[FlorCallback()]", 'callbacks=[FlorCallback()], optimizers=(opt, None)'), True),
    (HF, HF.replace("args=args,", "args=args, preprocess_logits_for_metrics=argmax,"), True),
    (CONFIG, CONFIG.replace("    return cfg", '    cfg["momentum"] = 0.9\n    return cfg'), True),  # feeds training
    (BASE, BASE.replace("    acc = evaluate(net)", "    acc = evaluate(net)\n    w = net.weight.data\n"
                        "    w[0] = 0\n    print(w)"), True),  # not a new dict: the model's tensor, changed
    (BASE, BASE.replace("    acc = evaluate(net)", "    acc = evaluate(net)\n    row = {}\n    row['acc'] = acc\n"
                        "    row.update(epoch=epoch)\n    wandb.log(row)"), False),  # a dict only a tracker reads
    (BASE, BASE.replace("    acc = evaluate(net)", "    acc = evaluate(net)\n    opts = {}\n    opts['lr'] = acc\n"
                        "    print(opts)\n    tune(net, opts)"), True),  # a dict training reads
    (LIGHTNING, LIGHTNING.replace("        self.log(\"val_loss\"", "        self.log('val_acc', acc(logits, batch[1]))\n"
                                  "        self.log(\"val_loss\""), False),
    (LIGHTNING, LIGHTNING.replace("        pass", "        out = {}\n        out['lr'] = self.lr()\n"
                                  "        self.log_dict(out)"), False),
    (LIGHTNING, LIGHTNING.replace("self.net(batch[0]), batch[1])", "self.net(batch[0]), batch[1]) * 2"), True),
], ids=["hf-new-entry", "hf-update", "hf-entry-with-its-value", "hf-returned-dict", "hf-trainer-args",
        "hf-preprocess-logits", "returned-config-feeds-training", "alias-of-a-tensor", "tracker-row",
        "dict-training-reads", "lightning-self.log", "lightning-log_dict", "lightning-training"])
def test_what_frameworks_log_is_logging(old, new, changed):
    assert non_logging_changes(old, new) is changed


@pytest.mark.parametrize("script, edits", [
    ("hf_trainer.py", {"    # METRICS": '    metrics["max_logit"] = float(logits.max())'}),
    ("lightning_fit.py", {"        # VALIDATION": '        self.log("val_acc", (logits.argmax(1) == y).float().mean())',
                          "        # EPOCH END": '        self.log("wd", self.trainer.optimizers[0].param_groups[0]["lr"])'}),
])
def test_the_framework_scripts_hindsight_edits_are_logging(script, edits):
    """The edits tests/e2e/test_frameworks.py replays: a replay says no FL309 for them."""
    source = (ROOT / "tests" / "scripts" / script).read_text()
    edited = source
    for mark, line in edits.items():
        assert mark in edited
        edited = edited.replace(mark, line)
    assert not non_logging_changes(source, edited)
