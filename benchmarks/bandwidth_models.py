"""The models ``benchmarks/bandwidth.py`` trains, and each one's fixed synthetic batch.

- ``mlp``: 1024-4096-4096-1024 with ReLU, 25,175,040 parameters in 6 tensors (4 large
  matrices' worth of bytes in few tensors: the case per-tensor decisions barely touch).
- ``tfm``: a decoder-only transformer language model, token and position embeddings,
  8 pre-norm blocks of width 512 (8 heads, feed-forward 2048), a final LayerNorm and
  an untied output layer over 8,192 tokens: 33,625,088 parameters in 102 tensors, from
  4.2M-element matrices down to 512-element biases (the mixed sizes a planner decides
  over). Plain ``torch.nn`` modules, dropout 0, a causal mask.

Each worker's batch comes from a generator seeded by its rank and stays the same for
every iteration (one fixed batch, as the MLP always had), so a run's losses repeat.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

MLP_LAYERS = [1024, 4096, 4096, 1024]
MLP_BATCH = 32

TFM_VOCAB = 8192
TFM_WIDTH = 512
TFM_HEADS = 8
TFM_FFN = 2048
TFM_BLOCKS = 8
TFM_BATCH, TFM_SEQ = 4, 16  # 64 tokens: compute of the same order as the MLP's batch on one thread


def build_mlp():
    import torch
    layers = []
    for i, (a, b) in enumerate(zip(MLP_LAYERS, MLP_LAYERS[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(MLP_LAYERS) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def mlp_batch(gen):
    """(inputs, targets); drawn in the order the benchmark always drew them."""
    import torch
    x = torch.randn(MLP_BATCH, MLP_LAYERS[0], generator=gen)
    y = torch.randint(MLP_LAYERS[-1], (MLP_BATCH,), generator=gen)
    return x, y


def build_tfm():
    import torch
    from torch import nn

    class TransformerLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(TFM_VOCAB, TFM_WIDTH)
            self.positions = nn.Embedding(TFM_SEQ, TFM_WIDTH)
            block = nn.TransformerEncoderLayer(TFM_WIDTH, TFM_HEADS, TFM_FFN, dropout=0.0, batch_first=True,
                                               norm_first=True)
            # enable_nested_tensor only matters for padded inference; off, it stops a warning
            self.blocks = nn.TransformerEncoder(block, TFM_BLOCKS, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(TFM_WIDTH)
            self.head = nn.Linear(TFM_WIDTH, TFM_VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(TFM_SEQ), persistent=False)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            h = self.tokens(ids) + self.positions(pos)
            h = self.blocks(h, mask=self.mask[:ids.shape[1], :ids.shape[1]], is_causal=True)
            # (batch, seq, vocab) -> (batch * seq, vocab): cross-entropy over every position
            return self.head(self.norm(h)).reshape(-1, TFM_VOCAB)

    return TransformerLM()


def tfm_batch(gen):
    """(token ids, next-token targets flattened), from one random sequence per row."""
    import torch
    seq = torch.randint(TFM_VOCAB, (TFM_BATCH, TFM_SEQ + 1), generator=gen)
    return seq[:, :-1], seq[:, 1:].reshape(-1)


@dataclass(frozen=True)
class Model:
    name: str
    build: Callable
    batch: Callable       # a seeded torch.Generator -> (inputs, targets)
    title: str            # for charts
    params: int           # parameters (the worker checks it): what an uncompressed iteration moves


MODELS = {
    "mlp": Model("mlp", build_mlp, mlp_batch, f"MLP {'-'.join(map(str, MLP_LAYERS))}, batch {MLP_BATCH}",
                 25_175_040),
    "tfm": Model("tfm", build_tfm, tfm_batch,
                 f"transformer LM, {TFM_BLOCKS} blocks x {TFM_WIDTH}, {TFM_BATCH} x {TFM_SEQ} tokens", 33_625_088),
}
