"""Train a small CNN on scikit-learn's bundled handwritten digits with gradpress.

Run under the launcher (each worker trains on its own shard of the training set):

    gradpress-launch --local --workers 2 --servers 1 -- python examples/train_digits.py

It is a byteps.torch script: only the import line says gradpress.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import gradpress.torch as bps


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def digits_split(seed: int = 0, test_fraction: float = 0.2):
    """The 1797 8x8 digits, scaled to [0, 1], split once with a fixed seed."""
    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def accuracy(model, x, y) -> float:
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    max_steps = int(os.environ.get("GRADPRESS_DEMO_MAX_STEPS", "0"))

    bps.init()
    rank, size = bps.rank(), bps.size()
    torch.manual_seed(args.seed + rank)  # different on purpose: the broadcast makes them equal
    x_train, y_train, x_test, y_test = digits_split(args.seed)
    shard = torch.arange(rank, len(y_train), size)  # each worker its own shard
    x_shard, y_shard = x_train[shard], y_train[shard]

    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)

    shuffle = torch.Generator().manual_seed(args.seed + 1000 * rank)
    steps_per_epoch = len(y_shard) // args.batch_size
    step = 0
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(y_shard), generator=shuffle)
        losses = []
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_shard[idx]), y_shard[idx])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if max_steps and step >= max_steps:
                break
        mean_loss = bps.push_pull(torch.tensor(np.mean(losses)), average=True, name="epoch_loss").item()
        if rank == 0:
            print(f"epoch {epoch:3d}  steps {step:5d}  train loss {mean_loss:.4f}  "
                  f"test accuracy {accuracy(model, x_test, y_test):.4f}", flush=True)
        if max_steps and step >= max_steps:
            break
    if rank == 0:
        print(f"final test accuracy: {accuracy(model, x_test, y_test):.4f}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
