"""A convolutional net in channels_last memory format trained with fused AdamW. Used by
tests/test_layouts.py.

The optimizer's moments take the layout of the gradients (channels_last). A fused optimizer
walks a parameter and its moments as flat memory, so moments restored in another layout
(contiguous) are added to the wrong elements; and a reduction over them (a norm) sums in
another order, so a hindsight value read from them differs in its last bits.
"""

import torch

import flor

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(6, 4, 3),
                          torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2)).to(memory_format=torch.channels_last)
X = torch.randn(64, 3, 8, 8).contiguous(memory_format=torch.channels_last)
Y = (X.mean((1, 2, 3)) > 0).long()
opt = torch.optim.AdamW(net.parameters(), lr=0.01, fused=True)
for epoch in flor.it(range(6)):
    if flor.SkipBlock.step_into("train"):
        for i in range(0, 64, 16):
            loss = torch.nn.functional.cross_entropy(net(X[i:i + 16]), Y[i:i + 16])
            opt.zero_grad()
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    with torch.no_grad():
        flor.log("loss", torch.nn.functional.cross_entropy(net(X), Y).item())
    # HINDSIGHT
