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
