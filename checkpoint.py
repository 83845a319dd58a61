"""
Checkpoints: written atomically and durably, read safely with clear errors, and loaded into any residual mode.

A checkpoint is a dict saved with torch.save, with nanoGPT's keys:
    model          the model's state_dict
    model_args     the GPTConfig fields (a dict)
    optimizer, iter_num, best_val_loss, config (the training config), and whatever else
    train.py needs to resume exactly (RNG states, data position).
It holds plain data only (tensors, numbers, strings, None, lists, tuples, dicts), so it is read with
torch.load(weights_only=True): a file that holds anything else is refused before any of it runs.

OpenAI's GPT-2 weights (Hugging Face's model.safetensors) load the same way: load_gpt2. sample.py and
eval.py take either, with its tokenizer, from load_for_inference.
"""

import os
import pickle
import zipfile
from dataclasses import asdict
from pathlib import Path

import torch

from common import write_atomic
from download import download
from model import GPT, GPTConfig
from shards import get_tokenizer


def save_checkpoint(obj, path):
    """torch.save through common.write_atomic: an interrupted save or a power cut never leaves a
    file that looks complete, and the previous checkpoint survives until the new one is on disk.
    Tensors are saved on the CPU, so that a plain torch.load works on a machine without the GPU
    they were trained on (torch.save keeps each tensor's device, and loading it needs that device)."""
    obj = to_cpu(obj)
    try:
        write_atomic(path, lambda f: torch.save(obj, f))
    except RuntimeError as e:
        # torch.save's zip writer turns a failed write (a full disk) into a RuntimeError as it closes, with the
        # OSError as its context: raise that one, which says what happened and which callers catch. So too a
        # Ctrl-C (train.py's second stop signal) mid-save, which must stop the run as a KeyboardInterrupt
        if isinstance(e.__context__, (OSError, KeyboardInterrupt)):
            raise e.__context__ from None
        raise


def to_cpu(obj):
    """obj with every tensor inside its dicts, lists and tuples on the CPU (CPU tensors are not copied)."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def load_checkpoint(path, map_location="cpu"):
    """The checkpoint dict at path, or a one-line error that says what to do. Checkpoints are shared,
    and unpickling an arbitrary object can run any code: only plain data is let through."""
    path = Path(path)
    if path.is_dir():
        inside = f": pass its checkpoint, {path / 'ckpt.pt'}" if (path / "ckpt.pt").is_file() else ""
        raise FileNotFoundError(f"{path} is a folder, not a checkpoint file{inside}")
    if not path.is_file():
        writes = f"--out_dir={path.parent} writes it" if path.name == "ckpt.pt" else "--out_dir=DIR writes DIR/ckpt.pt"
        raise FileNotFoundError(f"no checkpoint at {path}: check the path, or train one first (python train.py {writes})")
    with open(path, "rb") as f:
        head = f.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save's zip archive, or its legacy pickle
        what = "an empty file" if not head else "not a file torch.save writes"
        raise ValueError(f"{path} is not a checkpoint ({what}): pass a ckpt.pt that train.py or fold.py wrote")
    damaged = _damaged_record(path)
    if damaged:
        raise ValueError(f"checkpoint {path} is damaged ({damaged}), so it was not loaded: restore it from a copy or retrain")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # the safe unpickler met a class or function: refused before it ran
        raise ValueError(f"{path} holds objects a checkpoint must not hold{_unsafe_globals(path)}, so it was not "
                         "loaded and nothing in it ran: use a checkpoint written by train.py or fold.py") from None
    except Exception as e:  # truncated or not a torch file
        raise ValueError(f"cannot read checkpoint {path} ({type(e).__name__}: {e}); it is damaged, retrain or restore it") from None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict) and isinstance(ckpt.get("model_args"), dict)):
        raise ValueError(f"{path} is not a checkpoint of this project (no 'model' and 'model_args' dicts)")
    return ckpt


def _damaged_record(path):
    """What in the checkpoint no longer holds the bytes torch.save wrote, or None. torch.save writes a zip
    archive with a CRC-32 per record (the pickle, each tensor's bytes), but torch.load does not check them:
    a bit flipped on a disk or in a copy would load as a wrong weight. Checking is one more read of the
    file, at several GB/s. A record whose CRC-32 is 0 has none to check: torch.save writes 0 when its
    compute_crc32 setting is off (and a real CRC-32 is 0 once in 4 billion records)."""
    try:
        if not zipfile.is_zipfile(path):
            return None  # the legacy (pre-zip) format, or no archive at all: torch.load says what it is
        with zipfile.ZipFile(path) as archive:
            for record in archive.infolist():
                if record.CRC:
                    with archive.open(record) as f:
                        while f.read(1 << 24):  # at its end zipfile compares the CRC-32: BadZipFile if it differs
                            pass
    except Exception as e:  # a bad CRC-32, or the archive's own directory broken: then zipfile fails in many ways
        return f"{type(e).__name__}: {e}"  # (another compression method, "encrypted", zlib's errors, a name not UTF-8)
    return None


def _unsafe_globals(path):
    # " (builtins.exec, ...)": the names the file would import, read without unpickling; "" if unknown
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # the legacy (pre-zip) format cannot be listed
        return ""
    return f" ({', '.join(names)})" if names else ""


def clean_state_dict(state_dict):
    """Strip the '_orig_mod.' prefix that torch.compile adds to parameter names."""
    prefix = "_orig_mod."
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state_dict.items()}


DEFAULT_ARGS = asdict(GPTConfig())  # what a checkpoint's model_args lacks (GPT-2's: every routing setting)
# the model's shape: every checkpoint train.py, fold.py or nanoGPT writes gives it, and no default can stand in for
# it (GPTConfig's are GPT-2 small's; and n_head shows in no weight's shape, so a wrong one would load silently)
SHAPE_ARGS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")


def checkpoint_model_args(ckpt, path):
    """Every GPTConfig field of the model in ckpt, the checkpoint read from path. A field its model_args lack
    takes its default, as nanoGPT's checkpoints need (no routing or low-rank settings: standard and dense), and
    ours from before a field was added (fixed_value_route: False); a shape field lacking is a ValueError naming it."""
    lacking = [k for k in SHAPE_ARGS if k not in ckpt["model_args"]]
    if lacking:
        raise ValueError(f"{path} has no {' or '.join(lacking)} in its model_args: the model's shape, which no default "
                         "can stand for; use a checkpoint written by train.py, fold.py or nanoGPT (or add the value to "
                         "its model_args)")
    return {**DEFAULT_ARGS, **ckpt["model_args"]}


def load_state_into(model, state_dict):
    """Load state_dict into model, converting between residual modes (README "Exact equivalences"): a
    pseudo-query the checkpoint lacks keeps the model's zero init, so a standard checkpoint becomes
    a routed model with the same function (2); rd's value query w_v, which an attnres (or delta) checkpoint
    lacks, starts as that layer's w_qk, so attnres becomes rd with the same function (3), unless the value route
    is fixed (fixed_value_route: w_v stays zero, a uniform route); pseudo-queries the
    model has no use for are dropped. Returns the lists (queries that start at zero, dropped queries).
    Any other mismatch is an error."""
    state_dict = clean_state_dict(state_dict)
    own = model.state_dict()
    fixed = getattr(model.config, "fixed_value_route", False)
    value_queries = {k: k.removesuffix("_v") for k in own if k.endswith("attn_res_query_v") and not fixed}
    state_dict = {**{k: state_dict[qk] for k, qk in value_queries.items() if k not in state_dict and qk in state_dict},
                  **state_dict}
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


def converts_exactly(source_args, target_args):
    """Whether a checkpoint of the model source_args, loaded into target_args (load_state_into), computes the
    same function (README "Exact equivalences"): a standard one in any mode (2), attnres as rd with a
    value route of its own (3), any mode as itself; res_blocks = 2L is per-sublayer routing, res_blocks = 0 (4).
    Low-rank linears compute the same only with the same activation and DLR (whose scale has no weights),
    and attention only with the same number of heads (which no weight's shape shows)."""
    def setting(args, key):
        return args.get(key, DEFAULT_ARGS[key])

    def mode(args):
        blocks = setting(args, "res_blocks")
        return setting(args, "residual"), 0 if blocks == 2 * args["n_layer"] else blocks
    linears = ("lowrank_act", "dlr") + (("dlr_alpha",) if setting(target_args, "dlr") else ())
    if setting(target_args, "lowrank_rank") and any(setting(source_args, k) != setting(target_args, k) for k in linears):
        return False
    if setting(source_args, "n_head") != setting(target_args, "n_head"):
        return False
    (source, source_blocks), (target, target_blocks) = mode(source_args), mode(target_args)
    attnres_as_rd = (source, target) == ("attnres", "rd") and not setting(target_args, "fixed_value_route")
    return source == "standard" or (source_blocks == target_blocks and (source == target or attnres_as_rd))


def load_model(path, device="cpu", **overrides):
    """(model, checkpoint) from a checkpoint file. overrides change GPTConfig fields, e.g.
    residual="delta" to convert into another mode, or dropout=0.0 for inference. The checkpoint is
    read into CPU memory and only the model moves to the device: mapped there directly, its AdamW
    state would take twice the model's GPU memory (and the GPU it was saved from, which may be busy)."""
    ckpt = load_checkpoint(path, map_location="cpu")
    model = GPT(GPTConfig.from_dict({**checkpoint_model_args(ckpt, path), **overrides}))
    load_state_into(model, ckpt["model"])
    return model.to(device), ckpt


def model_args(model):
    """The model's config as the plain dict a checkpoint stores."""
    return asdict(model.config)


# -----------------------------------------------------------------------------
# GPT-2 from Hugging Face: the same layout and names as this project's standard mode

GPT2_CONFIGS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M parameters
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
# GPT-2 stores these as Conv1D weights, [in, out]: transposed from nn.Linear's [out, in]
GPT2_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def gpt2_model_args(name):
    """The GPTConfig fields of OpenAI's GPT-2 `name` (standard residual, vocab 50257, context 1024)."""
    return dict(GPT2_CONFIGS[name], vocab_size=50257, block_size=1024, bias=True, dropout=0.0, residual="standard")


def gpt2_state_dict(path):
    """This project's state dict from a Hugging Face GPT-2 model.safetensors: names get the
    'transformer.' prefix (the hub's files lack it), Conv1D weights are transposed, the attention
    mask buffers are dropped, and the head is the token embedding (weight tying)."""
    from safetensors.torch import load_file
    try:
        tensors = load_file(str(path))
    except Exception as e:  # truncated or not a safetensors file
        raise ValueError(f"cannot read {path} ({type(e).__name__}: {e}); delete it to download it again") from None
    sd = {}
    for k, v in tensors.items():
        k = "transformer." + k.removeprefix("transformer.")
        if k.endswith((".attn.bias", ".attn.masked_bias")) or k == "transformer.lm_head.weight":
            continue
        sd[k] = (v.t() if k.endswith(GPT2_CONV1D) else v).float().contiguous()
    if "transformer.wte.weight" not in sd:
        raise ValueError(f"{path} holds no GPT-2 weights (no wte.weight); delete it to download it again")
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def download_gpt2(name, cache_dir="cache", url=None):
    """The path of OpenAI's GPT-2 `name` (gpt2, gpt2-medium, gpt2-large, gpt2-xl) model.safetensors,
    downloaded once into cache_dir from Hugging Face ($HF_ENDPOINT, if set, names a mirror) or url."""
    if name not in GPT2_CONFIGS:
        raise ValueError(f"unknown GPT-2 model {name!r}: choose one of {', '.join(GPT2_CONFIGS)}")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = url or f"{endpoint}/openai-community/{name}/resolve/main/model.safetensors"
    return download(url, Path(cache_dir) / f"{name}.safetensors", desc=f"{name} weights",
                    mirror="set HF_ENDPOINT to a mirror")


def load_gpt2(name, cache_dir="cache", url=None):
    """(model_args, state_dict) of OpenAI's GPT-2 `name`, downloaded first if it is not in cache_dir
    (download_gpt2). Under torchrun, train.py downloads on one rank per node before any rank loads."""
    return gpt2_model_args(name), gpt2_state_dict(download_gpt2(name, cache_dir, url))


# -----------------------------------------------------------------------------
# a model to run, and the tokenizer its text is written in

def load_for_inference(init_from, path=None, device="cpu", cache_dir="cache"):
    """(model in eval mode on device, its tokenizer, the checkpoint dict or None for GPT-2): the checkpoint
    at path when init_from is "resume", else OpenAI's GPT-2 `init_from` (downloaded once into cache_dir).
    The tokenizer is the one the training data's meta.json named, stored in the checkpoint. Raises
    FileNotFoundError, ValueError or download.DownloadError with a message that says what to do."""
    if init_from == "resume":
        model, ckpt = load_model(path, device, dropout=0.0)
        meta = ckpt.get("dataset_meta") or {}
        if "tokenizer" not in meta:
            raise ValueError(f"{path} does not say which tokenizer its data used (no dataset_meta['tokenizer']); "
                             "it was not written by train.py")
        tokenizer = get_tokenizer(meta["tokenizer"])
    else:
        model_args, state = load_gpt2(init_from, cache_dir)
        model = GPT(GPTConfig.from_dict(model_args))
        try:
            load_state_into(model, state)
        except ValueError as e:  # (no setting of the user's shapes GPT-2: the file in the cache is not its weights)
            raise ValueError(f"{Path(cache_dir) / f'{init_from}.safetensors'} does not hold {init_from}'s weights "
                             f"({str(e).split(';')[0]}): delete it to download it again") from None
        model.to(device)
        ckpt, tokenizer = None, get_tokenizer("gpt2")
    # (train.py never saves a run that lost its way to nan, so such weights come from elsewhere; they would sample
    # NUL bytes at temperature 0, and fail inside torch.multinomial otherwise)
    not_finite = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
    if not_finite:
        raise ValueError(f"{path if init_from == 'resume' else init_from} holds weights that are not finite "
                         f"({not_finite}, maybe more): the run that wrote it diverged, or the file was changed; use "
                         "another checkpoint")
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the {tokenizer.name} tokenizer has {tokenizer.vocab_size} tokens, "
                         f"more than the model's vocab_size={model.config.vocab_size}")
    return model.eval(), tokenizer, ckpt
