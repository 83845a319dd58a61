"""
Prepare a dataset as token shards in data/<name>/ (llm.c's format, see shards.py).

    python prepare.py                                  # pydocs: offline, byte-level
    python prepare.py shakespeare                      # tiny Shakespeare, downloaded, bytes
    python prepare.py shakespeare --tokenizer gpt2 --out data/shakespeare_gpt2   # the same in GPT-2 tokens
    python prepare.py fineweb10B --shards 8            # published GPT-2 FineWeb shards
    python prepare.py text --input notes/ book.txt     # your own .txt files

A rerun reuses what is already complete and valid. train.py calls prepare("pydocs")
when no data is there yet, so a fresh offline machine can train out of the box.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from common import die, durable_replace
from download import DownloadError, download, sha256_of
from shards import (DATA_ROOT, ShardError, find_shards, get_tokenizer, load_meta, read_shard,
                    write_meta, write_shard)

URL_ENV = "NANOATTNRES_DATA_URL"
SHARD_TOKENS = 100_000_000  # tokens per shard for large text inputs, as in llm.c's FineWeb shards
DEFAULT_VAL_FRACTION = 0.1

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare"
# GPT-2 tokens of FineWeb / FineWeb-Edu (10B-token samples), published in llm.c's format;
# the val shard is _000000, train shards start at _000001, 100M tokens each
FINEWEB = {
    "fineweb10B": dict(repo="kjj0/fineweb10B-gpt2", prefix="fineweb", train_shards=103),
    "finewebedu10B": dict(repo="kjj0/finewebedu10B-gpt2", prefix="finewebedu", train_shards=99),
}

_quiet = False


def log(message):
    if not _quiet:
        print(message, flush=True)


# -----------------------------------------------------------------------------
# text -> tokens

def split_tail(docs, val_fraction):
    """
    Split documents into (train_docs, val_docs): val is the last val_fraction of the
    characters, starting at a line boundary. A contiguous tail, so no val text sits
    inside the training stream.
    """
    total = sum(len(d) for d in docs)
    cut = round(total * (1 - val_fraction))
    train, val, start = [], [], 0
    for doc in docs:
        end = start + len(doc)
        if end <= cut:
            train.append(doc)
        elif start >= cut:
            val.append(doc)
        else:  # the cut falls inside this document: move it back to the start of its line
            i = cut - start
            i = doc.rfind("\n", 0, i) + 1 or i
            train.append(doc[:i])
            val.append(doc[i:])
        start = end
    train, val = [d for d in train if d], [d for d in val if d]
    if not train or not val:
        raise ValueError(f"the input ({total:,} characters) is too small to split into train and val: give it more text")
    return train, val


def encode(tok, text):
    """Tokens of text as a uint16 array."""
    if tok.name == "bytes":  # skip the Python list of ints: ~36 bytes a token on large inputs
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    return np.array(tok.encode(text), dtype=np.uint16)


def tokenize(docs, tok, what):
    """Encode documents into one uint16 array. With an eot token every document starts with it,
    like llm.c's FineWeb shards; byte-level documents are separated by a blank line."""
    parts, count, last = [], 0, time.time()
    for i, doc in enumerate(docs):
        if tok.eot is not None:
            parts.append(np.array([tok.eot], dtype=np.uint16))
            parts.append(encode(tok, doc))
        else:
            parts.append(encode(tok, doc if i == len(docs) - 1 else doc + "\n\n"))
        count += len(parts[-1])
        if time.time() - last > 5:  # progress for inputs that take a while
            last = time.time()
            log(f"  {what}: tokenized {i + 1:,}/{len(docs):,} documents, {count:,} tokens")
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def refuse_other_datasets(data_dir, name):
    """Readers take every *_train_*.bin and *_val_*.bin in a folder: never mix two datasets in one. Checked
    before anything in the folder changes, so that a refused prepare leaves the dataset there as it was."""
    others = [p for split in ("train", "val") for p in sorted(data_dir.glob(f"*_{split}_*.bin"))
              if not p.name.startswith(f"{name}_{split}_")]
    if others:
        raise ValueError(f"{data_dir} also holds {others[0].name}, from another dataset: prepare into an empty --out folder")


def write_dataset(data_dir, name, train, val, meta):
    """Write train/val token arrays as shards, then meta.json last: meta.json marks the folder complete."""
    refuse_other_datasets(data_dir, name)
    (data_dir / "meta.json").unlink(missing_ok=True)
    for split, tokens in (("train", train), ("val", val)):
        for path in data_dir.glob(f"{name}_{split}_*.bin"):  # an earlier run's, maybe more of them
            path.unlink()
        for i, start in enumerate(range(0, len(tokens), SHARD_TOKENS)):
            write_shard(data_dir / f"{name}_{split}_{i:06d}.bin", tokens[start:start + SHARD_TOKENS])
    finish(data_dir, meta)


def finish(data_dir, meta):
    """Count the tokens of every shard in data_dir, validating them, and write meta.json."""
    for split in ("train", "val"):
        paths = find_shards(data_dir, split)
        meta[f"{split}_tokens"] = sum(len(read_shard(p)) for p in paths)
        meta[f"{split}_files"] = [p.name for p in paths]
    write_meta(data_dir, meta)
    log(f"train has {meta['train_tokens']:,} tokens in {len(meta['train_files'])} shard(s)")
    log(f"val has {meta['val_tokens']:,} tokens in {len(meta['val_files'])} shard(s)")
    log(f"wrote {data_dir}")


def is_complete(data_dir):
    """True if data_dir holds a dataset train.py trains on, whoever made it: a meta.json, and valid shards that
    hold the tokens it counts."""
    try:
        meta = load_meta(data_dir)
        return all(sum(len(read_shard(p)) for p in find_shards(data_dir, split)) == meta[f"{split}_tokens"]
                   for split in ("train", "val"))
    except ShardError:
        return False


def is_prepared(data_dir, recipe):
    """True if data_dir holds a complete, valid dataset made by the same recipe."""
    try:
        meta = load_meta(data_dir)
        if meta.get("recipe") != recipe:
            return False
        if any([p.name for p in find_shards(data_dir, split)] != meta.get(f"{split}_files") for split in ("train", "val")):
            return False
    except ShardError:
        return False
    return is_complete(data_dir)


def dataset_meta(tok, source, recipe, command):
    return dict(tokenizer=tok.name, vocab_size=tok.vocab_size, eot=tok.eot, source=source,
                recipe=recipe, command=command)


# -----------------------------------------------------------------------------
# datasets

def prepare_pydocs(data_dir, tokenizer, val_fraction, recipe, command, **_):
    tok = get_tokenizer(tokenizer)
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ValueError("this Python install lacks pydoc_data (the docs that `help()` shows): "
                         "install a full Python, or use `python prepare.py shakespeare`") from None
    docs = [topics[key] for key in sorted(topics)]
    train_docs, val_docs = split_tail(docs, val_fraction)
    source = f"pydoc_data.topics of Python {sys.version.split()[0]} ({len(docs)} topics)"
    write_dataset(data_dir, "pydocs", tokenize(train_docs, tok, "train"), tokenize(val_docs, tok, "val"),
                  dataset_meta(tok, source, recipe, command))


def prepare_shakespeare(data_dir, tokenizer, val_fraction, recipe, command, url, mirror, **_):
    tok = get_tokenizer(tokenizer)
    base = url or SHAKESPEARE_URL
    file_url = base if base.endswith("/input.txt") else base.rstrip("/") + "/input.txt"
    # the raw text stays next to the shards, so switching tokenizer does not download it again
    text_path = download(file_url, data_dir / "input.txt", desc="tiny shakespeare", quiet=_quiet, mirror=mirror)
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{text_path} is not UTF-8 text: delete it and check --url") from None
    if not text:
        raise ValueError(f"{text_path} is empty: delete it and check --url")
    # nanoGPT's split: the first 90% of the characters train, the rest val
    log(f"length of dataset in characters: {len(text):,}")
    cut = int(len(text) * (1 - val_fraction))
    write_dataset(data_dir, "shakespeare", encode(tok, text[:cut]), encode(tok, text[cut:]),
                  dataset_meta(tok, file_url, recipe, command))


def prepare_fineweb(data_dir, name, shards, recipe, command, url, mirror, **_):
    spec = FINEWEB[name]
    base = (url or f"https://huggingface.co/datasets/{spec['repo']}/resolve/main").rstrip("/")
    files = [f"{spec['prefix']}_val_000000.bin"] + [f"{spec['prefix']}_train_{i:06d}.bin" for i in range(1, shards + 1)]
    refuse_other_datasets(data_dir, spec["prefix"])
    # Shards new to the folder arrive in data_dir/.incoming/ and join the dataset together, once all of
    # them are here: if a download fails, the dataset that was here (say, --shards 2 on the way to
    # --shards 3) is still there to train on, with its meta.json, and a rerun takes the shards that arrived.
    incoming = data_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    try:
        for i, file in enumerate(files):
            path = data_dir / file if (data_dir / file).exists() else incoming / file
            if path.exists():
                try:
                    read_shard(path)
                except ShardError as e:
                    log(f"{e}; downloading it again")
                    path.unlink()
            # a shard already here is checked against the sha256 it was downloaded with, fetched again if it differs
            download(f"{base}/{file}", path, desc=f"{file} ({i + 1}/{len(files)})", quiet=_quiet, mirror=mirror)
            try:
                read_shard(path)
            except ShardError:
                size = path.stat().st_size
                path.unlink()  # never leave a bad file under a name that looks complete
                raise ShardError(f"downloaded {file} from {base} is not a valid shard ({size:,} bytes, bad header or length); "
                                 f"run again, or {mirror}") from None
        for file in files:
            for arrived in (file + ".sha256", file):  # its record first: a shard in the dataset never lacks its own
                if (incoming / arrived).exists():
                    durable_replace(incoming / arrived, data_dir / arrived)
    finally:  # what waits there (shards, a partial download) stays for the rerun; an empty folder goes
        if not any(incoming.iterdir()):
            incoming.rmdir()
    extra = len(find_shards(data_dir, "train")) - shards
    if extra > 0:
        log(f"note: keeping {extra} more train shard(s) from an earlier run; to train on fewer, delete them and run "
            "this command again")
    # the published GPT-2 tokens, as tiktoken's gpt2 encoding numbers them
    finish(data_dir, dict(tokenizer="gpt2", vocab_size=50257, eot=50256, source=base, recipe=recipe, command=command))


def prepare_text(data_dir, tokenizer, val_fraction, inputs, recipe, command, **_):
    tok = get_tokenizer(tokenizer)
    paths = text_files(inputs)
    docs = []
    for path in paths:
        try:
            docs.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): convert it or leave it out") from None
    docs = [d for d in docs if d]
    if not docs:
        raise ValueError(f"the input files hold no text ({len(paths)} file(s), all empty): pass --input with some text")
    train_docs, val_docs = split_tail(docs, val_fraction)
    source = f"{len(paths)} text file(s): " + ", ".join(str(p) for p in inputs)
    write_dataset(data_dir, "text", tokenize(train_docs, tok, "train"), tokenize(val_docs, tok, "val"),
                  dataset_meta(tok, source, recipe, command))


def text_files(inputs):
    """The --input paths with folders expanded to their .txt files, in a deterministic order, each file once
    (a file named beside its folder would be read twice, and could land in both train and val)."""
    if not inputs:
        raise ValueError("the text dataset needs --input: one or more .txt files or folders of them")
    paths = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(item.rglob("*.txt"))
            if not found:
                raise ValueError(f"no .txt files in the folder {item}: pass .txt files or a folder that holds them")
            paths += found
        elif item.is_file():
            paths.append(item)
        else:
            raise ValueError(f"--input {item} does not exist")
    unique = {}
    for path in paths:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


DATASETS = {
    "pydocs": prepare_pydocs,
    "shakespeare": prepare_shakespeare,
    "fineweb10B": prepare_fineweb,
    "finewebedu10B": prepare_fineweb,
    "text": prepare_text,
}


# -----------------------------------------------------------------------------

def refuse_another_recipe(data_dir, recipe):
    """A complete dataset in data_dir made another way (other tokens, another split) is another dataset, which
    runs and checkpoints may depend on: never replaced silently. (More FineWeb shards, or changed --input
    files, make the same dataset anew.)"""
    if not is_complete(data_dir):  # no meta.json, an unusable one, or shards it does not count: nothing to keep
        return
    held = load_meta(data_dir).get("recipe")
    # a folder of its own: named for the dataset where that differs (data/pydocs), else for the tokenizer (data/shakespeare_gpt2)
    own = data_dir.parent / recipe["dataset"]
    if own == data_dir or (held or {}).get("dataset") == recipe["dataset"]:
        own = Path(f"{data_dir}_{recipe.get('tokenizer') or 'new'}")
    elsewhere = f"prepare into a folder of its own (--out {own}), or delete {data_dir} first"
    if held is None:
        raise ValueError(f"{data_dir} holds a complete dataset that prepare.py did not make (its meta.json names no "
                         f"recipe): {elsewhere}")
    differ = [k for k in ("dataset", "tokenizer", "val_fraction") if held.get(k) != recipe.get(k)]
    if differ:
        what = ", ".join(f"{k} {held.get(k)}" for k in differ)
        raise ValueError(f"{data_dir} holds a complete dataset with {what}, not {', '.join(str(recipe.get(k)) for k in differ)}: "
                         f"{elsewhere}")


def prepare(name="pydocs", out=None, tokenizer=None, shards=None, inputs=None, url=None,
            val_fraction=None, quiet=False):
    """
    Prepare dataset `name` (one of DATASETS) and return its folder (default data/<name>).
    tokenizer: "bytes" or "gpt2" (default bytes; FineWeb is always gpt2).
    shards: FineWeb train shards to download (default 1). inputs: files/folders for "text".
    url: download location (a folder URL), default $NANOATTNRES_DATA_URL, else the dataset's home.
    val_fraction: the tail that becomes val (default 0.1). quiet: print nothing.
    Expected failures raise ValueError (ShardError is one) or DownloadError, with a one-line message.
    """
    global _quiet
    _quiet = quiet
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    # where a bad mirror came from, for the download errors
    mirror = "pass --url for a mirror" if url or not os.environ.get(URL_ENV) else \
        f"check ${URL_ENV} ({os.environ[URL_ENV]}), or unset it to download from the dataset's home"
    url = url or os.environ.get(URL_ENV) or None
    command = f"python prepare.py {name}"
    if name in FINEWEB:
        if tokenizer not in (None, "gpt2"):
            raise ValueError(f"{name} is published GPT-2 tokenised: drop --tokenizer {tokenizer}")
        if val_fraction is not None:
            raise ValueError(f"{name} comes with its own val shard: drop --val_fraction")
        shards = 1 if shards is None else shards
        limit = FINEWEB[name]["train_shards"]
        if not 1 <= shards <= limit:
            raise ValueError(f"--shards must be between 1 and {limit} for {name}, got {shards}")
        tokenizer = "gpt2"
        recipe = dict(dataset=name, shards=shards)
        command += f" --shards {shards}"
    else:
        if shards is not None:
            raise ValueError(f"--shards is for the FineWeb datasets, not {name}")
        tokenizer = tokenizer or "bytes"
        val_fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
        if not 0 < val_fraction < 1:
            raise ValueError(f"--val_fraction must lie strictly between 0 and 1, got {val_fraction}")
        recipe = dict(dataset=name, tokenizer=tokenizer, val_fraction=val_fraction)
        if tokenizer != "bytes":
            command += f" --tokenizer {tokenizer}"
        if val_fraction != DEFAULT_VAL_FRACTION:
            command += f" --val_fraction {val_fraction}"
    if name == "text":
        # the same files with the same bytes are the same input (an edit that keeps the size is another input)
        recipe["inputs"] = [[str(p.resolve()), sha256_of(p)] for p in text_files(inputs)]
        command += " --input " + " ".join(map(str, inputs))
    elif inputs:
        raise ValueError(f"--input is for the text dataset, not {name}")
    data_dir = Path(out) if out else DATA_ROOT / name
    if out:
        command += f" --out {out}"
    if url and name in ("shakespeare", *FINEWEB):
        command += f" --url {url}"

    if is_prepared(data_dir, recipe):
        log(f"{data_dir} is already prepared ({name}, {tokenizer}); delete it to prepare it again")
        return data_dir
    refuse_another_recipe(data_dir, recipe)
    data_dir.mkdir(parents=True, exist_ok=True)
    log(f"preparing {name} ({tokenizer} tokens) in {data_dir}")
    DATASETS[name](data_dir=data_dir, tokenizer=tokenizer, name=name, shards=shards, inputs=inputs, url=url,
                   mirror=mirror, val_fraction=val_fraction, recipe=recipe, command=command)
    return data_dir


def main():
    parser = argparse.ArgumentParser(
        description="Prepare a dataset as token shards (llm.c's .bin format) plus meta.json.",
        epilog=f"Downloads come from each dataset's home unless --url or ${URL_ENV} names a mirror "
               "(the folder URL that holds the dataset's files). A rerun reuses complete, valid output.")
    parser.add_argument("name", nargs="?", default="pydocs", choices=list(DATASETS),
                        help="pydocs (default, offline: the docs inside Python), shakespeare, "
                             "fineweb10B / finewebedu10B (GPT-2 tokens, 100M per shard), text (your --input files)")
    parser.add_argument("--tokenizer", choices=["bytes", "gpt2"], help="bytes (vocab 256, default) or gpt2 (tiktoken)")
    parser.add_argument("--shards", type=int, help="FineWeb: number of train shards to download (default 1)")
    parser.add_argument("--input", nargs="+", dest="inputs", metavar="PATH", help="text: .txt files or folders of them")
    parser.add_argument("--url", help=f"download from this folder URL instead (default: ${URL_ENV}, else the dataset's home)")
    parser.add_argument("--out", help="output folder (default: data/<name> next to this script)")
    parser.add_argument("--val_fraction", type=float, help=f"the tail that becomes val (default {DEFAULT_VAL_FRACTION})")
    args = parser.parse_args()
    try:
        prepare(args.name, out=args.out, tokenizer=args.tokenizer, shards=args.shards, inputs=args.inputs,
                url=args.url, val_fraction=args.val_fraction)
    except (ValueError, DownloadError) as e:  # ShardError is a ValueError
        die(e)
    except OSError as e:  # a full disk, a folder that cannot be written, an input that cannot be read
        out = args.out or DATA_ROOT / args.name
        die(f"could not prepare {args.name} in {out} ({e.strerror or e}" + (f": {e.filename}" if e.filename else "")
            + "): fix that, then run the same command again")
    except KeyboardInterrupt:
        print("\ninterrupted: nothing half-written was left under a final name; run again to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
