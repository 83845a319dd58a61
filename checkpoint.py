"""
Checkpoints: written atomically, read with clear errors, and loaded into any residual mode.

A checkpoint is a dict saved with torch.save, with nanoGPT's keys:
    model          the model's state_dict
    model_args     the GPTConfig fields (a dict)
    optimizer, iter_num, best_val_loss, config (the training config), and whatever else
    train.py needs to resume exactly (RNG states, data position).
"""

import os
from dataclasses import asdict
from pathlib import Path

import torch

from model import GPT, GPTConfig


def save_checkpoint(obj, path):
    """torch.save to a temporary file next to path, then rename: an interrupted save never leaves a
    file that looks complete, and the previous checkpoint survives until the new one is whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, map_location="cpu"):
    """The checkpoint dict at path, or a one-line error that says what to do."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: train one first (python train.py --out_dir={path.parent})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated or not a torch file
        raise ValueError(f"cannot read checkpoint {path} ({type(e).__name__}: {e}); it is damaged, retrain or restore it") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise ValueError(f"{path} is not a checkpoint of this project (no 'model' and 'model_args' keys)")
    return ckpt


def clean_state_dict(state_dict):
    """Strip the '_orig_mod.' prefix that torch.compile adds to parameter names."""
    prefix = "_orig_mod."
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state_dict.items()}


def load_state_into(model, state_dict):
    """Load state_dict into model, converting between residual modes (SPEC equivalence 2): a
    pseudo-query the checkpoint lacks keeps the model's zero init, so a standard checkpoint becomes
    a routed model with the same function; pseudo-queries the model has no use for are dropped.
    Returns the lists (missing queries, dropped queries). Any other mismatch is an error."""
    state_dict = clean_state_dict(state_dict)
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    dropped = [k for k in state_dict if k not in own]
    bad = [k for k in missing + dropped if "res_query" not in k]
    if bad:
        raise ValueError(f"checkpoint and model do not match: {'missing' if bad[0] in missing else 'unexpected'} "
                         f"parameter {bad[0]} (and {len(bad) - 1} more); are lowrank_rank and n_layer the same as in the checkpoint?")
    for k, v in state_dict.items():
        if k in own and own[k].shape != v.shape:
            raise ValueError(f"checkpoint and model do not match: {k} has shape {tuple(v.shape)} in the checkpoint "
                             f"but {tuple(own[k].shape)} in the model; use the checkpoint's n_embd/n_layer/vocab_size/block_size")
    model.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)
    return missing, dropped


def load_model(path, device="cpu", **overrides):
    """(model, checkpoint) from a checkpoint file. overrides change GPTConfig fields, e.g.
    residual="delta" to convert into another mode, or dropout=0.0 for inference."""
    ckpt = load_checkpoint(path, map_location=device)
    model_args = dict(ckpt["model_args"])
    model_args.update(overrides)
    model = GPT(GPTConfig.from_dict(model_args))
    load_state_into(model, ckpt["model"])
    return model.to(device), ckpt


def model_args(model):
    """The model's config as the plain dict a checkpoint stores."""
    return asdict(model.config)
