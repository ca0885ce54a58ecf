"""A script in the common shape ``sys.exit(main())``: its ``sys.exit`` is looked up before
``main()`` starts the recording (tests/test_exit_status.py). ``main()`` returns the code in
``MAIN_RETURNS`` (none when unset)."""

import os
import sys

import torch

import flor


def main():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    for epoch in flor.it(range(3)):
        if flor.SkipBlock.step_into("train"):
            loss = net(torch.randn(16, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        flor.SkipBlock.end(net, optimizer)
        flor.log("loss", loss.item())
    code = os.environ.get("MAIN_RETURNS")
    return None if code is None else int(code)


if __name__ == "__main__":
    sys.exit(main())
