"""The Hugging Face FlorCallback in process: inert without flags, and the Trainer state it gives
``end()`` (TrainerState, early stopping's patience, the inner loop's loss accumulators) survives
flor's capture and restore into another Trainer (a replay worker's)."""

from __future__ import annotations


import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from flor.integrations.transformers import FlorCallback, _StateOf  # noqa: E402
from flor.state import restore, snapshot  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 20, (16, 6), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": (self.ids[i, 0] > 10).long()}


def trained(tmp_path, seed: int, *callbacks):
    transformers.set_seed(seed)
    config = transformers.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=8, num_labels=2)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, per_device_train_batch_size=8,
                                          eval_strategy="epoch", logging_strategy="epoch", save_strategy="no",
                                          report_to="none", use_cpu=True, disable_tqdm=True, seed=seed,
                                          metric_for_best_model="eval_loss", load_best_model_at_end=False)
    early = transformers.EarlyStoppingCallback(early_stopping_patience=3)
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                                   train_dataset=Tokens(seed), eval_dataset=Tokens(seed + 1),
                                   callbacks=[early, *callbacks])
    trainer.train()
    return trainer, early


def test_inert_without_flags(tmp_path) -> None:
    own = FlorCallback()
    trainer, _ = trained(tmp_path, 0, own)
    assert own.epochs is None and own.trainer is None
    assert "_run_epoch" not in vars(trainer)  # the Trainer's own loop, untouched


def test_trainer_state_survives_capture_and_restore(tmp_path) -> None:
    own = FlorCallback()
    first, early = trained(tmp_path / "a", 0, own)
    early.early_stopping_patience_counter = 2
    own.grad_norm, own.learning_rate = 0.25, 1e-4
    first._tr_loss += 1.5
    blobs: dict = {}
    tree = snapshot([_StateOf(first, own)]).materialize(lambda data, digest: blobs.__setitem__(digest, bytes(data)))

    other = FlorCallback()
    second, early2 = trained(tmp_path / "b", 1, other)
    restore([_StateOf(second, other)], tree, blobs.__getitem__)
    assert second.state.global_step == first.state.global_step == 2
    # the training and evaluation logs as recorded, without their timings (they differ from run to run)
    timings = ("_runtime", "_per_second")
    assert any(k.endswith(timings) for entry in first.state.log_history for k in entry)
    assert second.state.log_history == [{k: v for k, v in entry.items() if not k.endswith(timings)}
                                        for entry in first.state.log_history]
    assert second.state.best_metric == first.state.best_metric
    assert early2.early_stopping_patience_counter == 2
    assert torch.equal(second._tr_loss, first._tr_loss)
    assert (second._globalstep_last_logged, second._total_loss_scalar) == \
        (first._globalstep_last_logged, first._total_loss_scalar)
    assert (other.grad_norm, other.learning_rate) == (0.25, 1e-4)


@pytest.mark.parametrize("strategy", ["steps", "no"])
def test_recording_names_an_evaluation_a_replay_cannot_run_FL603(tmp_path, monkeypatch, strategy) -> None:
    from flor import hooks

    from helpers import RecordingLoop, said

    loop = RecordingLoop()
    monkeypatch.setattr(hooks, "current", lambda: loop)
    config = transformers.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=8, num_labels=2)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=8,
                                          eval_strategy=strategy, eval_steps=1, logging_strategy="epoch",
                                          save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    with pytest.warns(RuntimeWarning) as caught:
        trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                                       train_dataset=Tokens(0), eval_dataset=Tokens(1), callbacks=[FlorCallback()])
    lines = said("\n".join(str(w.message) for w in caught), "FL603")
    assert len(lines) == 1 and repr(strategy) in lines[0], lines
    trainer.train()
    assert loop.ends == 2  # each epoch is checkpointed all the same
