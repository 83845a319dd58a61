"""
Token shards on disk, in llm.c's format, and the tokenizers that made them.

A shard is a header of 256 little-endian int32 followed by the tokens as uint16:
    header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = number of tokens
The same files are read and written by llm.c and modded-nanogpt, so their published
FineWeb shards work here as they are. A dataset is a folder holding
<name>_train_000000.bin .. and <name>_val_000000.bin .. plus meta.json, which says
how to decode the tokens (tokenizer, vocab_size) and how many there are.

API:
    write_shard(path, tokens)          atomic, durable write of one shard
    read_shard(path) -> np.ndarray     uint16 tokens (memory-mapped), after validation
    find_shards(data_dir, split)       sorted shard paths of "train" or "val"
    fingerprint(shards) -> str         what a resumed run checks its data against
    write_meta(data_dir, meta) / load_meta(data_dir)   load_meta checks the keys the readers use
    get_tokenizer(name)                "bytes" or "gpt2": .encode .decode .vocab_size .eot
    ShardError                         a bad or missing file; the message says how to fix it
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from common import write_atomic

MAGIC = 20240520
VERSION = 1  # llm.c's version 2 holds uint32 tokens (Llama 3); we only need uint16
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
SPLITS = ("train", "val")


class ShardError(ValueError):
    """A shard or meta.json that is missing, truncated or not in the expected format."""


DATA_ROOT = Path(__file__).resolve().parent / "data"  # prepare.py's default home for data/<name>/
# the datasets prepare.py makes (its DATASETS; a test keeps the two lists equal), for the hints below
PREPARE_NAMES = ("pydocs", "shakespeare", "fineweb10B", "finewebedu10B", "text")
# what train.py and prepare.py read from meta.json, and the types they use them as
META_KEYS = {"tokenizer": str, "vocab_size": int, "train_tokens": int, "val_tokens": int}


def _command(data_dir):
    """The command that prepares data_dir: the one its meta.json records, else the one its name implies
    (data/shakespeare -> `python prepare.py shakespeare`), else None."""
    data_dir = Path(data_dir)
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
        if isinstance(meta, dict) and isinstance(meta.get("command"), str):
            return _into(meta["command"], data_dir)
    except (OSError, ValueError):
        pass
    if data_dir.name in PREPARE_NAMES and data_dir.name != "text":  # text needs --input, which only the user knows
        out = "" if data_dir.resolve() == DATA_ROOT / data_dir.name else f" --out {data_dir}"
        return f"python prepare.py {data_dir.name}{out}"
    return None


def _into(command, data_dir):
    """A recorded prepare.py command made to write data_dir: the folder may have moved since (or the command's
    --out was relative to another working folder), and the hint must remake this folder, not the old one."""
    words = command.split()
    out = words[words.index("--out") + 1] if "--out" in words[:-1] else None
    wrote = Path(out) if out else (DATA_ROOT / words[2] if len(words) > 2 else None)  # (no --out: data/<name>)
    if wrote is not None and wrote.resolve() == data_dir.resolve():
        return command
    if out:
        words[words.index("--out") + 1] = str(data_dir)
        return " ".join(words)
    return f"{command} --out {data_dir}"


def _how_to_prepare(data_dir, again=False):
    """The end of an error message: how to (re)make data_dir, without naming a command that does not exist."""
    command = _command(data_dir)
    if command:
        return f"run `{command}`" + (" again" if again else " first")
    datasets = ", ".join(name for name in PREPARE_NAMES if name != "text")
    return (f"prepare it with `python prepare.py DATASET --out {data_dir}` (DATASET: {datasets}, "
            f"or `text --input FILE ...` for your own .txt files)")


def _remedy(path):
    # for a bad file inside a dataset folder: the folder's meta.json remembers the command that made it
    return f"delete it and {_how_to_prepare(Path(path).parent, again=True)}"


def write_shard(path, tokens):
    """Write tokens (any integer sequence, every value < 65536) as one shard, atomically."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise ValueError(f"{path}: tokens must be a 1-D sequence of integers, got {tokens.dtype} {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError(f"{path}: token ids must lie in [0, 65535] to fit uint16, got [{tokens.min()}, {tokens.max()}]")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)

    def write(f):
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    write_atomic(path, write)


def read_shard(path):
    """Validate one shard's header and length and return its tokens as a read-only uint16 memmap."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ShardError(f"{path} does not exist: {_how_to_prepare(path.parent, again=True)}") from None
    if size < HEADER_BYTES:
        raise ShardError(f"{path} is truncated ({size} bytes, shorter than the {HEADER_BYTES}-byte header): {_remedy(path)}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ShardError(f"{path} is not a token shard (magic {header[0]}, expected {MAGIC}): {_remedy(path)}")
    if header[1] != VERSION:
        raise ShardError(f"{path} has shard version {header[1]}, this project reads version {VERSION} (uint16 tokens): {_remedy(path)}")
    ntok = int(header[2])
    expected = HEADER_BYTES + 2 * ntok
    if size != expected:
        problem = "truncated" if size < expected else "longer than its header says"
        raise ShardError(f"{path} is {problem} (header says {ntok:,} tokens = {expected:,} bytes, file has {size:,}): {_remedy(path)}")
    if ntok == 0:  # np.memmap cannot map zero bytes
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(ntok,))


def find_shards(data_dir, split):
    """Sorted paths of the split's shards (*_train_*.bin or *_val_*.bin) in data_dir."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    data_dir = Path(data_dir)
    paths = sorted(data_dir.glob(f"*_{split}_*.bin"))
    if not paths:
        raise ShardError(f"no {split} shards (*_{split}_*.bin) in {data_dir}: {_how_to_prepare(data_dir)}")
    return paths


FINGERPRINT_TOKENS = 4096  # read at each end of a shard: a few kB however large the data


def fingerprint(shards):
    """sha256 of each shard's length and its first and last FINGERPRINT_TOKENS tokens, in order.

    A resumed run checks its data against the fingerprint it was trained on: token counts alone take
    another set of equal-sized shards (a different download, other documents prepared to the same size),
    and its batches would silently differ. A token changed deep inside a shard is not seen: that is damage to
    the same data rather than other data, and finding it would mean reading every token, seconds at every
    start for a large dataset."""
    digest = hashlib.sha256()
    for tokens in shards:
        digest.update(len(tokens).to_bytes(8, "little"))
        digest.update(np.ascontiguousarray(tokens[:FINGERPRINT_TOKENS]).tobytes())
        digest.update(np.ascontiguousarray(tokens[-FINGERPRINT_TOKENS:]).tobytes())
    return digest.hexdigest()


def write_meta(data_dir, meta):
    """Write data_dir/meta.json atomically (prepare.py writes it last, once the shards are in place)."""
    text = json.dumps(meta, indent=2) + "\n"
    write_atomic(Path(data_dir) / "meta.json", lambda f: f.write(text.encode()))


def load_meta(data_dir):
    """Read data_dir/meta.json: tokenizer, vocab_size, train_tokens, val_tokens (checked), source, ..."""
    path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{path} does not exist: {_how_to_prepare(path.parent)}") from None
    except ValueError as e:
        raise ShardError(f"{path} is not valid JSON ({e}): {_remedy(path)}") from None
    if not isinstance(meta, dict):
        raise ShardError(f"{path} is not a JSON object ({{...}}): {_remedy(path)}")
    # readers index these directly: a missing or mistyped one would be a traceback far from this file
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise ShardError(f"{path} lacks {', '.join(missing)}: {_remedy(path)}")
    wrong = [f"{key} should be {kind.__name__}, got {type(meta[key]).__name__}" for key, kind in META_KEYS.items()
             if not isinstance(meta[key], kind) or isinstance(meta[key], bool)]  # JSON true is no vocab_size
    if wrong:
        raise ShardError(f"{path}: {', '.join(wrong)}: {_remedy(path)}")
    # checked here, where the fix is known: else training runs to its end before sample.py refuses the
    # tokenizer, and a vocab_size of 0 reaches the model as a GPTConfig error about a value no one set
    if meta["tokenizer"] not in TOKENIZERS:
        raise ShardError(f"{path} names the tokenizer {meta['tokenizer']!r}, which this project does not have "
                         f"({', '.join(TOKENIZERS)}): {_remedy(path)}")
    if meta["vocab_size"] < 1:
        raise ShardError(f"{path} says vocab_size={meta['vocab_size']}, a vocabulary needs at least one token: {_remedy(path)}")
    return meta


# -----------------------------------------------------------------------------
# tokenizers: the name in meta.json is all sample.py needs to decode a dataset's tokens

@dataclass(frozen=True)
class Tokenizer:
    name: str
    vocab_size: int
    eot: Optional[int]  # the end-of-text token that separates documents, None if the vocabulary has none
    encode: Callable[[str], list]
    decode: Callable[[list], str]


def _bytes_tokenizer():
    # UTF-8 bytes: every text encodes, and decoding a cut-off character shows U+FFFD instead of failing
    return Tokenizer("bytes", 256, None,
                     encode=lambda text: list(text.encode("utf-8")),
                     decode=lambda ids: bytes(ids).decode("utf-8", errors="replace"))


def _gpt2_tokenizer():
    try:
        import tiktoken
    except ImportError:
        raise ValueError("the gpt2 tokenizer needs tiktoken: pip install tiktoken") from None
    try:
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken downloads its BPE files on first use; offline that fails in many ways
        raise ValueError(f"cannot load the gpt2 tokenizer ({type(e).__name__}): tiktoken downloads it once, "
                         "so go online or set TIKTOKEN_CACHE_DIR to a folder that holds its cache") from None
    # encode_ordinary: text that happens to contain "<|endoftext|>" stays text, like nanoGPT
    return Tokenizer("gpt2", enc.n_vocab, enc.eot_token, encode=enc.encode_ordinary, decode=enc.decode)


TOKENIZERS = {"bytes": _bytes_tokenizer, "gpt2": _gpt2_tokenizer}


def get_tokenizer(name):
    """The tokenizer called name ("bytes": vocab 256, no eot; "gpt2": tiktoken, vocab 50257, eot 50256)."""
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}: choose one of {', '.join(TOKENIZERS)}")
    return TOKENIZERS[name]()
