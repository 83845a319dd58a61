"""
Fold the Duplicated Latent Residual away for deployment (README "Folding DLR away").

    python fold.py --ckpt=out-dlr/ckpt.pt --out=out-dlr/folded.pt           # DLR -> plain low rank, same outputs
    python fold.py --ckpt=out-dlr/ckpt.pt --out=out-dlr/dense.pt --dense    # low rank -> ordinary dense weights

DLR adds (alpha / sqrt K) R z to every low-rank linear, R a fixed 0/1 matrix, so
y = (B + (alpha / sqrt K) R) z + bias: folding writes that sum into B and switches DLR off. The
folded checkpoint has exactly the parameters, FLOPs and memory of a plain low-rank model.

--dense also multiplies out W = B A (with DLR folded into B first), giving ordinary nn.Linear
weights: a plain GPT checkpoint that GPT-2 style tools load (when the model's residual mode is
standard). It needs lowrank_act=identity: with silu, B silu(A x) is no linear map of x.

Before writing, the new checkpoint is loaded into a fresh model of the target config (so its
shapes are that model's) and checked against the original: the largest logit difference on a batch
of random tokens; the parameter count and training FLOPs per token are printed. The rest of the
checkpoint (training config, dataset_meta, iter_num) is kept so sample.py can use it; the
optimizer state is dropped, as it belongs to the weights before the fold.

--out must not exist yet: a training checkpoint there (its optimizer state, its iteration) would be
lost. --overwrite replaces an earlier fold's file; the input checkpoint itself is never replaced.
"""

import argparse
import os
from pathlib import Path

import torch

from checkpoint import load_model, load_state_into, save_checkpoint
from common import MAX_SEED, boolean, cannot_write, die, resolve_device
from model import GPT, GPTConfig, LowRankLinear

# The check fails when max |logit diff| exceeds this fraction of max |logit|. A fold stores the very
# float32 sum B + sR that the DLR forward forms on every call, so the logits stay bitwise equal.
# --dense stores B A rounded to float32 and multiplies in another order: logits move by 1e-6 to 2e-4
# of their scale (measured on small fresh models; routed ones, with sharp random routing, at the top).
# A real mistake moves them far more (a lost bias: 0.3 of their scale).
CHECK_RTOL = 1e-2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default="out/ckpt.pt", help="the checkpoint to fold")
    p.add_argument("--out", required=True, help="where to write the folded checkpoint (a new file, never the input)")
    p.add_argument("--overwrite", type=boolean, nargs="?", const=True, default=False,
                   help="replace --out if it exists (without it, an existing --out is refused: it may be a training checkpoint)")
    p.add_argument("--dense", type=boolean, nargs="?", const=True, default=False, help="also multiply out B A into dense weights")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps | auto")
    p.add_argument("--check_batch", type=int, default=4, help="sequences in the verification batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the verification batch")
    args = p.parse_args(argv)
    if args.check_batch < 1:
        p.error("--check_batch is the number of sequences the fold is checked on: at least 1")
    if not 0 <= args.seed <= MAX_SEED:
        p.error(f"--seed must be from 0 to {MAX_SEED}")
    try:
        args.device = resolve_device(args.device)
    except ValueError as e:
        p.error(str(e))
    return args


def same_file(a, b):
    """True when writing b would replace a: the same path, through links or not."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    return a.exists() and b.exists() and os.path.samefile(a, b)


def check_out(args):
    """Exit with a one-line error, before any work, if --out cannot or must not be written."""
    if same_file(args.ckpt, args.out):
        ckpt = Path(args.ckpt)
        beside = ckpt.with_name("folded.pt" if not same_file(ckpt, ckpt.with_name("folded.pt")) else f"{ckpt.stem}_folded.pt")
        die(f"--out {args.out} is the input checkpoint; write the folded one next to it, e.g. --out={beside}")
    problem = cannot_write(args.out)
    if problem:
        die(f"cannot write --out {args.out}: {problem}; choose another --out")
    if Path(args.out).exists() and not args.overwrite:
        die(f"--out {args.out} already exists (a training checkpoint there would be lost): "
            "choose another --out, or pass --overwrite to replace it")


def lowrank_linears(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, LowRankLinear)}


def dense_state_dict(model):
    """The state dict of the same model with every (DLR-free) low-rank linear as one nn.Linear:
    weight = B A (multiplied in float64, stored in B's dtype), bias = B's bias."""
    linears = lowrank_linears(model)
    sd = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 2)[0] not in linears}
    for name, m in linears.items():
        assert not m.dlr, "fold DLR into B before multiplying out B A"
        sd[f"{name}.weight"] = (m.B.weight.double() @ m.A.weight.double()).to(m.B.weight.dtype)
        if m.B.bias is not None:
            sd[f"{name}.bias"] = m.B.bias.detach().clone()
    return sd


def build(model_args, state_dict, device):
    """A fresh model of model_args holding state_dict: what load_model will make of the written file."""
    model = GPT(GPTConfig.from_dict(dict(model_args, dropout=0.0))).to(device)
    load_state_into(model, state_dict)
    return model.eval()


def all_logits(model, idx):
    logits, _ = model(idx, targets=torch.zeros_like(idx))  # with targets: logits at every position
    return logits


def main(argv=None):
    args = parse_args(argv)
    check_out(args)
    try:
        model, ckpt = load_model(args.ckpt, args.device, dropout=0.0)
    except (FileNotFoundError, ValueError) as e:
        die(e)
    model.eval()
    cfg = model.config
    had_dlr = cfg.dlr  # model.fold_dlr() below switches cfg.dlr off
    if cfg.lowrank_rank == 0:
        die(f"{args.ckpt} has dense linears (lowrank_rank=0): there is nothing to fold")
    if not args.dense and not had_dlr:
        die(f"{args.ckpt} has no DLR (dlr=False): there is nothing to fold; "
             "--dense multiplies out its low-rank B A instead")
    if args.dense and cfg.lowrank_act != "identity":
        die(f"--dense needs lowrank_act=identity, {args.ckpt} has {cfg.lowrank_act}: B {cfg.lowrank_act}(A x) "
             "is not a linear map of x, so no dense matrix equals it")

    # the target: the DLR-free low-rank model, or the dense one
    new_args = dict(ckpt["model_args"], dlr=False)
    if args.dense:
        new_args["lowrank_rank"] = 0
    g = torch.Generator().manual_seed(args.seed)
    T = min(cfg.block_size, 256)
    idx = torch.randint(0, cfg.vocab_size, (args.check_batch, T), generator=g).to(args.device)
    n_linears = len(lowrank_linears(model))
    with torch.no_grad():
        before = all_logits(model, idx)
        before_count = (model.get_num_params(), model.flops_per_token())
        model.fold_dlr()  # B <- B + (alpha / sqrt K) R, DLR off
        new_state = dense_state_dict(model) if args.dense else model.state_dict()
        new_model = build(new_args, new_state, args.device)
        after = all_logits(new_model, idx)
    diff = (after - before).abs().max().item()
    scale = before.abs().max().item()
    after_count = (new_model.get_num_params(), new_model.flops_per_token())

    print(f"{args.ckpt} -> {args.out}: DLR {'folded into B' if had_dlr else 'off'} in {n_linears} low-rank linears"
          + (", B A multiplied out into dense weights" if args.dense else ""))
    print(f"{'':<22} {'params':>14} {'FLOPs/token':>16}")
    for label, (n, f) in ((f"before ({'DLR' if had_dlr else 'low rank'})", before_count),
                          (f"after ({'dense' if args.dense else 'folded'})", after_count)):
        print(f"{label:<22} {n:>14,} {f:>16,}")
    print(f"max |logit diff| {diff:.3g} on {args.check_batch} x {T} random tokens (max |logit| {scale:.3g})")
    if not diff <= CHECK_RTOL * max(scale, 1.0):
        die(f"the logits changed by {diff:.3g}, more than {CHECK_RTOL:g} of their scale; not writing {args.out}")

    out = {k: v for k, v in ckpt.items() if k != "optimizer"}  # the optimizer state belongs to the old weights
    out.update(model=new_state, model_args=new_args,
               fold={"from": str(args.ckpt), "dense": args.dense, "max_abs_logit_diff": diff})
    try:
        save_checkpoint(out, args.out)
    except OSError as e:  # a full disk, or the folder changed since check_out: write_atomic left nothing behind
        die(f"cannot write --out {args.out} ({e.strerror or e}); choose another --out")
    print(f"wrote {args.out} (dlr=False{', lowrank_rank=0' if args.dense else ''}; optimizer state dropped)")
    if args.dense and cfg.residual != "standard":
        print(f"note: the export keeps residual={cfg.residual}; GPT-2 style tools load only standard checkpoints")


if __name__ == "__main__":
    main()
