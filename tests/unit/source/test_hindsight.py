"""flor.source.hindsight: the flor.log calls an edit adds, where they sit and which blocks run them."""

from __future__ import annotations

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
