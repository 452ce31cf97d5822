"""The two problems of the convergence study: their data, model and metric.

- digits: the demo's CNN on scikit-learn's bundled 8x8 digits (examples/train_digits.py).
- lm: a small character-level (byte-level) transformer language model on the text of this
  Python's own standard library: the first ``LM_BYTES`` bytes of the top-level ``*.py``
  files under ``os.path.dirname(os.__file__)``, in sorted order; the last
  ``LM_VAL_FRACTION`` of them held out for validation.
"""
from __future__ import annotations

import glob
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_digits import DigitsCNN, digits_split  # noqa: E402  (the demo's model and split)

LM_BYTES = 1_000_000
LM_VAL_FRACTION = 0.1
LM_CONTEXT = 64
LM_VAL_WINDOWS = 256


class CharTransformer(nn.Module):
    """Byte-level causal transformer: embedding, pre-norm encoder layers, tied output."""

    def __init__(self, vocab: int = 256, dim: int = 128, heads: int = 4, layers: int = 2,
                 context: int = LM_CONTEXT):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:n]
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.norm(h) @ self.embed.weight.t()


def stdlib_text(budget: int = LM_BYTES) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(train bytes, validation bytes, files used): a fixed, sorted subset of the stdlib."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    chunks, used, total = [], [], 0
    for path in files:
        with open(path, "rb") as fh:
            data = fh.read()
        chunks.append(data[:budget - total])
        used.append(os.path.basename(path))
        total += len(chunks[-1])
        if total >= budget:
            break
    text = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()
    n_val = int(len(text) * LM_VAL_FRACTION)
    return text[:-n_val], text[-n_val:], used


class DigitsTask:
    name = "digits"
    metric = "acc"

    def __init__(self, seed: int):
        self.x_train, self.y_train, self.x_test, self.y_test = digits_split(seed)

    def model(self) -> nn.Module:
        return DigitsCNN()

    def batches(self, rank: int, size: int, batch: int, seed: int):
        shard = torch.arange(rank, len(self.y_train), size)
        x, y = self.x_train[shard], self.y_train[shard]
        g = torch.Generator().manual_seed(seed + 1000 * rank)
        while True:
            order = torch.randperm(len(y), generator=g)
            for i in range(len(y) // batch):
                idx = order[i * batch:(i + 1) * batch]
                yield x[idx], y[idx]

    @staticmethod
    def loss(model: nn.Module, x, y) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict:
        model.eval()
        logits = model(self.x_test)
        model.train()
        return {"loss": F.cross_entropy(logits, self.y_test).item(),
                "acc": (logits.argmax(1) == self.y_test).float().mean().item()}


class LMTask:
    name = "lm"
    metric = "loss"

    def __init__(self, seed: int):
        self.train, self.val, self.files = stdlib_text()
        starts = torch.arange(0, len(self.val) - LM_CONTEXT - 1, LM_CONTEXT)[:LM_VAL_WINDOWS]
        self.val_x = torch.stack([self.val[s:s + LM_CONTEXT] for s in starts])
        self.val_y = torch.stack([self.val[s + 1:s + LM_CONTEXT + 1] for s in starts])

    def model(self) -> nn.Module:
        return CharTransformer()

    def batches(self, rank: int, size: int, batch: int, seed: int):
        g = torch.Generator().manual_seed(seed + 1000 * rank)
        offsets = torch.arange(LM_CONTEXT + 1)
        while True:
            starts = torch.randint(0, len(self.train) - LM_CONTEXT - 1, (batch,), generator=g)
            windows = self.train[starts[:, None] + offsets]
            yield windows[:, :-1], windows[:, 1:]

    @staticmethod
    def loss(model: nn.Module, x, y) -> torch.Tensor:
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict:
        model.eval()
        loss = self.loss(model, self.val_x, self.val_y).item()
        model.train()
        return {"loss": loss, "acc": math.exp(-loss)}


TASKS = {"digits": DigitsTask, "lm": LMTask}
