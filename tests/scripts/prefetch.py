"""A nanoGPT-shaped training loop (tests/e2e/test_carried_values.py): iterations in chunks.

nanoGPT is `while True` over `iter_num`; here a flor epoch is a chunk of `--eval_interval`
iterations (docs/loops.md). As in nanoGPT, the next batch is fetched at the end of each
iteration (`X, Y = get_batch("train")`) and the next iteration's forward reads it: the block's
next run starts from the batch its previous run drew. The `checkpoint` dict is built for
`torch.save` and read by nothing after the block.
"""

import argparse

import torch

import flor

ap = argparse.ArgumentParser()
ap.add_argument("--chunks", type=int, default=4)
ap.add_argument("--eval_interval", type=int, default=5)
args, _ = ap.parse_known_args()

torch.manual_seed(1337)
vocab, block_size, batch_size = 16, 8, 4
data = torch.randint(0, vocab, (400,))


def get_batch(split):
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 16)
        self.head = torch.nn.Linear(16, vocab)

    def forward(self, idx, targets=None):
        logits = self.head(torch.tanh(self.emb(idx)))
        loss = None if targets is None else torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        return logits, loss


# HELPERS
model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
iter_num = 0
best_val_loss = 1e9
X, Y = get_batch("train")  # fetch the very first batch
checkpoint = None  # as nanoGPT after a resume: free up memory

for chunk in flor.it(range(args.chunks)):
    if flor.SkipBlock.step_into("train"):
        for micro in range(args.eval_interval):
            logits, loss = model(X, Y)
            X, Y = get_batch("train")  # prefetch the next batch while the GPU would be busy
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clip the gradient, as nanoGPT's grad_clip
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            # INNER
        if loss.item() < best_val_loss:
            best_val_loss = loss.item()
            checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
            torch.save(checkpoint, "ckpt.pt")
    model, optimizer, iter_num, best_val_loss = flor.SkipBlock.end(model, optimizer, iter_num, best_val_loss)
    print(f"chunk {chunk}: iter {iter_num}, best loss {best_val_loss:.4f}")
    # OUTER
