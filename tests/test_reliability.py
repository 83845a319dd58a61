"""
What cannot hurt a user (README, "Reliability"): a checkpoint is loaded as plain data, so opening
one never runs code, by any entry point, and a damaged one (or a file that is none, GPT-2's safetensors
included) is refused; every file is written atomically and durably (fsynced
before its rename, its folder after), and a failed write leaves no temporary file; a meta.json
train.py cannot use is a one-line error. Verified downloads (the published sha256) are tested
with the other downloads, in test_prepare.py.
"""

import importlib.util
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import common
import shards
from checkpoint import gpt2_state_dict, load_checkpoint, load_for_inference, model_args, save_checkpoint
from download import download
from localserver import LocalServer
from model import GPT, GPTConfig
from test_train import ENV, TINY, make_dataset

REPO = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickling this runs code, as a malicious checkpoint's would; here it only creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_a_payload_checkpoint_is_refused_by_every_entry_point_and_never_runs(tmp_path):
    """train.py (resume and init_from), sample.py, fold.py and eval.py each refuse it in one line; its code never runs."""
    data = make_dataset(tmp_path / "data")
    marker = tmp_path / "payload_ran"
    model = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    ckpt = tmp_path / "shared" / "ckpt.pt"  # otherwise a good checkpoint: only "config" carries the payload
    save_checkpoint(dict(model=model.state_dict(), model_args=model_args(model), iter_num=0, best_val_loss=0.0,
                         config=Payload(marker), dataset_meta=dict(tokenizer="bytes")), ckpt)
    train = [sys.executable, REPO / "train.py", *TINY, f"--dataset={data}"]
    commands = {
        "train.py resume": [*train, "--init_from=resume", f"--out_dir={ckpt.parent}"],
        "train.py init_from": [*train, f"--init_from={ckpt}", f"--out_dir={tmp_path / 'out'}"],
        "sample.py": [sys.executable, REPO / "sample.py", f"--out_dir={ckpt.parent}"],
        "fold.py": [sys.executable, REPO / "fold.py", f"--ckpt={ckpt}", f"--out={tmp_path / 'folded.pt'}"],
    }
    if importlib.util.find_spec("lm_eval"):  # (eval.py stops earlier, in one line, without the harness)
        commands["eval.py"] = [sys.executable, REPO / "eval.py", f"--ckpt={ckpt}", "--tasks=python_words",
                               f"--include_path={REPO / 'docs' / 'tasks'}"]
    for name, command in commands.items():
        result = subprocess.run(list(map(str, command)), cwd=tmp_path, env=ENV, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 1, (name, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {ckpt} holds objects a "
                                                                            "checkpoint must not hold (builtins.exec)"), (name, result.stderr)
        assert not marker.exists(), name
    assert not (tmp_path / "folded.pt").exists()
    torch.load(ckpt, weights_only=False)  # the payload is live: an unsafe load runs it
    assert marker.exists()


def test_a_refused_checkpoint_names_what_it_holds(tmp_path):
    """Objects other than plain data (numpy arrays here) are refused by name, before any of them is built."""
    torch.save(dict(model={}, model_args={}, data_rng=np.zeros(3)), tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match=r"ckpt.pt holds objects a checkpoint must not hold \(numpy"):
        load_checkpoint(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("content", [{"model": {}}, {"model_args": {}}, [1, 2], {"model": [], "model_args": {}},
                                     {"model": {}, "model_args": None}])
def test_a_torch_file_that_is_not_a_checkpoint_is_refused_in_one_line(tmp_path, content):
    """Plain data without both of a checkpoint's dicts (a state dict saved on its own, say, or another program's
    file that uses the names) is refused by name as it is read, not a KeyError or a TypeError later."""
    torch.save(content, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match=r"ckpt\.pt is not a checkpoint of this project "
                                         r"\(no 'model' and 'model_args' dicts\)") as err:
        load_checkpoint(tmp_path / "ckpt.pt")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("content,what", [(b"", "an empty file"), (b'{"tokenizer": "bytes"}', "not a file torch.save writes"),
                                          (b"\x40\x1b\x34\x01" + bytes(1020), "not a file torch.save writes")])
def test_a_file_that_no_torch_save_wrote_is_named_not_a_checkpoint(tmp_path, content, what):
    """A file of another kind passed as a checkpoint (meta.json, a token shard, an empty file) is named for what it
    is not, in one line: not "damaged", and not "objects a checkpoint must not hold", which would warn of an
    unsafe file. torch.save's files start as a zip archive (PK) or, in its legacy format, a pickle (0x80)."""
    path = tmp_path / "file"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{path} is not a checkpoint \({what}\): pass a ckpt.pt that train.py or "
                                         "fold.py wrote$"):
        load_checkpoint(path)
    legacy = tmp_path / "legacy.pt"
    torch.save(dict(model={}, model_args={}), legacy, _use_new_zipfile_serialization=False)
    assert load_checkpoint(legacy) == dict(model={}, model_args={})  # (the legacy format still loads)


@pytest.mark.parametrize("damage", ["no GPT-2 tensors", "truncated"])
def test_a_safetensors_file_without_gpt2_weights_is_refused_in_one_line(tmp_path, damage):
    """The GPT-2 reader (checkpoint.gpt2_state_dict) refuses a safetensors file that holds other tensors, or
    that is cut short, in one line that says to download it again."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    path = tmp_path / "gpt2.safetensors"
    save_file({"h.0.ln_1.weight": torch.ones(4), "h.0.ln_1.bias": torch.zeros(4)}, str(path))  # no wte.weight
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-5])
    message = {"no GPT-2 tensors": r"gpt2\.safetensors holds no GPT-2 weights \(no wte\.weight\)",
               "truncated": r"cannot read \S+gpt2\.safetensors \("}[damage]
    with pytest.raises(ValueError, match=message) as err:
        gpt2_state_dict(path)
    assert "\n" not in str(err.value) and str(err.value).endswith("; delete it to download it again")


def test_a_cached_file_that_is_not_the_named_gpt2_is_refused_in_one_line(tmp_path):
    """sample.py or eval.py with --init_from=gpt2, and a file in the cache under GPT-2's name that holds other
    weights (another size, a model of one's own): the file is named, with what to do, not the shapes (which the
    user cannot set for GPT-2). (train.py may set them: its error names them.)"""
    save_file = pytest.importorskip("safetensors.torch").save_file
    (tmp_path / "cache").mkdir()
    save_file({"wte.weight": torch.zeros(10, 4), "wpe.weight": torch.zeros(8, 4)}, str(tmp_path / "cache" / "gpt2.safetensors"))
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'cache' / 'gpt2.safetensors'} does not hold gpt2's weights "
                                         r"\(checkpoint and model do not match: missing parameter \S+ \(and \d+ more\)\): "
                                         "delete it to download it again$"):
        load_for_inference("gpt2", cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("meta", [dict(tokenizer="bytes", vocab_size=64), []])
def test_train_refuses_an_incomplete_meta_json_in_one_line(tmp_path, meta):
    """A meta.json without the token counts (or not an object at all) used to be a KeyError or a
    TypeError deep in train.py; now the loader names the problem and how to remake the folder."""
    data = make_dataset(tmp_path / "mydata")
    shards.write_meta(data, meta)
    result = subprocess.run([sys.executable, REPO / "train.py", *TINY, f"--dataset={data}", "--max_iters=1"],
                            cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    problem = "lacks train_tokens, val_tokens" if meta else "is not a JSON object ({...})"
    assert result.stderr.startswith(f"error: {data / 'meta.json'} {problem}: delete it and prepare it with "
                                    f"`python prepare.py DATASET --out {data}`") and result.stderr.count("\n") == 1


def record_offset(path, suffix):
    """Where the bytes of the checkpoint's zip record whose name ends with suffix start in the file."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    header = path.read_bytes()[info.header_offset:info.header_offset + 30]
    name_len, extra_len = struct.unpack("<HH", header[26:30])  # the local header's own lengths
    return info.header_offset + 30 + name_len + extra_len


@pytest.mark.parametrize("damage", ["a weight's byte", "a byte of the pickle", "truncated"])
def test_a_damaged_checkpoint_is_refused_not_loaded_with_wrong_weights(tmp_path, damage):
    """torch.load does not check the CRC-32 that torch.save writes per record: one flipped bit inside a
    tensor loads as a wrong weight, silently. load_checkpoint checks every record first, and names the one
    that fails."""
    path = tmp_path / "ckpt.pt"
    weight = torch.arange(1000, dtype=torch.float32)
    save_checkpoint(dict(model={"w": weight}, model_args={}), path)
    data = bytearray(path.read_bytes())
    record = "data/0" if damage == "a weight's byte" else "data.pkl"
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:
        data[record_offset(path, record) + 7] ^= 0x10
    path.write_bytes(bytes(data))
    if damage == "a weight's byte":  # what an unchecked load gives: no error, another weight
        assert not torch.equal(torch.load(path, weights_only=True)["model"]["w"], weight)
    with pytest.raises(ValueError, match=rf"checkpoint {path}.* damaged") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value)
    if damage != "truncated":  # (truncated, torch.load itself fails: the message said "damaged" before too)
        assert re.search(rf"Bad CRC-32 for file '[^']*/{re.escape(record)}'", str(e.value)), str(e.value)  # the record named


@pytest.mark.parametrize("damage", [(10, 8), (10, 99), (46, 0xFF)])
def test_a_checkpoint_whose_zip_directory_is_damaged_is_refused_in_one_line(tmp_path, damage):
    """A flipped byte in the archive's central directory, which names, places and describes each record, makes
    zipfile fail in ways of its own: a record stored plainly described as deflated (zlib's error) or in a method
    it does not know (NotImplementedError), a name that is not UTF-8 (UnicodeDecodeError, a ValueError whose
    message said nothing of damage). Each is "damaged", in one line, like a bad CRC-32."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(dict(model={"w": torch.arange(1000, dtype=torch.float32)}, model_args={}), path)
    data = bytearray(path.read_bytes())
    offset, value = damage  # (from the first central directory entry: +10 its compression method, +46 its name)
    data[data.index(b"PK\x01\x02") + offset] = value
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"^checkpoint {path} is damaged \(") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value) and str(e.value).endswith("so it was not loaded: restore it from a copy or retrain")


def test_a_checkpoint_saved_without_checksums_loads(tmp_path):
    """torch.save writes CRC-32 0 when its compute_crc32 setting is off: nothing to check, not damage."""
    from torch.utils.serialization import config
    weight = torch.arange(1000, dtype=torch.float32)
    config.save.compute_crc32 = False
    try:
        save_checkpoint(dict(model={"w": weight}, model_args={}), tmp_path / "ckpt.pt")
    finally:
        config.save.compute_crc32 = True
    assert torch.equal(load_checkpoint(tmp_path / "ckpt.pt")["model"]["w"], weight)


def syncs(monkeypatch):
    """A list that records, in order, ("fsync", the synced path) and ("replace", its destination)."""
    calls = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(common.os, "fsync", lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(common.os, "replace", lambda src, dst: calls.append(("replace", str(dst))) or replace(src, dst))
    return calls


def write_download(path):
    with LocalServer({"/blob": b"downloaded"}) as server:
        server.unversioned("/blob")  # no ETag, so no .part.validator written beside: only the file's own writes
        download(server.url + "/blob", path, quiet=True)


WRITERS = {
    "shard": lambda path: shards.write_shard(path, np.arange(10)),
    "meta.json": lambda path: shards.write_meta(path.parent, dict(tokenizer="bytes")),
    "checkpoint": lambda path: save_checkpoint(dict(model={}, model_args={}), path),
    "download": write_download,
}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's file through /proc (Linux)")
@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_syncs_the_file_before_its_rename_and_the_folder_after(tmp_path, monkeypatch, writer):
    """A power cut leaves the old file or the new one: its bytes reach the disk before the rename, the rename before the return."""
    path = tmp_path / ("meta.json" if writer == "meta.json" else "file")
    calls = syncs(monkeypatch)
    WRITERS[writer](path)
    (fsync, temporary), rename, folder = calls
    assert fsync == "fsync" and Path(temporary).parent == tmp_path and temporary != str(path)
    assert rename == ("replace", str(path)) and folder == ("fsync", str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_failed_checkpoint_save_keeps_the_old_one_and_leaves_no_temporary_file(tmp_path):
    """A save that fails halfway (here: an object torch.save cannot pickle) changes nothing on disk."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(dict(model={}, model_args={}, iter_num=1), path)
    before = path.read_bytes()
    with pytest.raises(Exception):
        save_checkpoint(dict(model={}, model_args={}, iter_num=2, config=lambda: None), path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"] and path.read_bytes() == before


def test_a_ctrl_c_in_the_middle_of_a_checkpoint_save_is_a_keyboard_interrupt_and_keeps_the_old_one(tmp_path, monkeypatch):
    """Ctrl-C mid-save (train.py's second stop signal) stops as a KeyboardInterrupt, not torch's zip writer's RuntimeError."""
    class Interrupted:  # a file whose writes stop with Ctrl-C after a few KB
        def __init__(self, f):
            self.f, self.left = f, 3000

        def write(self, data):
            self.left -= len(data)
            if self.left < 0:
                raise KeyboardInterrupt
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    path = tmp_path / "ckpt.pt"
    save_checkpoint(dict(model={}, model_args={}, iter_num=1), path)
    before = path.read_bytes()
    monkeypatch.setattr(common, "open", lambda file, mode="r": Interrupted(open(file, mode)) if mode == "wb" else open(file, mode),
                        raising=False)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(dict(model={"w": torch.ones(10_000)}, model_args={}, iter_num=2), path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"] and path.read_bytes() == before


def test_checkpoints_are_saved_with_cpu_tensors(tmp_path, monkeypatch):
    """Every tensor of a checkpoint, nested in the optimizer state and the RNG list too, goes through
    .cpu() before torch.save, so a CPU-only machine loads a GPU run's checkpoint with a plain torch.load
    (test_gpu.py checks the file itself on a GPU). Tuples stay tuples (Python's RNG state is one)."""
    moved = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda t, *a, **k: moved.append(tuple(t.shape)) or real_cpu(t, *a, **k))
    obj = dict(model={"w": torch.ones(2, 3)}, model_args={}, optimizer={"state": {0: {"exp_avg": torch.zeros(4)}}},
               rng=[dict(torch=torch.zeros(5, dtype=torch.uint8), python=(3, (1, 2), None))])
    save_checkpoint(obj, tmp_path / "ckpt.pt")
    assert sorted(moved) == [(2, 3), (4,), (5,)]
    loaded = load_checkpoint(tmp_path / "ckpt.pt")
    assert loaded["rng"][0]["python"] == (3, (1, 2), None) and torch.equal(loaded["model"]["w"], torch.ones(2, 3))
