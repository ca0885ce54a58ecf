"""flor.source.blocks: which names a block carries into its next run, which are not state, and
what a loop over flor.it needs at its head."""

from __future__ import annotations

import ast

from flor.source.blocks import carried_names, loop_names, unread_outside

NANOGPT = '''
X, Y = get_batch("train")
checkpoint = None
h = None
for chunk in flor.it(range(10)):
    if flor.SkipBlock.step_into("train"):
        for micro in range(5):
            logits, loss = model(X, Y)
            X, Y = get_batch("train")
            loss.backward()
            iter_num += 1
            out, h = rnn(x, h)
        checkpoint = {"model": model.state_dict()}
        torch.save(checkpoint, "ckpt.pt")
        if loss.item() < best:
            best = loss.item()
    model, iter_num, best = flor.SkipBlock.end(model, iter_num, best)
    print(best)
'''


def test_carried_names_are_read_by_the_next_run_before_it_binds_them() -> None:
    tree = ast.parse(NANOGPT)
    assert carried_names(tree, 6, 17) == {"X", "Y", "h"}  # not the names end() is given, nor loss, logits
    assert carried_names(tree, 6, 10) == set()  # end() not a sibling of the block: nothing claimed


def test_a_dict_built_and_saved_inside_the_block_is_not_state() -> None:
    tree = ast.parse(NANOGPT)
    assert unread_outside(tree, 6, ["checkpoint", "X", "best", "loss"]) == {"checkpoint", "loss"}


def test_the_loop_head_needs_what_its_body_reads_first_and_what_its_blocks_carry() -> None:
    found = loop_names(ast.parse(NANOGPT), 5)
    assert found is not None
    live, carried = found
    assert {"X", "best", "model"} <= live and "checkpoint" not in live and "loss" not in live
    assert carried == {"X", "Y", "h"}
    assert loop_names(ast.parse("x = 1\n"), 1) is None
