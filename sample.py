"""
Sample from a model: a checkpoint of any residual mode (dense, low-rank, DLR or folded) or GPT-2.
Tokens are printed as they are generated; each new token costs one one-token forward with the
key-value cache, not a pass over the whole context.

    python sample.py --out_dir=out --start="Once upon a time" --num_samples=3
    python sample.py --ckpt=out-dlr/folded.pt --start=FILE:prompt.txt --temperature=0
    python sample.py --init_from=gpt2 --start="The meaning of life is"
    python sample.py --out_dir=out --routing --num_samples=0     # only where each sublayer routes
    python sample.py --device=cuda --compile                     # a compiled one-token step (CUDA graphs)

The tokenizer is the one the training data's meta.json names (stored in the checkpoint):
"bytes" or "gpt2". With --routing, one forward over the prompt first prints, for each route,
its depth weights averaged over the prompt's positions: the number of sources m, the source
with the largest weight and that weight, the entropy divided by log m (1 = uniform), and for rd
the Jensen-Shannon divergence between each layer's QK and V routes.
"""

import argparse
import os
import sys
from pathlib import Path

import torch

from checkpoint import GPT2_CONFIGS, load_for_inference
from common import DTYPES, MAX_SEED, autocast, boolean, die, resolve_device_and_dtype, sampling_problem
from download import DownloadError


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="where train.py wrote ckpt.pt")
    p.add_argument("--ckpt", default=None, help="a checkpoint file (default: OUT_DIR/ckpt.pt), e.g. out-dlr/folded.pt")
    p.add_argument("--init_from", default="resume", choices=("resume", *GPT2_CONFIGS),
                   help="resume: the checkpoint; gpt2*: OpenAI's GPT-2 weights")
    p.add_argument("--cache_dir", default="cache", help="where downloaded GPT-2 weights are kept (as in train.py)")
    p.add_argument("--start", default="\n", help='the prompt, or FILE:path to read it from a file')
    p.add_argument("--num_samples", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=200, help="sample from the k most likely tokens; 0 = all")
    p.add_argument("--top_p", type=float, default=1.0,
                   help="then from the fewest most likely tokens whose probabilities add up to p; 1 = all")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto (cuda, mps, then cpu) | cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                   help="autocast dtype (weights stay float32); auto as in train.py")
    p.add_argument("--cache", type=boolean, nargs="?", const=True, default=True,
                   help="use the key-value cache (--cache=False: a full forward per token, for comparison)")
    p.add_argument("--compile", type=boolean, nargs="?", const=True, default=False,
                   help="torch.compile the one-token step (one graph for every position; a CUDA graph on a GPU). "
                        "For a GPU: on a CPU it is no faster than eager, and slower in standard mode (docs/speed.md)")
    p.add_argument("--routing", type=boolean, nargs="?", const=True, default=False,
                   help="print the routing table of the prompt before sampling")
    args = p.parse_args(argv)
    problem = sampling_problem(args.temperature, args.top_k, args.top_p)
    if problem:
        p.error(f"--{problem}")
    if not (args.num_samples >= 0 and args.max_new_tokens >= 0):
        p.error("--num_samples and --max_new_tokens must be 0 or more")
    if not 0 <= args.seed <= MAX_SEED:
        p.error(f"--seed must be from 0 to {MAX_SEED}")
    if args.compile and not args.cache:
        p.error("--compile compiles the one-token step over the key-value cache: drop --cache=False")
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        p.error(str(e))
    return args


def read_prompt(start, tokenizer, block_size):
    """Token ids of --start (or of FILE:path), cropped to the last block_size tokens with a note."""
    if start.startswith("FILE:"):
        path = Path(start[len("FILE:"):])
        try:
            start = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"cannot read the prompt file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"the prompt file {path} is not UTF-8 text: save it as UTF-8") from None
    try:  # bytes that are not UTF-8 reach Python's argv as lone surrogates, which no tokenizer should read
        start.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("--start is not UTF-8 text (a terminal in another encoding?): set a UTF-8 locale, or save "
                         "the prompt as UTF-8 and pass --start=FILE:path") from None
    ids = tokenizer.encode(start)
    if not ids:
        if tokenizer.eot is None:
            raise ValueError("the prompt is empty; give some text with --start")
        ids = [tokenizer.eot]  # an empty prompt starts a new document
    if len(ids) > block_size:
        print(f"note: the prompt has {len(ids)} tokens, more than block_size={block_size}; "
              f"using its last {block_size}", file=sys.stderr)
        ids = ids[-block_size:]
    return ids


class StreamDecoder:
    """Turns token ids into text as they arrive. A token can end inside a multi-byte UTF-8 character
    (a lone byte of the bytes tokenizer, or a GPT-2 token holding half an emoji); the decoded text
    then ends in U+FFFD, so it is held back until the character is complete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pending = []  # ids since the last character boundary

    def push(self, token):
        self.pending.append(token)
        text = self.tokenizer.decode(self.pending)
        if text.endswith("\ufffd"):
            return ""
        self.pending = []
        return text

    def flush(self):
        text = self.tokenizer.decode(self.pending)  # whatever is left; an incomplete character shows as U+FFFD
        self.pending = []
        return text


def routing_table(model, stats, n_tokens):
    """One line per route: sources m, the top source, max weight, normalised entropy, rd's JS(QK, V),
    and the weights of the sources in depth order drawn with a 10-level ASCII ramp scaled to the row's max."""
    per_block = model.config.sublayers_per_block
    source = "sublayer i-1's output" if per_block == 1 else "routing block i (the last one may be in progress)"
    ramp = "_.:-=+*#%@"
    lines = [f"routing over the prompt ({n_tokens} tokens): depth weights averaged over positions; "
             f"source 0 = embedding, source i = {source}",
             f"{'route':<10} {'m':>3} {'top':>4} {'max':>5} {'entropy':>7} {'js(qk,v)':>8}  weights"]
    for name, s in stats.items():
        w = s["weights"]
        top = max(range(len(w)), key=w.__getitem__)
        bar = "".join(ramp[min(9, round(9 * x / max(w)))] for x in w)
        fmt = lambda key, width: f"{s[key]:>{width}.2f}" if key in s else f"{'-':>{width}}"
        lines.append(f"{name:<10} {s['sources']:>3} {top:>4} {max(w):>5.2f} {fmt('entropy', 7)} {fmt('js_qk_v', 8)}  |{bar}|")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        path = Path(args.ckpt) if args.ckpt else Path(args.out_dir) / "ckpt.pt"
        model, tokenizer, _ = load_for_inference(args.init_from, path, args.device, args.cache_dir)
        ids = read_prompt(args.start, tokenizer, model.config.block_size)
    except (FileNotFoundError, ValueError, DownloadError) as e:  # a missing checkpoint, an unknown tokenizer, ...
        die(e)
    ctx = autocast(args.device, args.dtype)  # on the device's own kind: cuda, mps or cpu
    x = torch.tensor(ids, dtype=torch.long, device=args.device)[None]

    if args.routing:
        if model.config.residual == "standard":
            print("routing: none, this is a standard (residual stream) model")
        else:
            with torch.no_grad(), ctx:
                model(x, collect_routing=True)
            print(routing_table(model, model.last_routing, len(ids)))
        print("---------------")

    top_k = args.top_k if args.top_k > 0 else None
    decode_step = model.compile_decoding() if args.compile else None  # compiles at its first token
    for _ in range(args.num_samples):
        print(tokenizer.decode(ids), end="", flush=True)
        decoder = StreamDecoder(tokenizer)
        with ctx:
            for token in model.generate_tokens(x, args.max_new_tokens, args.temperature, top_k, args.top_p,
                                               args.cache, tokenizer.vocab_size, decode_step):
                print(decoder.push(token.item()), end="", flush=True)
        print(decoder.flush())
        print("---------------")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the reader stopped early (sample.py | head): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit would raise it again
        sys.exit(141)  # 128 + SIGPIPE: the status a shell gives a tool that a closed pipe stopped
