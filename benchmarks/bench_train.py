"""The training script the benchmarks record and replay (generated data, no downloads).

--model cnn       a small conv net on 1x28x28 inputs (~0.2 MB of parameters)
--model big       an MLP with ~10.5M parameters: with AdamW state ~126 MB to checkpoint
--model finetune  the big MLP's body frozen, a small head trained: storage dedup
--hindsight       adds an outer-loop hindsight log (weight norm), what a user adds later
--probe           marks the block probed and logs the loss inside it
--memcpy-probe    after the loop: the GB/s of copying the state into reused buffers (the
                  same-process bound a snapshot's copy runs against; from a GPU: into reused
                  pinned buffers, waited for)
--device cuda     train on the GPU (benchmarks/gpu.py); the data is made there
--habit H         what users do instead (benchmarks/habits.py): torch.save or DCP's async_save
                  of model and optimizer every epoch; prints PEAK_RSS_KB at the end
"""

import argparse
import os
import resource
import time
import types

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=["cnn", "big", "finetune"], default="cnn")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps", type=int, default=20, help="batches per epoch")
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--hindsight", action="store_true")
parser.add_argument("--probe", action="store_true")
parser.add_argument("--device", default="cpu")
parser.add_argument("--habit", choices=["none", "torch_save", "dcp_async"], default="none",
                    help="what users do instead of flor: save model and optimizer every epoch into --habit-dir "
                         "(torch.save, or torch.distributed.checkpoint.async_save, awaited before the next)")
parser.add_argument("--habit-dir", default="habit-checkpoints")
parser.add_argument("--memcpy-probe", action="store_true",
                    help="after the loop, time copying the model's and optimizer's tensors into reused buffers")
args = parser.parse_args()

torch.manual_seed(0)
if args.model == "cnn":
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(32 * 7 * 7, 10),
    )
    shape = (1, 28, 28)
else:
    body = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    )
    net = torch.nn.Sequential(body, torch.nn.Linear(2048, 10))
    shape = (1024,)
    if args.model == "finetune":
        body.requires_grad_(False)
device = torch.device(args.device)
if device.type == "cuda":  # the same kernels in every run, so that a probed replay is bit for bit
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
net.to(device)
params = [p for p in net.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(params, lr=1e-3)
# made where training reads them (on a GPU, ~1 GB of inputs would take seconds on the CPU)
data = torch.randn(args.steps * args.batch, *shape, device=device)
labels = torch.randint(0, 10, (args.steps * args.batch,), device=device)
val = torch.randn(256, *shape, device=device)
val_labels = torch.randint(0, 10, (256,), device=device)

# not a plain float: a replay worker restores the epoch loop's plain variables from the recording
# (docs/loops.md); a float the loop never changes is no longer restored, but older recordings did
clock = types.SimpleNamespace(loop=time.perf_counter())
pending = None  # the last async_save's future
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train", probed=args.probe):
        perm = torch.randperm(len(data))
        for i in range(args.steps):
            idx = perm[i * args.batch:(i + 1) * args.batch]
            loss = torch.nn.functional.cross_entropy(net(data[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.probe:
                flor.log("loss", loss.item(), step=epoch * args.steps + i)
    net, optimizer = flor.SkipBlock.end(net, optimizer)
    if args.habit == "torch_save":  # nanoGPT's and pytorch/examples' habit, one file an epoch
        os.makedirs(args.habit_dir, exist_ok=True)
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   os.path.join(args.habit_dir, f"ckpt_{epoch}.pt"))
    elif args.habit == "dcp_async":
        import torch.distributed.checkpoint as dcp

        if pending is not None:
            pending.result()  # one in flight at a time, as its documentation's example does
        pending = dcp.async_save({"model": net.state_dict(), "optimizer": optimizer.state_dict()},
                                 checkpoint_id=os.path.join(args.habit_dir, f"epoch_{epoch}"))
    with torch.no_grad():
        val_loss = torch.nn.functional.cross_entropy(net(val), val_labels).item()
    flor.log("val_loss", val_loss)
    if args.hindsight:
        flor.log("weight_norm", float(sum(p.double().norm() ** 2 for p in net.parameters()) ** 0.5))
if pending is not None:
    pending.result()
print(f"LOOP_SECONDS {time.perf_counter() - clock.loop:.6f}")
print(f"PEAK_RSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
if args.memcpy_probe:  # the bound a snapshot copies against, in the same process and memory state
    state = [t for t in net.state_dict().values()] + [
        t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    gpu = device.type == "cuda"
    reused = [torch.empty(t.shape, dtype=t.dtype, pin_memory=gpu and not t.is_cpu) for t in state]
    with torch.no_grad():
        torch._foreach_copy_(reused, state)  # every page faulted in once, as flor's buffer sets are
        times = []
        for _ in range(5):
            if gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch._foreach_copy_(reused, state, non_blocking=gpu)
            if gpu:
                torch.cuda.synchronize()  # until the copies have landed
            times.append(time.perf_counter() - t0)
    nbytes = sum(t.numel() * t.element_size() for t in state)
    print(f"MEMCPY_GBPS {nbytes / sorted(times)[2] / 1e9:.3f}")
