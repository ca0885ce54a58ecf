"""Findings: every warning and replay note flor gives has a stable code.

A finding is a code (``FL`` and three digits), the subject it is about (a block, a variable,
a file) and one line of text that ends with the fix. The code is what tests, scripts and
users match on; the text may be reworded. ``CATALOGUE`` is the one list of codes, with a
title and the fix; ``docs/findings.md`` is rendered from it (``render_docs``) and a test keeps
the two equal, so a code is documented the day it is emitted.

The hundreds digit says where a finding comes from:

====  ==========================================================================
FL0   settings and the process: flags, a store that cannot be written
FL1   recording: checkpoints, writes, the run's exit, DDP ranks
FL2   the script's state outside ``end()`` (``flor.watch``): named at record and replay
FL3   replay: which run, which epochs, what was restored, what may differ
FL4   stores and spools: damaged or planted files, uploads and downloads
FL5   readers and launches: logs, plots, metrics, the parallel launcher
FL6   framework integrations: the Lightning and Hugging Face Trainer callbacks
====  ==========================================================================

>>> line("FL309", "the script changed by more than logging")
'flor: FL309 the script changed by more than logging'
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["CATALOGUE", "CODE", "Entry", "code_of", "line", "render_docs"]

#: what a code looks like; ``code_of`` reads one back from a printed line
CODE = re.compile(r"\bFL[0-9]{3}\b")


class Entry(NamedTuple):
    title: str
    fix: str


CATALOGUE: dict[str, Entry] = {
    # -- FL0: settings and the process --------------------------------------------------------
    "FL001": Entry("the store cannot be written: training goes on without recording",
                   "make FLOR_HOME (default ~/.flor) writable, or point it at a writable folder"),
    "FL002": Entry("a flag was given that this mode does not use (a replay flag while recording, or the reverse)",
                   "drop the flag, or give it to the mode that uses it"),
    # -- FL1: recording -----------------------------------------------------------------------
    "FL101": Entry("a checkpoint failed (an object flor cannot capture, a full disk): training goes on",
                   "nothing to do for the run; a replay re-executes that epoch. run.json lists checkpoint_failures"),
    "FL102": Entry("a block's carried gradients could not be checkpointed (a sparse gradient)",
                   "a replay re-executes the block from an earlier checkpoint; densify the gradient to avoid it"),
    "FL103": Entry("the background writer is behind: a checkpoint was skipped rather than making training wait",
                   "raise FLOR_WRITER_MEMORY, or accept the sparser checkpoints (run.json: checkpoint_skipped)"),
    "FL104": Entry("a write of the run's files (run.json, logs, stdout, source, spool) failed: training goes on",
                   "free the disk or fix the store's permissions; run.json counts write_failures"),
    "FL105": Entry("TensorBoard events could not be written; the logs are intact",
                   "free the disk; `flor tensorboard` can write the events again from the logs"),
    "FL106": Entry("a SkipBlock was still open when the next one started or the epoch ended (an exception or "
                   "`continue` skipped its end(), or blocks were nested)",
                   "reach SkipBlock.end on every path through the block; do not nest SkipBlocks"),
    "FL107": Entry("flor.log got a name that is not a string: the value was not recorded",
                   "name values with strings"),
    "FL108": Entry("flor.log got a value that is not a scalar: it was not recorded",
                   "log numbers, bools, strings or one-element tensors"),
    "FL109": Entry("flor.log got a step that is not a whole number: the value was not recorded",
                   "pass an int (or a whole NumPy/tensor/float value) or None as step"),
    "FL110": Entry("flor.log failed for another reason: the value was not recorded",
                   "report it with the value's type"),
    "FL111": Entry("a value given to end() can be stored only with pickle: a replay loads it only from a "
                   "checkpoint signed with your own key or with --flor_trust_pickles",
                   "pass end() plain values or objects with state_dict()/load_state_dict()"),
    "FL112": Entry("checkpoints cannot be signed with a key in flor's config folder",
                   "make FLOR_CONFIG_DIR writable; until then replays load pickled leaves only with "
                   "--flor_trust_pickles"),
    "FL113": Entry("the log file could not be written: the values are kept and written when the disk allows",
                   "free the disk"),
    "FL114": Entry("checkpoints still being written when the run ended were abandoned (FLOR_FLUSH_TIMEOUT)",
                   "raise FLOR_FLUSH_TIMEOUT; a replay re-executes those epochs"),
    "FL115": Entry("checkpoints or writes failed during the run; training was not affected",
                   "see FL101/FL104; run.json lists checkpoint_failures and write_failures"),
    "FL116": Entry("the final run.json could not be written: the run's end is not recorded",
                   "free the disk; a replay covers only the epochs the last run.json written names"),
    "FL117": Entry("a DDP rank cannot reach torchrun's store", "check MASTER_ADDR/MASTER_PORT"),
    "FL118": Entry("a DDP rank waited too long for rank 0 to start recording",
                   "raise FLOR_RANK_TIMEOUT, or check that rank 0 runs with --flor"),
    "FL119": Entry("the state of a block differs between DDP ranks: a replay restores rank 0's",
                   "synchronize the state across ranks (SyncBatchNorm, the same seeds)"),
    "FL120": Entry("a DDP rank cannot learn the run id from rank 0, so its logs are not kept",
                   "launch with torchrun, or call torch.distributed.init_process_group before the first flor call"),
    "FL121": Entry("the checkpoint policy kept only some epochs (the overhead budget): a replay re-executes the "
                   "others from the nearest checkpoint", "raise --flor_overhead or set --flor_every N"),
    "FL122": Entry("the checks flor makes at every block run cost more than the overhead budget by themselves "
                   "(a block per iteration of a small model): the budget thins checkpoints, not these",
                   "make one block run cover several iterations (docs/loops.md#iteration-loops-nanogpt)"),
    # -- FL2: the script's state outside end() ------------------------------------------------
    "FL201": Entry("end() was not given the LR scheduler or GradScaler of the optimizer it was given",
                   "pass it to SkipBlock.end(..., scheduler)"),
    "FL202": Entry("the block drew from a random generator of the script's own that end() was not given",
                   "pass the generator (or the sampler or loader that holds it) to SkipBlock.end"),
    "FL203": Entry("the block grew a list, dict, set or deque that end() was not given",
                   "pass it to SkipBlock.end and use what end() returns"),
    "FL204": Entry("the block assigns a name that the code after end() reads and end() is not given",
                   "bind it before the loop and pass it: `..., x = flor.SkipBlock.end(..., x)`"),
    "FL205": Entry("end() is given a name that was not bound when the block was first entered",
                   "bind it before the loop (`x = None`)"),
    "FL206": Entry("the block changed a plain attribute of a module given to end(), which its state_dict does "
                   "not hold", "keep it in a buffer (module.register_buffer) or pass end() an object that holds it"),
    "FL207": Entry("the block changed a variable flor cannot note (not plain data, or too big)",
                   "pass it to SkipBlock.end and use what end() returns"),
    "FL208": Entry("the block adds to the gradients its previous run left: its checkpoints keep p.grad too",
                   "nothing to do; zero the gradients at the start of the block to avoid the extra bytes"),
    "FL209": Entry("flor.it is wrapped in enumerate/zip/map/islice: a worker that starts mid-run gets other "
                   "values", "put the wrapper inside: `for ... in flor.it(enumerate(...))`"),
    "FL210": Entry("the loop's or a block's noted state could not be written",
                   "free the disk; a replay names the variables it cannot restore"),
    "FL211": Entry("the block's next run reads a value its previous run bound (a prefetched batch, a carried hidden "
                   "state) that flor cannot keep with the checkpoint (too big, or not a tensor or array)",
                   "pass it to SkipBlock.end(..., x) and use what end() returns, or bind it anew at the block's start"),
    # -- FL3: replay ----------------------------------------------------------------------------
    "FL301": Entry("which recording this replay follows (the latest one could not be replayed, or was picked "
                   "among several)", "name the run with --flor_run RUN"),
    "FL302": Entry("the recording did not finish (its process is gone): epochs without checkpoints re-execute",
                   "nothing to do"),
    "FL303": Entry("the recording ended as crashed, interrupted or terminated: epochs without checkpoints "
                   "re-execute", "nothing to do"),
    "FL304": Entry("this worker of this replay ran before; its earlier output was kept aside", "nothing to do"),
    "FL305": Entry("the replay uses another torch thread count than the recording (--flor_threads): values may "
                   "differ in the last bits", "drop --flor_threads for bit-identical values"),
    "FL306": Entry("the replay set the torch thread count the recording had", "nothing to do"),
    "FL307": Entry("the recording's copy of the script cannot be read or is not the script run.json names",
                   "compare the script by hand; the replay cannot tell logging edits from others"),
    "FL309": Entry("the script changed by more than logging since the recording: values may differ",
                   "keep edits to logging (flor.log, print, logging), or record again"),
    "FL310": Entry("the script's arguments differ from the recording", "replay with the recorded arguments"),
    "FL311": Entry("the recording is still running or ended early: the replay covers the epochs it finished",
                   "nothing to do"),
    "FL312": Entry("which epochs this replay covers (--flor_epochs, a recording shorter than planned)",
                   "nothing to do"),
    "FL313": Entry("a DDP recording's epochs without a checkpoint re-execute in a world of one",
                   "record with --flor_every 1"),
    "FL315": Entry("a checkpoint is damaged or unusable: the replay re-executes its epoch from an earlier one",
                   "`flor verify NAME` names the damage"),
    "FL316": Entry("the block adds to the gradients its previous run left (run.json: grads_carried)",
                   "nothing to do: restored with its checkpoint"),
    "FL318": Entry("the epoch loop ended before the planned epochs", "nothing to do"),
    "FL319": Entry("the recording has no outer-loop state for the epoch a worker starts after",
                   "replay with --flor_strong, or from epoch 0"),
    "FL320": Entry("outer-loop variables restored as recorded (or left as the script sets them)", "nothing to do"),
    "FL322": Entry("outer-loop variables this worker cannot restore (not plain data, or too big)",
                   "pass them to SkipBlock.end(), or replay with --flor_strong"),
    "FL324": Entry("the random state at a block's start differs from the recording's",
                   "seed or give end() the generators the code before the block draws from"),
    "FL325": Entry("code outside the blocks drew from a global random generator before a block",
                   "seed the generators, or draw only inside blocks"),
    "FL326": Entry("variables a block changes outside end() were set as recorded (or could not be)",
                   "pass the ones named to SkipBlock.end"),
    "FL328": Entry("code outside the blocks changed the model in place where the recording did not",
                   "put the model in eval mode (or torch.no_grad()) for hindsight code"),
    "FL330": Entry("logged values could not be written: they are checked but not stored",
                   "free the disk or make the store writable, and replay again"),
    "FL331": Entry("the replay's TensorBoard events or summary could not be written", "free the disk"),
    "FL333": Entry("flor.arg: the command line asks for another value than the recording used",
                   "record again to change it; the replay uses the recorded value"),
    "FL334": Entry("flor.arg names a hyperparameter the recording does not have", "nothing to do"),
    "FL335": Entry("values a block carries into its next run (a prefetched batch) were set as recorded where it "
                   "was restored", "nothing to do"),
    "FL336": Entry("a value a block carries into its next run is not in the checkpoint restored: the next run "
                   "starts from another value", "pass it to SkipBlock.end(..., x) and record again"),
    "FL337": Entry("variables a block changes outside end() could not be set where a replay restored it",
                   "pass them to SkipBlock.end and record again"),
    "FL338": Entry("a hindsight flor.log added to the script never ran in this replay",
                   "put it where the replayed code runs (probed=True for a block whose runs are restored)"),
    "FL339": Entry("a block is re-executed where a checkpoint exists because the script adds flor.log inside it "
                   "or in a function it calls (as probed=True does)", "nothing to do"),
    "FL340": Entry("the replay writes a file the recording wrote (torch.save, open(..., 'w'), a plot): it now "
                   "holds the replay's values, and every worker of a launch writes it",
                   "guard the write with `if not flor.replaying():`"),
    "FL341": Entry("workers of one launch each wrote a file the recording wrote (FL340): it holds what the last "
                   "worker to write it left", "guard the write with `if not flor.replaying():`"),
    "FL360": Entry("a tracker the script imported (MLflow, W&B, SummaryWriter) could not be quieted in this replay: "
                   "its calls may write to the tracker",
                   "guard the script's tracker calls with `if not flor.replaying():`"),
    "FL361": Entry("--flor_export is not run by one worker of several: the others may not have finished",
                   "run `flor export NAME --to TRACKER` after the last worker, or replay with `flor replay --export`"),
    "FL362": Entry("--flor_export failed at the end of the replay; the replay's values are kept",
                   "fix what the message names, then `flor export NAME --to TRACKER`"),
    # -- FL4: stores and spools ---------------------------------------------------------------
    "FL401": Entry("a run folder leads out of the store through a symbolic link: skipped",
                   "remove the link (`flor verify NAME` lists such problems)"),
    "FL402": Entry("a run is damaged (run.json unreadable or out of range): skipped", "`flor verify NAME`"),
    "FL403": Entry("spooling to S3 is off for this run", "fix the spool, then `flor spool NAME` uploads the run"),
    "FL404": Entry("an upload to the spool failed", "`flor spool NAME` uploads the rest"),
    "FL405": Entry("the run was not (fully) spooled", "`flor spool NAME` uploads the rest"),
    "FL406": Entry("blobs are not local and the store names a spool you never used: not fetched",
                   "if the bucket is yours, set FLOR_SPOOL to it"),
    "FL407": Entry("blobs are not local: fetched from the spool the run was recorded to", "nothing to do"),
    "FL408": Entry("files in the bucket were ignored: not run ids, too large, or keys leading out of the store",
                   "remove them from the bucket"),
    "FL409": Entry("a checkpoint's blobs were not fetched from the spool", "`flor verify NAME`"),
    "FL410": Entry("the spool is not usable: replaying from local files only",
                   "check the bucket's URL and credentials"),
    "FL411": Entry("the spool journal was ignored: what it listed is checked in the bucket again", "nothing to do"),
    "FL412": Entry("the spool a run went to could not be noted in flor's config folder",
                   "set FLOR_SPOOL for its replays, or make FLOR_CONFIG_DIR writable"),
    "FL413": Entry("a damaged or planted log file, or damaged lines in one, were skipped",
                   "move the file out of the run's logs/ folder"),
    "FL414": Entry("the background writer's error handler failed", "report it"),
    "FL415": Entry("a run's script and arguments cannot be signed with a key in flor's config folder",
                   "make FLOR_CONFIG_DIR writable; until then a sweep replays the run only with --dry-run and "
                   "--trust RUN:DIGEST"),
    "FL417": Entry("a run folder or manifest cannot be read by you (its permissions): skipped",
                   "ask its owner to make it readable; `flor verify NAME` names every one"),
    "FL418": Entry("`flor verify --repair` refused: a run folder or manifest cannot be read, or a recording "
                   "holds the store's lock", "repair as a user who can read the whole store, when no recording runs"),
    "FL419": Entry("a recording started while `flor verify --repair` held the store's lock and went on without it",
                   "nothing to do: a repair keeps blobs younger than its grace period (--grace)"),
    "FL416": Entry("a run's recorded argv holds flor's own flags: a sweep does not apply them",
                   "nothing to do: flor's settings come from your command line and environment only"),
    # -- FL5: readers and launches --------------------------------------------------------------
    "FL501": Entry("a plot was written, but no copy could be kept in the run's plots/", "free the disk"),
    "FL502": Entry("a damaged or planted file was skipped while reading a run (marks, metrics, launch records)",
                   "move it out of the run's folder"),
    "FL503": Entry("the launcher starts fewer workers than asked, or more threads than cores",
                   "ask for fewer workers or --threads"),
    "FL504": Entry("the --workers asked for are estimated slower than fewer (each worker's start-up against its "
                   "segment's work, workers sharing the cores)",
                   "leave --workers out (the launcher takes the fastest count) or see `flor replay --plan`"),
    # -- FL6: framework integrations (flor.integrations) ---------------------------------------
    "FL601": Entry("epoch-level values logged in training_step that a replay cannot rebuild for a restored epoch "
                   "(not a tensor, or a reduction other than mean, sum, max or min)",
                   "log a tensor with reduce_fx mean/sum/max/min, or replay with FlorCallback(probed=True)"),
    "FL602": Entry("validation runs in the middle of an epoch (val_check_interval): a replay restores each epoch at "
                   "its end, so values of mid-epoch validations are not replayed for restored epochs",
                   "validate once an epoch (val_check_interval=1.0), or replay with FlorCallback(probed=True)"),
    "FL603": Entry("the Hugging Face Trainer evaluates other than once an epoch: a replay that restores an epoch runs "
                   "no evaluation inside it", "use eval_strategy=\"epoch\", or replay with FlorCallback(probed=True)"),
}


def line(code: str, text: str) -> str:
    """The printed form of a finding: ``flor: FL309 text``."""
    return f"flor: {code} {text}"


def code_of(text: str) -> str | None:
    """The first finding code in ``text``, or None.

    >>> code_of("flor: FL204 SkipBlock.end('train') is not given `loss`")
    'FL204'
    """
    found = CODE.search(text)
    return found.group(0) if found else None


def render_docs() -> str:
    """``docs/findings.md``: every code, what it means and the fix."""
    out = ["# Findings", "",
           "Every warning and replay note flor prints starts with a code: `flor: FL204 SkipBlock.end('train') is not "
           "given ...`. Match on the code, not the sentence. This page is rendered from `flor/findings.py` "
           "(`python -c \"import flor.findings as f; print(f.render_docs(), end='')\" > docs/findings.md`); "
           "a test keeps them equal.", ""]
    heads = {"0": "Settings and the process", "1": "Recording", "2": "State outside end()", "3": "Replay",
             "4": "Stores and spools", "5": "Readers and launches", "6": "Framework integrations"}
    for digit, head in heads.items():
        out += [f"## FL{digit}xx: {head}", "", "| code | meaning | fix |", "| --- | --- | --- |"]
        out += [f"| {code} | {e.title} | {e.fix} |" for code, e in CATALOGUE.items() if code[2] == digit]
        out.append("")
    return "\n".join(out)
