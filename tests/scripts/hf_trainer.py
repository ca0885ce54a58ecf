"""A small Hugging Face Trainer run with FlorCallback: a one-layer BERT built from its config
(nothing downloaded), synthetic token sequences, eval_strategy="epoch", compute_metrics, and a
Trainer whose loss step the script overrides. The hindsight edits of the tests add lines at the marks."""

import json
import os
import sys
import time

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed

import flor
from flor.integrations.transformers import FlorCallback

EPOCHS = int(os.environ.get("EPOCHS", "4"))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 40, (n, 12), generator=g)
        self.labels = (self.ids[:, 0] > 20).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Classifier(Trainer):
    """The Trainer, with the loss of each step (and of evaluation) computed in the script."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        # TRAINING
        return loss


def compute_metrics(pred):
    logits, labels = pred
    metrics = {"accuracy": float((logits.argmax(-1) == labels).mean())}
    # METRICS
    return metrics


set_seed(0)
config = BertConfig(vocab_size=40, hidden_size=int(os.environ.get("WIDTH", "16")), num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=32, max_position_embeddings=16, num_labels=2)
args = TrainingArguments(output_dir="hf_out", num_train_epochs=EPOCHS, per_device_train_batch_size=16,
                         per_device_eval_batch_size=32, learning_rate=1e-3, eval_strategy="epoch",
                         logging_strategy="epoch", save_strategy="epoch", report_to="none", seed=0,
                         use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
trainer = Classifier(model=BertForSequenceClassification(config), args=args,
                     train_dataset=Tokens(int(os.environ.get("SAMPLES", "128")), 1), eval_dataset=Tokens(64, 2),
                     compute_metrics=compute_metrics, callbacks=[FlorCallback()])
started = time.perf_counter()
trainer.train()
print(f"FIT_SECONDS {time.perf_counter() - started:.4f}", file=sys.stderr)  # benchmarks/frameworks.py
print("trained", trainer.state.global_step, file=sys.stderr)
for entry in trainer.state.log_history:  # what a run without flor gives a test to compare
    if "train_runtime" not in entry:
        print("VALUES", json.dumps(entry))
