"""Small helpers shared by the test files."""

import torch


@torch.no_grad()
def perturb_norms_and_biases(model, query_scale=0.0):
    """Make a fresh model's weights non-trivial: random LayerNorm gains and biases, random biases,
    and (query_scale > 0) random pseudo-queries, so that equivalences cannot hold by accident."""
    for name, p in model.named_parameters():
        if "ln" in name:
            p.add_(0.3 * torch.randn_like(p))
        if name.endswith(".bias"):
            p.add_(0.1 * torch.randn_like(p))
        if query_scale and "res_query" in name:
            p.copy_(query_scale * torch.randn_like(p))
    return model
