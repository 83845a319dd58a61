"""The shard format (llm.c's .bin) and the tokenizers: what shards.py promises its readers."""

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the scripts and helpers live at the repo root

import common
from shards import ShardError, find_shards, get_tokenizer, load_meta, read_shard, write_meta, write_shard



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
    assert str(path) in message and "magic 12345" in message
    assert "python prepare.py toy" in message and "\n" not in message


def test_wrong_version_is_rejected(tmp_path):
    path = _shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[4:8] = np.array([2], dtype="<i4").tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="version 2"):
        read_shard(path)


@pytest.mark.parametrize("keep", [10, 1024 + 2 * 100 - 1])
def test_truncated_shard_is_rejected_naming_the_file(tmp_path, keep):
    path = _shard(tmp_path)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ShardError, match="truncated") as e:
        read_shard(path)
    assert str(path) in str(e.value)


def test_remedy_repeats_the_command_in_meta(tmp_path):
    path = _shard(tmp_path)
    write_meta(path.parent, {"command": "python prepare.py shakespeare --tokenizer gpt2"})
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ShardError, match="python prepare.py shakespeare --tokenizer gpt2"):
        read_shard(path)


def test_find_shards_sorted_by_split_and_clear_when_missing(tmp_path):
    for name in ["d_train_000002.bin", "d_train_000000.bin", "d_val_000000.bin", "d_train_000001.bin"]:
        write_shard(tmp_path / name, [1])
    assert [p.name for p in find_shards(tmp_path, "train")] == ["d_train_000000.bin", "d_train_000001.bin", "d_train_000002.bin"]
    assert [p.name for p in find_shards(tmp_path, "val")] == ["d_val_000000.bin"]
    with pytest.raises(ShardError, match=r"no train shards .* in .*: run `python prepare.py empty`"):
        find_shards(tmp_path / "empty", "train")
    with pytest.raises(ValueError, match="split"):
        find_shards(tmp_path, "test")


def test_meta_round_trip_and_missing_meta(tmp_path):
    meta = {"tokenizer": "bytes", "vocab_size": 256, "train_tokens": 9, "val_tokens": 1, "source": "x"}
    write_meta(tmp_path, meta)
    assert load_meta(tmp_path) == meta
    with pytest.raises(ShardError, match="meta.json does not exist"):
        load_meta(tmp_path / "nothing")
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(ShardError, match="not valid JSON"):
        load_meta(tmp_path)


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
