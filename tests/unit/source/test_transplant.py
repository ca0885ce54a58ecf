"""flor.source.transplant: today's added logging placed in an older script by the syntax tree."""

from __future__ import annotations

import ast
import textwrap

import pytest

from flor.source.edits import non_logging_changes
from flor.source.transplant import TransplantError, transplant, unified_patch

OLD = textwrap.dedent('''\
    import flor
    import torch

    # the older training code: noise 0.01
    for epoch in flor.it(range(3)):
        if flor.SkipBlock.step_into("train"):
            for xb, yb in loader:
                xb = xb + 0.01 * torch.randn_like(xb)  # augmentation
                loss = crit(net(xb), yb)
                loss.backward()
                opt.step()
        net, opt = flor.SkipBlock.end(net, opt)
        acc = evaluate(net)
        flor.log("acc", acc)
''')

# today's script: another augmentation, and new logging (marked NEW)
NEW = textwrap.dedent('''\
    import flor
    import torch

    for epoch in flor.it(range(3)):
        if flor.SkipBlock.step_into("train", probed=True):
            for xb, yb in loader:
                xb = xb + 0.05 * torch.randn_like(xb) * (epoch + 1)
                loss = crit(net(xb), yb)
                flor.log("loss", loss.item())  # NEW
                loss.backward()
                gn = sum(p.grad.norm() for p in net.parameters())  # NEW
                flor.log("gnorm", float(gn))  # NEW
                opt.step()
        net, opt = flor.SkipBlock.end(net, opt)
        wn = float(sum(p.norm() for p in net.parameters()))  # NEW
        flor.log("wnorm", wn)  # NEW
        acc = evaluate(net)
        flor.log("acc", acc)
        if epoch == 2:  # NEW
            print("last epoch", acc)  # NEW
''')


def test_added_logging_and_probed_flag_go_into_the_older_script():
    t = transplant(OLD, NEW)
    assert t.source == textwrap.dedent('''\
        import flor
        import torch

        # the older training code: noise 0.01
        for epoch in flor.it(range(3)):
            if flor.SkipBlock.step_into("train", probed=True):
                for xb, yb in loader:
                    xb = xb + 0.01 * torch.randn_like(xb)  # augmentation
                    loss = crit(net(xb), yb)
                    flor.log('loss', loss.item())
                    loss.backward()
                    gn = sum((p.grad.norm() for p in net.parameters()))
                    flor.log('gnorm', float(gn))
                    opt.step()
            net, opt = flor.SkipBlock.end(net, opt)
            wn = float(sum((p.norm() for p in net.parameters())))
            flor.log('wnorm', wn)
            acc = evaluate(net)
            flor.log("acc", acc)
            if epoch == 2:
                print('last epoch', acc)
        ''')
    assert len(t.placed) == 7  # 6 statements and the flag
    # the older training code is kept: only logging differs from the recorded script
    assert not non_logging_changes(OLD, t.source)
    assert non_logging_changes(NEW, t.source)  # today's augmentation did not come in
    patch = unified_patch(OLD, t.source, "train.py")
    assert patch.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+            flor.log('loss', loss.item())" in patch and '-    if flor.SkipBlock.step_into("train"):' in patch


def test_same_code_or_logging_already_there_changes_nothing():
    assert transplant(OLD, OLD).source == OLD and not transplant(OLD, OLD).changed
    again = transplant(OLD, NEW).source
    assert transplant(again, NEW).source == again  # nothing placed twice


@pytest.mark.parametrize("new, why", [
    # the anchor (the statement before the log) was changed in today's script
    ('import flor\nfor e in flor.it(range(3)):\n    y = model(e) * 2\n    flor.log("y", y)\n',
     "cannot place `flor.log('y', y)` (line 4 of today's script): its anchor `y = model(e) * 2` is not in the older script"),
    # the anchor is in the older block twice
    ('import flor\nfor e in flor.it(range(3)):\n    step()\n    print(e)\n',
     "cannot place `print(e)` (line 4 of today's script): its anchor `step()` is in the older script 2 times (lines 3, 5)"),
    # the enclosing statement changed
    ('import flor\nfor e in flor.it(range(5)):\n    print(e)\n',
     "cannot place `print(e)` (line 3 of today's script): its enclosing statement `for e in flor.it(range(5)):` "
     "is not in the older script"),
    # the log reads a name only today's code defines
    ('import flor\nz = setup()\nw = train(z)\nfor e in flor.it(range(3)):\n    print(z)\n',
     "cannot place `print(z)` (line 5 of today's script): it reads 'z', which the older script never defines"),
    # probed on a block the older script does not have
    ('import flor\nif flor.SkipBlock.step_into("other", probed=True):\n    pass\n',
     "the block step_into('other') is not in the older script"),
])
def test_ambiguous_or_missing_placements_are_refused_with_the_statement_and_why(new, why):
    old = 'import flor\nfor e in flor.it(range(3)):\n    step()\n    y = model(e)\n    step()\n'
    with pytest.raises(TransplantError) as err:
        transplant(old, new)
    assert why in str(err.value)


def test_top_of_block_comments_kept_and_the_result_parses():
    old = "import flor\ndef f(x):\n    # keep me\n    return x + 1\n"
    new = "import flor\ndef f(x):\n    print('f', x)\n    return x + 2\n"
    t = transplant(old, new)
    assert t.source == "import flor\ndef f(x):\n    # keep me\n    print('f', x)\n    return x + 1\n"
    ast.parse(t.source)


def test_probed_false_becomes_true_and_multiline_calls_keep_their_shape():
    old = 'import flor\nif flor.SkipBlock.step_into(\n    "b", probed=False\n):\n    run()\n'
    new = 'import flor\nif flor.SkipBlock.step_into("b", probed=True):\n    run2()\n'
    assert transplant(old, new).source == 'import flor\nif flor.SkipBlock.step_into(\n    "b", probed=True\n):\n    run()\n'
    old = 'import flor\nif flor.SkipBlock.step_into(\n    "b",\n):\n    run()\n'
    assert transplant(old, new).source == 'import flor\nif flor.SkipBlock.step_into(\n    "b", probed=True,\n):\n    run()\n'
