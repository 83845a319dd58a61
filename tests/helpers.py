"""Small helpers shared by the test files."""

import torch

from model import GPTConfig


def tiny_config(**overrides):
    """A model small enough for a test: 3 layers (6 sublayers: res_blocks 2, 3 and 6 all divide), 32 wide."""
    cfg = dict(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=32, dropout=0.0, bias=True)
    cfg.update(overrides)
    return GPTConfig(**cfg)


@torch.no_grad()
def perturb_norms_and_biases(model):
    """Make a fresh model's weights non-trivial: random LayerNorm gains and biases, random biases,
    so that equivalences cannot hold by accident."""
    for name, p in model.named_parameters():
        if "ln" in name:
            p.add_(0.3 * torch.randn_like(p))
        if name.endswith(".bias"):
            p.add_(0.1 * torch.randn_like(p))
    return model


@torch.no_grad()
def randomise_queries(model, seed=1, scale=2.0):
    """Random pseudo-queries (N(0, scale^2), from their own generator): routes that really choose."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "res_query" in name:
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model
