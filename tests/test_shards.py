"""The shard format (llm.c's .bin) and the tokenizers: what shards.py promises its readers."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the scripts and helpers live at the repo root

import common
import shards
from shards import ShardError, find_shards, fingerprint, get_tokenizer, load_meta, read_shard, write_meta, write_shard



def test_round_trip_keeps_tokens_and_header(tmp_path):
    tokens = np.array([0, 1, 255, 256, 50256, 65535], dtype=np.int64)
    path = tmp_path / "x_train_000000.bin"
    write_shard(path, tokens)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert (header[0], header[1], header[2]) == (20240520, 1, len(tokens))
    assert not header[3:].any()
    assert path.stat().st_size == 256 * 4 + 2 * len(tokens)
    got = read_shard(path)
    assert got.dtype == np.uint16
    assert got.tolist() == tokens.tolist()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_empty_shard_round_trips(tmp_path):
    write_shard(tmp_path / "e.bin", [])
    assert len(read_shard(tmp_path / "e.bin")) == 0


def test_tokens_that_do_not_fit_uint16_are_refused(tmp_path):
    with pytest.raises(ValueError, match="65535"):
        write_shard(tmp_path / "big.bin", [1, 65536])
    with pytest.raises(ValueError, match="65535"):
        write_shard(tmp_path / "neg.bin", [-1])
    # in range, but no token sequence: a 2-D batch's header would count its rows, floats would be cut to ids
    with pytest.raises(ValueError, match=re.escape("tokens must be a 1-D sequence of integers, got int64 (2, 2)")):
        write_shard(tmp_path / "2d.bin", np.array([[1, 2], [3, 4]], dtype=np.int64))
    with pytest.raises(ValueError, match=re.escape("tokens must be a 1-D sequence of integers, got float64 (2,)")):
        write_shard(tmp_path / "float.bin", [1.0, 2.5])
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(common.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_shard(tmp_path / "x_train_000000.bin", np.arange(1000))
    assert list(tmp_path.iterdir()) == []


def _shard(tmp_path, n=100):
    path = tmp_path / "toy" / "toy_val_000000.bin"
    write_shard(path, np.arange(n))
    return path


def test_corrupt_magic_is_rejected_naming_the_file(tmp_path):
    path = _shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[0:4] = np.array([12345], dtype="<i4").tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError) as e:
        read_shard(path)
    message = str(e.value)
    assert str(path) in message and "magic 12345" in message and "\n" not in message
    # "toy" is no dataset of prepare.py's: the hint names the real ones, not `python prepare.py toy`
    assert f"python prepare.py DATASET --out {path.parent}" in message and "python prepare.py toy" not in message


def test_wrong_version_is_rejected(tmp_path):
    path = _shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[4:8] = np.array([2], dtype="<i4").tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="version 2"):
        read_shard(path)


@pytest.mark.parametrize("size, problem", [(10, "truncated"), (1024 + 2 * 100 - 1, "truncated"),
                                           (1024 + 2 * 100 + 2, "longer than its header says")])
def test_shard_of_the_wrong_size_is_rejected_naming_the_file(tmp_path, size, problem):
    path = _shard(tmp_path)  # 100 tokens: 1024 + 200 bytes
    path.write_bytes(path.read_bytes().ljust(size, b"\0")[:size])  # cut, or one token too many appended
    with pytest.raises(ShardError, match=problem) as e:
        read_shard(path)
    assert str(path) in str(e.value)


def test_remedy_repeats_the_command_in_meta(tmp_path):
    path = _shard(tmp_path)
    write_meta(path.parent, {"command": "python prepare.py shakespeare --tokenizer gpt2"})
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ShardError, match="python prepare.py shakespeare --tokenizer gpt2"):
        read_shard(path)


def test_find_shards_sorted_by_split_and_clear_when_missing(tmp_path, monkeypatch):
    for name in ["d_train_000002.bin", "d_train_000000.bin", "d_val_000000.bin", "d_train_000001.bin"]:
        write_shard(tmp_path / name, [1])
    assert [p.name for p in find_shards(tmp_path, "train")] == ["d_train_000000.bin", "d_train_000001.bin", "d_train_000002.bin"]
    # glob yields the folder's order, which is the file system's (often creation order, or hashed): sorted anyway
    glob = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(sorted(glob(self, pattern), reverse=True)))
    assert [p.name for p in find_shards(tmp_path, "train")] == ["d_train_000000.bin", "d_train_000001.bin", "d_train_000002.bin"]
    assert [p.name for p in find_shards(tmp_path, "val")] == ["d_val_000000.bin"]
    with pytest.raises(ShardError, match=r"no train shards .* in .*empty: prepare it with `python prepare.py DATASET"):
        find_shards(tmp_path / "empty", "train")
    with pytest.raises(ValueError, match="split"):
        find_shards(tmp_path, "test")


def test_hints_name_a_command_that_exists(tmp_path, monkeypatch):
    """Where meta.json records the command, every hint repeats it; where it does not, a folder named
    after one of prepare.py's datasets gets that dataset's command, any other folder (llm.c's shards
    copied to llmc2/, say) the datasets to choose from: never `python prepare.py llmc2`."""
    custom = tmp_path / "llmc2"
    custom.mkdir()
    for error in (lambda: find_shards(custom, "train"), lambda: read_shard(custom / "llmc2_val_000000.bin"),
                  lambda: load_meta(custom)):
        with pytest.raises(ShardError) as e:
            error()
        message = str(e.value)
        assert "prepare.py llmc2" not in message and "\n" not in message
        assert f"`python prepare.py DATASET --out {custom}` (DATASET: pydocs, shakespeare, fineweb10B, finewebedu10B, " \
               "or `text --input FILE ...` for your own .txt files)" in message

    # text is a dataset of prepare.py's, but its command needs --input (the user's files): no command is guessed
    text = tmp_path / "text"
    with pytest.raises(ShardError) as e:
        find_shards(text, "train")
    assert "python prepare.py text" not in str(e.value)
    assert str(e.value).endswith(f"prepare it with `python prepare.py DATASET --out {text}` (DATASET: pydocs, shakespeare, "
                                 "fineweb10B, finewebedu10B, or `text --input FILE ...` for your own .txt files)")

    named = tmp_path / "shakespeare"  # a dataset's name, outside data/: the command needs --out
    with pytest.raises(ShardError, match=re.escape(f"run `python prepare.py shakespeare --out {named}` first")):
        find_shards(named, "val")
    monkeypatch.setattr(shards, "DATA_ROOT", tmp_path)  # as if tmp_path were data/: no --out needed
    with pytest.raises(ShardError, match=r"run `python prepare.py shakespeare` first$"):
        find_shards(named, "val")

    write_meta(custom, {"command": f"python prepare.py text --input notes/ --out {custom}"})
    with pytest.raises(ShardError, match=re.escape(f"does not exist: run `python prepare.py text --input notes/ --out {custom}` again")):
        read_shard(custom / "llmc2_val_000000.bin")
    with pytest.raises(ShardError, match=re.escape(f"run `python prepare.py text --input notes/ --out {custom}` first")):
        find_shards(custom, "train")

    # the recorded command remakes this folder, wherever it has moved since (or a relative --out pointed from)
    for recorded in (f"python prepare.py shakespeare --out {tmp_path / 'old'} --url http://mirror/",
                     "python prepare.py shakespeare --out old --url http://mirror/"):
        write_meta(custom, {"command": recorded})
        with pytest.raises(ShardError, match=re.escape(f"run `python prepare.py shakespeare --out {custom} --url http://mirror/` again")):
            read_shard(custom / "llmc2_val_000000.bin")
    write_meta(custom, {"command": "python prepare.py shakespeare --tokenizer gpt2"})  # made in data/, moved out
    with pytest.raises(ShardError, match=re.escape(f"run `python prepare.py shakespeare --tokenizer gpt2 --out {custom}` again")):
        read_shard(custom / "llmc2_val_000000.bin")
    write_meta(named, {"command": "python prepare.py shakespeare"})  # still where it was made (tmp_path as data/)
    with pytest.raises(ShardError, match=re.escape("run `python prepare.py shakespeare` again")):
        read_shard(named / "shakespeare_val_000000.bin")


def test_fingerprint_reads_each_shards_length_and_ends(tmp_path):
    """fingerprint is the same for the same tokens read back from disk, and differs when a shard's first or
    last FINGERPRINT_TOKENS change, when a shard grows or when two swap places; a token changed between its
    ends is what it does not read (the cost of not reading every token, as its docstring says)."""
    n, ends = 3 * shards.FINGERPRINT_TOKENS, shards.FINGERPRINT_TOKENS
    a, b = (np.arange(n) % 50_000).astype(np.uint16), (np.arange(n) % 7).astype(np.uint16)
    write_shard(tmp_path / "a.bin", a)
    reference = fingerprint([a, b])
    assert fingerprint([read_shard(tmp_path / "a.bin"), b]) == reference

    def changed(k):
        c = a.copy()
        c[k] += 1
        return fingerprint([c, b])
    assert changed(0) != reference and changed(ends - 1) != reference and changed(n - ends) != reference
    assert changed(n - 1) != reference and changed(ends) == reference == changed(n - ends - 1)
    assert fingerprint([np.append(a, 0).astype(np.uint16), b]) != reference
    assert fingerprint([b, a]) != reference


def test_meta_round_trip_and_missing_meta(tmp_path):
    meta = {"tokenizer": "bytes", "vocab_size": 256, "train_tokens": 9, "val_tokens": 1, "source": "x"}
    write_meta(tmp_path, meta)
    assert load_meta(tmp_path) == meta
    with pytest.raises(ShardError, match="meta.json does not exist"):
        load_meta(tmp_path / "nothing")
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(ShardError, match="not valid JSON"):
        load_meta(tmp_path)


@pytest.mark.parametrize("meta, problem", [
    ({"tokenizer": "bytes", "vocab_size": 256, "command": "python prepare.py shakespeare"}, "lacks train_tokens, val_tokens"),
    ({"vocab_size": 256, "train_tokens": 9, "val_tokens": 1, "command": "python prepare.py shakespeare"}, "lacks tokenizer"),
    ({"tokenizer": "bytes", "vocab_size": "256", "train_tokens": 9, "val_tokens": True,
      "command": "python prepare.py shakespeare"}, "vocab_size should be int, got str, val_tokens should be int, got bool"),
    ([], "is not a JSON object ({...})"),
    # a tokenizer no reader has (training would run to its end, sample.py then refuse it), a vocabulary of
    # no tokens (GPTConfig would name vocab_size=0, a value the user never set)
    ({"tokenizer": "foo", "vocab_size": 256, "train_tokens": 9, "val_tokens": 1, "command": "python prepare.py shakespeare"},
     "names the tokenizer 'foo', which this project does not have (bytes, gpt2)"),
    ({"tokenizer": "bytes", "vocab_size": 0, "train_tokens": 9, "val_tokens": 1, "command": "python prepare.py shakespeare"},
     "says vocab_size=0, a vocabulary needs at least one token"),
    ({"tokenizer": "gpt2", "vocab_size": -5, "train_tokens": 9, "val_tokens": 1, "command": "python prepare.py shakespeare"},
     "says vocab_size=-5"),
])
def test_incomplete_or_odd_meta_is_a_one_line_error(tmp_path, meta, problem):
    """What the readers index (train.py: tokenizer, vocab_size, train_tokens, val_tokens) is checked on
    load, so a hand-made or cut-down meta.json is a ShardError naming the problem, not a KeyError later."""
    data_dir = tmp_path / "shakespeare"
    write_meta(data_dir, meta)
    with pytest.raises(ShardError) as e:
        load_meta(data_dir)
    message = str(e.value)
    assert message.startswith(f"{data_dir / 'meta.json'}") and problem in message and "\n" not in message
    # the command meta.json records, else the one the folder's name implies; outside data/ (as here), with --out
    command = f"python prepare.py shakespeare --out {data_dir}"
    assert message.endswith(f"delete it and run `{command}` again")


def test_bytes_tokenizer_is_utf8():
    tok = get_tokenizer("bytes")
    assert (tok.vocab_size, tok.eot) == (256, None)
    text = "naïve — 日本"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.decode(ids[:-1]).endswith("\ufffd")  # a cut-off character decodes, visibly


def test_gpt2_tokenizer(gpt2_offline):
    tok = get_tokenizer("gpt2")
    assert (tok.vocab_size, tok.eot) == (50257, 50256)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("<|endoftext|>") != [50256]  # text stays text
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"


def test_unknown_tokenizer_lists_the_choices():
    with pytest.raises(ValueError, match="bytes, gpt2"):
        get_tokenizer("llama")
