"""
prepare.py and download.py against a local HTTP server on 127.0.0.1: real downloads,
cut connections, 404s, lying servers, and the token counts each dataset must give.
"""

import functools
import hashlib
import os
import socket
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the scripts live at the repo root, the server helper here

import download as download_py
import prepare
from download import DownloadError, download
from localserver import LocalServer
import shards
from shards import ShardError, find_shards, get_tokenizer, load_meta, read_shard, write_meta, write_shard

SHAKESPEARE = REPO.parent / "shared/data/tinyshakespeare/input.txt"  # the real one: only nanoGPT's counts need it


def play(speeches=1500):
    """A stand-in for tiny Shakespeare (prepare.py takes any UTF-8 text at that URL): speeches of random words
    from a fixed seed, some words of 2 and 3 bytes in UTF-8, so that a cut of the characters (nanoGPT's)
    and a cut of the bytes fall in different places."""
    rng = np.random.default_rng(3)
    speakers = ["First Citizen", "MENENIUS", "Cœur-de-Lion", "JULIET", "Æneas"]
    words = "thou art my lord and I the king of this fair land — ’tis naïve to speak so, good sir".split()
    return "".join(f"{rng.choice(speakers)}:\n" + " ".join(rng.choice(words, rng.integers(3, 30))) + "\n\n"
                   for _ in range(speeches))


PLAY = play()


@pytest.fixture(autouse=True)
def no_mirror_and_no_waiting(monkeypatch):
    monkeypatch.delenv(prepare.URL_ENV, raising=False)
    monkeypatch.setattr(prepare, "download", functools.partial(download, backoff=0))


@pytest.fixture
def play_server():
    """A local server whose input.txt is PLAY: shakespeare's download and split, on any machine."""
    with LocalServer({"/input.txt": PLAY.encode()}) as server:
        yield server


@pytest.fixture
def shakespeare_server():
    """The real tiny Shakespeare on a local server, for the token counts nanoGPT reports; skipped without it."""
    if not SHAKESPEARE.is_file():
        pytest.skip(f"tiny Shakespeare not found at {SHAKESPEARE}")
    with LocalServer({"/input.txt": SHAKESPEARE}) as server:
        yield server


def tokens_of(data_dir, split):
    return np.concatenate([read_shard(data_dir / f) for f in load_meta(data_dir)[f"{split}_files"]])


BLOB = np.random.default_rng(0).bytes(300_000)


# -----------------------------------------------------------------------------
# download.py

def test_download_resumes_a_cut_connection_with_range(tmp_path):
    with LocalServer({"/blob": BLOB}) as server:
        server.cut("/blob", after=200_000)
        dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
    assert dest.read_bytes() == BLOB
    (_, _, first), (_, _, second) = server.requests
    assert first is None
    resumed_at = int(second.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 200_000  # kept what arrived (less at most one read)
    assert [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_download_restarts_when_the_server_ignores_range(tmp_path):
    with LocalServer({"/blob": BLOB}) as server:
        server.cut("/blob", after=200_000)
        server.ignore_range("/blob")
        dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
    assert dest.read_bytes() == BLOB
    assert server.count("/blob") == 2


def test_a_file_changed_on_the_server_between_attempts_is_fetched_whole(tmp_path):
    """A transfer cut partway through one version resumes If-Range that version's ETag: the server
    has another by then, so it sends the whole new file (200), not the new file's rest after the old
    one's start. The validator goes with the finished file."""
    old, new = BLOB, bytes(reversed(BLOB))
    with LocalServer({"/blob": old}) as server:
        server.headers("/blob", {"ETag": '"v1"'})
        server.cut("/blob", after=150_000)
        with pytest.raises(DownloadError):
            download(server.url + "/blob", tmp_path / "blob", retries=0, quiet=True)
        have = (tmp_path / "blob.part").stat().st_size
        assert 0 < have < len(old) and (tmp_path / "blob.part.validator").read_text() == '"v1"'
        server.files["/blob"] = new
        server.headers("/blob", {"ETag": '"v2"'})
        download(server.url + "/blob", tmp_path / "blob", quiet=True)
        assert server.requests[-1] == ("GET", "/blob", f"bytes={have}-")  # asked to resume, answered with the whole
    assert (tmp_path / "blob").read_bytes() == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob"]


def test_a_file_with_no_etag_or_last_modified_is_fetched_whole_again(tmp_path):
    """Nothing names the version a part holds when the server sent neither an ETag nor Last-Modified, so a
    Range request could get another version's rest, with no If-Range to stop it: the retry starts over."""
    old, new = BLOB, bytes(reversed(BLOB))
    with LocalServer({"/blob": old}) as server:
        server.unversioned("/blob")
        server.cut("/blob", after=150_000)
        with pytest.raises(DownloadError, match="run again to resume"):
            download(server.url + "/blob", tmp_path / "blob", retries=0, quiet=True)
        assert 0 < (tmp_path / "blob.part").stat().st_size < len(old)
        assert not (tmp_path / "blob.part.validator").exists()
        server.files["/blob"] = new
        download(server.url + "/blob", tmp_path / "blob", quiet=True)
        assert server.requests[-1] == ("GET", "/blob", None)  # no Range: the whole file
    assert (tmp_path / "blob").read_bytes() == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob"]


def test_download_404_fails_at_once_naming_the_url(tmp_path):
    with LocalServer({}) as server:
        with pytest.raises(DownloadError) as e:
            download(server.url + "/missing.bin", tmp_path / "missing.bin", backoff=0, quiet=True)
        assert server.count("/missing.bin") == 1  # no retries for a 404
    message = str(e.value)
    assert "404" in message and server.url + "/missing.bin" in message and "--url" in message
    assert list(tmp_path.iterdir()) == []


def test_a_redirect_loop_fails_at_once(tmp_path):
    """A redirect loop loops again when asked again: one attempt, and one line that says so (it was retried 5 times,
    then blamed on the network)."""
    with LocalServer({}) as server:
        server.redirect("/loop", "/loop")
        with pytest.raises(DownloadError, match=rf"^{server.url}/loop redirects too many times \(a redirect loop\?\): "
                                                "check the address, or pass --url for a mirror$"):
            download(server.url + "/loop", tmp_path / "x", backoff=0, quiet=True)
        assert 1 < server.count("/loop") <= 31  # requests' own limit of 30 redirects, once
    assert list(tmp_path.iterdir()) == []


def test_download_catches_a_server_lying_about_the_length(tmp_path):
    with LocalServer({"/blob": BLOB}) as server:
        server.lie("/blob", len(BLOB) + 1000)
        with pytest.raises(DownloadError, match=f"of the {len(BLOB) + 1000:,} announced bytes"):
            download(server.url + "/blob", tmp_path / "blob", retries=2, backoff=0, quiet=True)
        assert server.count("/blob") == 3
    assert not (tmp_path / "blob").exists()


@pytest.mark.parametrize("status", [429, 500, 503])
def test_download_retries_5xx_then_succeeds(tmp_path, status):
    """Every 5xx, 500 included, and 429 Too Many Requests are worth another attempt; other 4xx are not."""
    with LocalServer({"/blob": BLOB}) as server:
        server.fail("/blob", status, times=2)
        download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
        assert server.count("/blob") == 3
    assert (tmp_path / "blob").read_bytes() == BLOB


def test_download_backs_off_exponentially(tmp_path, monkeypatch, capsys):
    """Retry k first waits backoff * 2**(k-1) seconds, and says so."""
    delays = []
    monkeypatch.setattr(download_py, "time", SimpleNamespace(sleep=delays.append, time=download_py.time.time))
    with LocalServer({"/blob": BLOB}) as server:
        server.fail("/blob", 503, times=3)
        download(server.url + "/blob", tmp_path / "blob", retries=3, backoff=0.5)
        assert server.count("/blob") == 4
    assert delays == [0.5, 1.0, 2.0]
    retrying = [line for line in capsys.readouterr().err.splitlines() if "retrying" in line]
    assert [line.split("; ")[-1] for line in retrying] == [f"retrying in {d:g} s ({k}/3)" for k, d in enumerate(delays, 1)]


def serve_ranges(monkeypatch, answer):
    """Requests go to the server with their Range header replaced by answer(range): what a server that
    answers another range than the one asked for sends back (the client's own Range is lost)."""
    real_get = requests.get

    def get(url, headers=None, **kwargs):
        headers = dict(headers or {})
        if "Range" in headers:
            headers["Range"] = answer(headers["Range"])
        return real_get(url, headers=headers, **kwargs)
    monkeypatch.setattr(requests, "get", get)


def test_a_resume_from_another_byte_starts_over(tmp_path, monkeypatch):
    """Asked for the rest from byte N, a server sends it from byte N + 1000: appended, 1000 bytes would be
    missing from the middle of the file. The part is dropped and the file fetched whole."""
    shifted = []

    def skip_ahead(asked):
        if shifted:
            return asked
        shifted.append(asked)
        return f"bytes={int(asked.removeprefix('bytes=').rstrip('-')) + 1000}-"
    serve_ranges(monkeypatch, skip_ahead)
    with LocalServer({"/blob": BLOB}) as server:
        server.cut("/blob", after=150_000)
        dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
        assert [asked for _, _, asked in server.requests][::2] == [None, None] and server.count("/blob") == 3
    assert dest.read_bytes() == BLOB


def test_a_server_that_sends_part_of_the_rest_is_asked_again(tmp_path, monkeypatch):
    """Some servers answer an open range ("bytes=N-") with a bounded piece of it: a 206 whose Content-Range
    names the full length. The file is complete only at that length, resumed as often as it takes."""
    def at_most_100k(asked):
        start = int(asked.removeprefix("bytes=").rstrip("-"))
        return f"bytes={start}-{start + 99_999}"
    serve_ranges(monkeypatch, at_most_100k)
    with LocalServer({"/blob": BLOB}) as server:
        server.cut("/blob", after=150_000)
        dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
        assert server.count("/blob") == 3  # the cut, 100k more, the rest
    assert dest.read_bytes() == BLOB and [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_a_complete_part_is_finished_without_fetching_it_again(tmp_path):
    """A process stopped between the last byte and the rename leaves a complete .part: the server answers
    its resume 416 with the full length, and the part is renamed as it is. A .part longer than the file
    is not the file: it is dropped and the file fetched whole."""
    with LocalServer({"/blob": BLOB}) as server:
        server.headers("/blob", {"ETag": '"v1"'})
        (tmp_path / "blob.part.validator").write_text('"v1"')
        (tmp_path / "blob.part").write_bytes(BLOB)
        dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
        assert server.requests == [("GET", "/blob", f"bytes={len(BLOB)}-")]
        assert dest.read_bytes() == BLOB and [p.name for p in tmp_path.iterdir()] == ["blob"]
        dest.unlink()
        (tmp_path / "blob.part.validator").write_text('"v1"')
        (tmp_path / "blob.part").write_bytes(BLOB + b"from an older, longer file")
        download(server.url + "/blob", dest, backoff=0, quiet=True)
        assert server.requests[1:] == [("GET", "/blob", f"bytes={len(BLOB) + 26}-"), ("GET", "/blob", None)]
    assert dest.read_bytes() == BLOB and [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_the_validator_names_the_version_the_part_holds(tmp_path):
    """A weak ETag may not be used for ranges (If-Range with one always gets the whole file): Last-Modified
    is kept instead. A whole file that comes with no validator leaves none: the one kept named the bytes
    the part held before, not these."""
    validator = tmp_path / "blob.part.validator"
    with LocalServer({"/blob": BLOB}) as server:
        server.headers("/blob", {"ETag": 'W/"v1"', "Last-Modified": "Wed, 21 Oct 2015 07:28:00 GMT"})
        server.cut("/blob", after=150_000)
        with pytest.raises(DownloadError):
            download(server.url + "/blob", tmp_path / "blob", retries=0, quiet=True)
        assert validator.read_text() == "Wed, 21 Oct 2015 07:28:00 GMT"
        server.headers("/blob", {"ETag": '"v2"'})
        server.cut("/blob", after=150_000)
        with pytest.raises(DownloadError):
            download(server.url + "/blob", tmp_path / "blob", retries=0, quiet=True)
        assert validator.read_text() == '"v2"'
        server.headers("/blob", {})  # the file changed again, served without ETag or Last-Modified now
        server.unversioned("/blob")
        server.files["/blob"] = bytes(reversed(BLOB))
        server.cut("/blob", after=150_000)
        with pytest.raises(DownloadError):
            download(server.url + "/blob", tmp_path / "blob", retries=0, quiet=True)
        assert server.requests[-1][2] is not None and not validator.exists()


def test_download_offline_says_which_host(tmp_path):
    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match=f"cannot reach host 127.0.0.1:{port}.*check your network"):
        download(f"http://127.0.0.1:{port}/x", tmp_path / "x", retries=1, backoff=0, quiet=True)


@pytest.mark.parametrize("url", ["not a url/x", "ftp://127.0.0.1/x", "http:///x", "http://a..b/x"])
def test_a_malformed_url_fails_at_once_naming_its_setting(tmp_path, monkeypatch, url):
    """No scheme, another scheme than http(s), no host, a host that cannot be parsed: no retry can help (each
    used to be retried, then blamed on the network; the last was urllib3's own error), so the first attempt ends
    in one line with the caller's advice, which names the setting the URL came from."""
    import requests
    attempts = []
    real_get = requests.get
    monkeypatch.setattr(requests, "get", lambda *a, **k: attempts.append(a) or real_get(*a, **k))
    for mirror in (None, "set HF_ENDPOINT to a mirror"):
        with pytest.raises(DownloadError) as e:
            download(url, tmp_path / "x", backoff=0, quiet=True, **({"mirror": mirror} if mirror else {}))
        advice = mirror or "pass --url for a mirror"
        assert str(e.value) == f"{url!r} is not an http(s) URL (https://host/path): {advice}"
    assert len(attempts) == 2 and list(tmp_path.iterdir()) == []


def test_download_checks_expected_size_and_skips_existing(tmp_path):
    with LocalServer({"/blob": BLOB}) as server:
        with pytest.raises(DownloadError, match="expected 123"):
            download(server.url + "/blob", tmp_path / "blob", expected_size=123, quiet=True)
        assert list(tmp_path.iterdir()) == []
        (tmp_path / "blob").write_bytes(b"already here")
        download(server.url + "/blob", tmp_path / "blob", quiet=True)
        assert server.count("/blob") == 1


def hub(server, blob):
    """Serve blob as Hugging Face does: /resolve/blob redirects to /cdn/blob, the redirect carrying its sha256."""
    server.files["/cdn/blob"] = blob
    server.headers("/resolve/blob", {"X-Linked-ETag": f'"{hashlib.sha256(blob).hexdigest()}"'})
    server.redirect("/resolve/blob", "/cdn/blob")
    return server.url + "/resolve/blob"


def test_download_fetches_again_bytes_that_do_not_match_the_published_sha256(tmp_path):
    """Right length, wrong bytes, under a correct X-Linked-ETag: detected, fetched again, the hash kept."""
    with LocalServer() as server:
        url = hub(server, BLOB)
        server.corrupt("/cdn/blob", times=1)
        dest = download(url, tmp_path / "blob", backoff=0, quiet=True)
        assert server.count("/cdn/blob") == 2
        download(url, dest, backoff=0, quiet=True)  # a rerun reuses the verified file
        assert server.count("/cdn/blob") == 2
    assert dest.read_bytes() == BLOB
    assert (tmp_path / "blob.sha256").read_text() == f"{hashlib.sha256(BLOB).hexdigest()}  blob\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "blob.sha256"]


def test_download_gives_up_on_bytes_that_never_match(tmp_path):
    """Wrong bytes on every attempt: a bounded number of tries, then a one-line error and no file left."""
    with LocalServer() as server:
        url = hub(server, BLOB)
        server.corrupt("/cdn/blob")
        with pytest.raises(DownloadError) as e:
            download(url, tmp_path / "blob", retries=2, backoff=0, quiet=True)
        assert server.count("/cdn/blob") == 3
    message = str(e.value)
    assert "do not match the sha256 the server published" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_download_reverifies_an_existing_file_against_its_recorded_sha256(tmp_path, capsys):
    """A rerun hashes a file it finds against the .sha256 it was verified with: intact, it is reused
    without a request; changed since (a flipped bit on disk), it is fetched again. No record: reused as is."""
    with LocalServer() as server:
        url = hub(server, BLOB)
        dest = download(url, tmp_path / "blob", backoff=0, quiet=True)
        download(url, dest, backoff=0)
        assert server.count("/cdn/blob") == 1
        dest.write_bytes(b"\0" + BLOB[1:])
        download(url, dest, backoff=0)
        assert server.count("/cdn/blob") == 2
        assert "does not match the sha256 it was downloaded with" in capsys.readouterr().err
        assert dest.read_bytes() == BLOB
        assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "blob.sha256"]

        (tmp_path / "blob.sha256").unlink()  # nothing to check against: the caller validates the content
        dest.write_bytes(b"\0" + BLOB[1:])
        download(url, dest, backoff=0, quiet=True)
        assert server.count("/cdn/blob") == 2


def test_download_does_not_take_a_plain_etag_for_the_sha256(tmp_path):
    """Only Hugging Face's X-Linked-ETag is documented to be the file's sha256. A plain ETag of 64 hex
    digits may hash anything (here: other bytes); taken for the sha256, it failed every download."""
    other = f'"{hashlib.sha256(b"not the file").hexdigest()}"'
    with LocalServer() as server:
        server.files["/blob"] = BLOB
        server.headers("/blob", {"ETag": other})
        dest = download(server.url + "/blob", tmp_path / "direct", retries=2, backoff=0, quiet=True)
        assert dest.read_bytes() == BLOB and server.count("/blob") == 1
        url = hub(server, BLOB)  # Hugging Face's shape, its CDN tagging the body with a hash of its own
        server.headers("/cdn/blob", {"ETag": other})
        dest = download(url, tmp_path / "hub", retries=2, backoff=0, quiet=True)
        assert dest.read_bytes() == BLOB and server.count("/cdn/blob") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["direct", "hub", "hub.sha256"]
    assert (tmp_path / "hub.sha256").read_text() == f"{hashlib.sha256(BLOB).hexdigest()}  hub\n"


def test_a_record_left_from_another_file_is_dropped(tmp_path):
    """A .sha256 whose file was deleted by hand names bytes no longer there: a download from a server that
    publishes no sha256 removes it, else every later run would find the file "changed" and fetch it again."""
    (tmp_path / "blob.sha256").write_text(f"{hashlib.sha256(b'an older file').hexdigest()}  blob\n")
    with LocalServer({"/blob": BLOB}) as server:
        dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
        assert [p.name for p in tmp_path.iterdir()] == ["blob"]
        download(server.url + "/blob", dest, backoff=0, quiet=True)
        assert server.count("/blob") == 1
    assert dest.read_bytes() == BLOB


def test_download_without_a_published_sha256_checks_the_length_only(tmp_path):
    """No ETag, or one that is not a 64-hex sha256 (an md5 here): wrong bytes of the right length pass."""
    for headers in ({}, {"ETag": f'"{hashlib.md5(BLOB).hexdigest()}"'}):
        with LocalServer({"/blob": BLOB}) as server:
            server.headers("/blob", headers)
            server.corrupt("/blob", times=1)
            dest = download(server.url + "/blob", tmp_path / "blob", backoff=0, quiet=True)
            assert server.count("/blob") == 1
        assert dest.read_bytes() != BLOB and len(dest.read_bytes()) == len(BLOB)
        assert [p.name for p in tmp_path.iterdir()] == ["blob"]  # nothing claims it was verified
        dest.unlink()


def test_a_body_sent_without_its_length_is_refused_unless_a_published_sha256_vouches_for_it(tmp_path, play_server):
    """No Content-Length: the body ends where the connection closes, and a drop partway looks the same. Tiny
    Shakespeare cut so is refused in one line, nothing prepared; a published sha256, or the size the caller
    expects, verifies such a body."""
    play_server.unsized("/input.txt")
    play_server.cut("/input.txt", after=100_000)
    with pytest.raises(DownloadError) as e:
        prepare.prepare("shakespeare", out=tmp_path / "s", url=play_server.url, quiet=True)
    assert "sent with no length" in str(e.value) and "\n" not in str(e.value)
    assert play_server.count("/input.txt") == 1 and list((tmp_path / "s").iterdir()) == []
    with LocalServer() as server:
        url = hub(server, BLOB)
        server.unsized("/cdn/blob")
        assert download(url, tmp_path / "blob", backoff=0, quiet=True).read_bytes() == BLOB
    with LocalServer({"/blob": BLOB}) as server:  # as does the size a caller expects
        server.unsized("/blob")
        dest = download(server.url + "/blob", tmp_path / "sized", expected_size=len(BLOB), quiet=True)
        assert dest.read_bytes() == BLOB


# -----------------------------------------------------------------------------
# pydocs: the offline default

def test_pydocs_prepares_offline(tmp_path, monkeypatch):
    def no_network(*args):
        raise AssertionError("pydocs must not touch the network")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    data_dir = prepare.prepare(out=tmp_path / "pydocs", quiet=True)

    from pydoc_data.topics import topics
    joined = "\n\n".join(topics[k] for k in sorted(topics))
    meta = load_meta(data_dir)
    assert (meta["tokenizer"], meta["vocab_size"]) == ("bytes", 256)
    assert meta["train_files"] == ["pydocs_train_000000.bin"] and meta["val_files"] == ["pydocs_val_000000.bin"]
    train, val = tokens_of(data_dir, "train"), tokens_of(data_dir, "val")
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    # val is the tail of the docs, starting at a line; train is everything before it
    train_text, val_text = bytes(train.astype(np.uint8)).decode(), bytes(val.astype(np.uint8)).decode()
    assert joined.startswith(train_text) and joined.endswith(val_text) and train_text.endswith("\n")
    assert len(train_text) + len(val_text) in (len(joined), len(joined) - 2)  # cut inside a doc, or between two
    assert 0.09 < len(val) / (len(train) + len(val)) < 0.12


def test_split_tail_cuts_at_a_line_or_between_documents():
    """val is the last val_fraction of the characters, from the start of the line the cut falls in; a
    document that ends at the cut is a boundary already, whole in train even without a final newline."""
    assert prepare.split_tail(["aaaa\nbbbb", "c"], 0.1) == (["aaaa\nbbbb"], ["c"])
    assert prepare.split_tail(["a", "bbbb\ncccc"], 0.3) == (["a", "bbbb\n"], ["cccc"])
    assert prepare.split_tail(["0123456789"], 0.3) == (["0123456"], ["789"])  # no line to go back to


def test_split_tail_rounds_the_cut_to_the_nearest_character():
    """val starts at the character nearest to (1 - val_fraction) of the text, not the one below it."""
    # 10 characters x 0.67 = 6.7: the cut is at 7, val the last 3 (cut down, at 6, val would take 4)
    assert prepare.split_tail(["0123456789"], 0.33) == (["0123456"], ["789"])
    assert prepare.split_tail(["0123456789"], 0.37) == (["012345"], ["6789"])  # 6.3: 6


def test_byte_tokens_are_the_utf8_bytes_of_any_text(tmp_path):
    """A byte-level dataset holds each UTF-8 byte of the text as one token below 256, non-ASCII text included."""
    text = "naïve café ✓ 🤗\n" * 40
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    data_dir = prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=tmp_path / "t", quiet=True)
    # one document: train then val is the text itself, no separator
    assert np.concatenate([tokens_of(data_dir, "train"), tokens_of(data_dir, "val")]).tolist() == list(text.encode("utf-8"))


@pytest.mark.parametrize("val_fraction", [0, 1, 1.5, -0.1])
def test_val_fraction_must_leave_both_splits_some_text(tmp_path, val_fraction):
    with pytest.raises(ValueError, match=f"--val_fraction must lie strictly between 0 and 1, got {val_fraction}"):
        prepare.prepare("pydocs", out=tmp_path / "p", val_fraction=val_fraction, quiet=True)
    assert not (tmp_path / "p").exists()


def test_a_meta_json_that_miscounts_its_shards_is_prepared_again(tmp_path):
    """meta.json's token counts are the shards' exactly: one short of them (too many is a truncated shard) is redone."""
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    data_dir = prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=tmp_path / "t", quiet=True)
    meta = load_meta(data_dir)
    write_meta(data_dir, dict(meta, val_tokens=meta["val_tokens"] - 1))
    assert not prepare.is_complete(data_dir)
    prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=tmp_path / "t", quiet=True)
    assert load_meta(data_dir)["val_tokens"] == meta["val_tokens"] == len(tokens_of(data_dir, "val"))


def test_rerun_reuses_valid_output_and_redoes_corrupt_output(tmp_path, capsys):
    data_dir = prepare.prepare("pydocs", out=tmp_path / "p")
    val = data_dir / "pydocs_val_000000.bin"
    written = val.stat().st_mtime_ns
    capsys.readouterr()
    prepare.prepare("pydocs", out=tmp_path / "p")
    assert "already prepared" in capsys.readouterr().out
    assert val.stat().st_mtime_ns == written

    val.write_bytes(val.read_bytes()[:-100])  # truncated, as by a full disk
    prepare.prepare("pydocs", out=tmp_path / "p")
    assert "already prepared" not in capsys.readouterr().out
    assert len(read_shard(val)) == load_meta(data_dir)["val_tokens"]


# -----------------------------------------------------------------------------
# shakespeare, downloaded from the local server

def test_shakespeare_bytes_split_like_nanogpt_and_resumed(tmp_path, play_server):
    """A download cut partway resumes; the first 90% of the characters train, the rest val (nanoGPT's split),
    one token a byte."""
    data = PLAY.encode()
    play_server.cut("/input.txt", after=100_000)  # past download.py's first 64 KiB read, which is kept
    data_dir = prepare.prepare("shakespeare", out=tmp_path / "s", url=play_server.url, quiet=True)
    assert (data_dir / "input.txt").read_bytes() == data
    (_, _, first), (_, _, second) = play_server.requests
    assert first is None and 0 < int(second.removeprefix("bytes=").rstrip("-")) <= 100_000 < len(data)
    cut = int(len(PLAY) * 0.9)
    assert len(PLAY[:cut].encode()) != int(len(data) * 0.9)  # PLAY tells the two cuts apart
    meta = load_meta(data_dir)
    assert (meta["tokenizer"], meta["vocab_size"]) == ("bytes", 256)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(PLAY[:cut].encode()), len(PLAY[cut:].encode()))
    assert bytes(tokens_of(data_dir, "train").astype(np.uint8)).decode() == PLAY[:cut]
    assert bytes(tokens_of(data_dir, "val").astype(np.uint8)).decode() == PLAY[cut:]


def test_shakespeare_bytes_counts_match_nanogpt(tmp_path, shakespeare_server):
    data_dir = prepare.prepare("shakespeare", out=tmp_path / "s", url=shakespeare_server.url, quiet=True)
    assert (data_dir / "input.txt").read_bytes() == SHAKESPEARE.read_bytes()
    meta = load_meta(data_dir)
    assert (meta["train_tokens"], meta["val_tokens"]) == (1_003_854, 111_540)


def test_shakespeare_gpt2_counts_match_nanogpt(tmp_path, shakespeare_server, gpt2_offline):
    data_dir = prepare.prepare("shakespeare", out=tmp_path / "s", tokenizer="gpt2", url=shakespeare_server.url, quiet=True)
    meta = load_meta(data_dir)
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"]) == ("gpt2", 50257, 50256)
    assert (meta["train_tokens"], meta["val_tokens"]) == (301_966, 36_059)
    assert get_tokenizer("gpt2").decode(tokens_of(data_dir, "train")[:3].tolist()) == "First Citizen:"


def test_another_tokenizer_never_replaces_a_prepared_dataset(tmp_path, play_server, gpt2_offline):
    """shakespeare in bytes, then --tokenizer gpt2 into the same folder: refused before anything is fetched, the
    bytes dataset (which runs and checkpoints may depend on) as it was; into a folder of its own, prepared:
    GPT-2 tokens of the same split, with no eot inserted."""
    data_dir = prepare.prepare("shakespeare", out=tmp_path / "s", url=play_server.url, quiet=True)
    before = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    with pytest.raises(ValueError) as e:
        prepare.prepare("shakespeare", out=data_dir, tokenizer="gpt2", url=play_server.url, quiet=True)
    assert str(e.value) == (f"{data_dir} holds a complete dataset with tokenizer bytes, not gpt2: prepare into a folder "
                            f"of its own (--out {data_dir}_gpt2), or delete {data_dir} first")
    assert {p.name: p.read_bytes() for p in data_dir.iterdir()} == before
    assert play_server.count("/input.txt") == 1
    with pytest.raises(ValueError) as e:  # another dataset: a folder named for it
        prepare.prepare("pydocs", out=data_dir, quiet=True)
    assert str(e.value).endswith(f"with dataset shakespeare, not pydocs: prepare into a folder of its own (--out "
                                 f"{tmp_path / 'pydocs'}), or delete {data_dir} first")
    gpt2 = prepare.prepare("shakespeare", out=f"{data_dir}_gpt2", tokenizer="gpt2", url=play_server.url, quiet=True)
    meta, tok, cut = load_meta(gpt2), get_tokenizer("gpt2"), int(len(PLAY) * 0.9)
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"]) == ("gpt2", 50257, 50256)
    assert tok.decode(tokens_of(gpt2, "train").tolist()) == PLAY[:cut]
    assert tok.decode(tokens_of(gpt2, "val").tolist()) == PLAY[cut:]


@pytest.mark.parametrize("files_listed", [True, False])
def test_a_dataset_made_by_hand_is_never_replaced(tmp_path, files_listed):
    """A complete dataset whose meta.json names no recipe (shards and meta.json written by hand, under the
    names prepare.py would use) is not prepare.py's to replace: complete as train.py judges it, by the four keys
    docs/usage.md asks for and the tokens they count, whether or not it lists its files as prepare.py does."""
    data_dir = tmp_path / "t"
    write_shard(data_dir / "text_train_000000.bin", np.arange(100))
    write_shard(data_dir / "text_val_000000.bin", np.arange(10))
    listed = dict(train_files=["text_train_000000.bin"], val_files=["text_val_000000.bin"]) if files_listed else {}
    write_meta(data_dir, dict(tokenizer="bytes", vocab_size=256, train_tokens=100, val_tokens=10, **listed))
    before = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    with pytest.raises(ValueError, match="holds a complete dataset that prepare.py did not make"):
        prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=data_dir, quiet=True)
    assert {p.name: p.read_bytes() for p in data_dir.iterdir()} == before


def test_download_url_from_the_environment(tmp_path, play_server, monkeypatch):
    monkeypatch.setenv(prepare.URL_ENV, play_server.url)
    data_dir = prepare.prepare("shakespeare", out=tmp_path / "s", quiet=True)
    assert play_server.count("/input.txt") == 1
    assert load_meta(data_dir)["source"] == play_server.url + "/input.txt"
    # a bad one: the error names the variable it came from, not --url, which was never passed
    monkeypatch.setenv(prepare.URL_ENV, play_server.url + "/nowhere")
    with pytest.raises(DownloadError, match=rf"HTTP 404 .*, or check \${prepare.URL_ENV} \({play_server.url}/nowhere\), "
                                            "or unset it to download from the dataset's home$"):
        prepare.prepare("shakespeare", out=tmp_path / "s2", quiet=True)
    with pytest.raises(DownloadError, match="or pass --url for a mirror$"):  # --url given: it is the source
        prepare.prepare("shakespeare", out=tmp_path / "s3", url=play_server.url + "/nowhere", quiet=True)


# -----------------------------------------------------------------------------
# FineWeb: published shards, fetched and checked

def fineweb_files(n_train, tokens=5000):
    """Shards as llm.c writes them, built by hand: 256 int32 (magic, version, count, zeros), uint16 tokens."""
    rng = np.random.default_rng(1)
    header = np.array([20240520, 1, tokens] + [0] * 253, dtype="<i4").tobytes()
    names = ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin" for i in range(1, n_train + 1)]
    return {"/" + name: header + rng.integers(0, 50257, tokens).astype("<u2").tobytes() for name in names}


def test_fineweb_keeps_published_names_and_reuses_what_it_has(tmp_path):
    files = fineweb_files(3)
    with LocalServer(files) as server:
        data_dir = prepare.prepare("fineweb10B", shards=2, out=tmp_path / "fw", url=server.url, quiet=True)
        names = ["fineweb_train_000001.bin", "fineweb_train_000002.bin", "fineweb_val_000000.bin", "meta.json"]
        assert sorted(p.name for p in data_dir.iterdir()) == names
        for name in names[:3]:
            assert (data_dir / name).read_bytes() == files["/" + name]
        meta = load_meta(data_dir)
        assert (meta["tokenizer"], meta["train_tokens"], meta["val_tokens"]) == ("gpt2", 10_000, 5000)
        assert len(server.requests) == 3

        prepare.prepare("fineweb10B", shards=2, out=tmp_path / "fw", url=server.url, quiet=True)
        assert len(server.requests) == 3  # all there and valid: nothing fetched
        prepare.prepare("fineweb10B", shards=3, out=tmp_path / "fw", url=server.url, quiet=True)
        assert [p for _, p, _ in server.requests[3:]] == ["/fineweb_train_000003.bin"]
        assert load_meta(data_dir)["train_tokens"] == 15_000

    # fewer shards keep those here, and the note's way to train on fewer makes a dataset train.py takes
    fewer = run_cli("fineweb10B", "--shards", "1", "--out", data_dir, "--url", "http://127.0.0.1:9/unused")
    assert fewer.returncode == 0 and ("note: keeping 2 more train shard(s) from an earlier run; to train on fewer, "
                                      "delete them and run this command again") in fewer.stdout + fewer.stderr
    for extra in ("fineweb_train_000002.bin", "fineweb_train_000003.bin"):
        (data_dir / extra).unlink()
        (data_dir / (extra + ".sha256")).unlink(missing_ok=True)
    assert run_cli("fineweb10B", "--shards", "1", "--out", data_dir, "--url", "http://127.0.0.1:9/unused").returncode == 0
    assert prepare.is_complete(data_dir) and load_meta(data_dir)["train_tokens"] == 5000


def test_fineweb_failed_extension_keeps_the_dataset(tmp_path):
    """--shards 2, then --shards 3 against a dead server: the download fails, and the two shards and
    their meta.json are still there to train on (meta.json used to go first, leaving "no dataset"), with
    no empty .incoming/ beside them."""
    files = fineweb_files(3)
    with LocalServer(files) as server:
        data_dir = prepare.prepare("fineweb10B", shards=2, out=tmp_path / "fw", url=server.url, quiet=True)
        dead = server.url  # nobody answers there once the server is shut
    before = (data_dir / "meta.json").read_text()
    with pytest.raises(DownloadError, match="fineweb_train_000003.bin failed after .* cannot reach host"):
        prepare.prepare("fineweb10B", shards=3, out=data_dir, url=dead, quiet=True)
    assert (data_dir / "meta.json").read_text() == before
    assert not (data_dir / ".incoming").exists()  # nothing arrived: no empty folder left behind
    meta = load_meta(data_dir)
    assert [p.name for p in find_shards(data_dir, "train")] == meta["train_files"] == \
        ["fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    assert sum(len(read_shard(p)) for p in find_shards(data_dir, "train")) == meta["train_tokens"] == 10_000
    assert prepare.is_prepared(data_dir, dict(dataset="fineweb10B", shards=2))


def test_fineweb_extension_failing_partway_keeps_the_dataset_and_what_arrived(tmp_path):
    """--shards 1, then --shards 3 where shard 3 is missing: shard 2 arrived but waits in .incoming/, so the
    folder is still the 1-shard dataset its meta.json describes (train.py counts every shard in the folder);
    a rerun fetches shard 3 alone, and both join the dataset."""
    files = fineweb_files(3)
    with LocalServer({k: v for k, v in files.items() if not k.endswith("train_000003.bin")}) as server:
        data_dir = prepare.prepare("fineweb10B", shards=1, out=tmp_path / "fw", url=server.url, quiet=True)
        with pytest.raises(DownloadError, match="fineweb_train_000003.bin"):
            prepare.prepare("fineweb10B", shards=3, out=data_dir, url=server.url, quiet=True)
    meta = load_meta(data_dir)
    assert [p.name for p in find_shards(data_dir, "train")] == meta["train_files"] == ["fineweb_train_000001.bin"]
    assert prepare.is_prepared(data_dir, dict(dataset="fineweb10B", shards=1))
    assert [p.name for p in (data_dir / ".incoming").iterdir()] == ["fineweb_train_000002.bin"]
    with LocalServer(files) as server:
        prepare.prepare("fineweb10B", shards=3, out=data_dir, url=server.url, quiet=True)
        assert [p for _, p, _ in server.requests] == ["/fineweb_train_000003.bin"]
    assert load_meta(data_dir)["train_files"] == [f"fineweb_train_00000{i}.bin" for i in (1, 2, 3)]
    assert not (data_dir / ".incoming").exists()


@pytest.mark.parametrize("complete", [True, False])
@pytest.mark.parametrize("dataset", ["fineweb10B", "text"])
def test_a_folder_holding_another_dataset_is_refused_and_left_as_it_was(tmp_path, dataset, complete):
    """Readers take every shard in a folder, so two datasets never share one: a prepare into another
    dataset's folder is refused before it changes anything there (it used to delete meta.json first, or,
    for FineWeb, to add its shards to the other dataset's), whether that one is complete (a meta.json that
    counts its shards) or not."""
    data_dir = tmp_path / "mine"  # a dataset of one's own
    write_shard(data_dir / "mine_train_000000.bin", np.arange(100))
    write_shard(data_dir / "mine_val_000000.bin", np.arange(10))
    if complete:
        write_meta(data_dir, dict(tokenizer="bytes", vocab_size=256, train_tokens=100, val_tokens=10))
    before = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    (tmp_path / "other.txt").write_text("other text " * 100)
    refusal = "holds a complete dataset that prepare.py did not make" if complete else \
        "also holds mine_train_000000.bin, from another dataset"
    with LocalServer(fineweb_files(1)) as server:
        with pytest.raises(ValueError, match=refusal):
            if dataset == "text":
                prepare.prepare("text", inputs=[tmp_path / "other.txt"], out=data_dir, quiet=True)
            else:
                prepare.prepare(dataset, out=data_dir, url=server.url, quiet=True)
        assert not server.requests
    assert {p.name: p.read_bytes() for p in data_dir.iterdir()} == before


def test_fineweb_rerun_refetches_a_shard_that_no_longer_matches_its_sha256(tmp_path):
    """A shard whose header and length are fine but whose tokens changed on disk since it was verified
    (its .sha256 says so) is fetched again when the folder is prepared again."""
    files = fineweb_files(2)
    with LocalServer(files) as server:
        for name, data in files.items():  # published as Hugging Face publishes them
            server.headers(name, {"X-Linked-ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        data_dir = prepare.prepare("fineweb10B", shards=1, out=tmp_path / "fw", url=server.url, quiet=True)
        shard = data_dir / "fineweb_train_000001.bin"
        assert (data_dir / "fineweb_train_000001.bin.sha256").exists()
        damaged = bytearray(shard.read_bytes())
        damaged[-1] ^= 0xFF  # one token: read_shard cannot see it, the hash can
        shard.write_bytes(bytes(damaged))
        prepare.prepare("fineweb10B", shards=2, out=data_dir, url=server.url, quiet=True)
        assert server.count("/fineweb_train_000001.bin") == 2 and server.count("/fineweb_val_000000.bin") == 1
    assert shard.read_bytes() == files["/fineweb_train_000001.bin"]


def test_fineweb_rerun_refetches_a_damaged_shard_that_has_no_sha256(tmp_path):
    """A server that publishes no sha256 leaves no record; a shard cut short on disk since is seen by
    its header, removed and fetched again (download() would take a file it finds for finished)."""
    files = fineweb_files(1)
    with LocalServer(files) as server:
        data_dir = prepare.prepare("fineweb10B", shards=1, out=tmp_path / "fw", url=server.url, quiet=True)
        shard = data_dir / "fineweb_train_000001.bin"
        assert not (data_dir / "fineweb_train_000001.bin.sha256").exists()
        shard.write_bytes(shard.read_bytes()[:-100])
        prepare.prepare("fineweb10B", shards=1, out=data_dir, url=server.url, quiet=True)
        assert server.count("/fineweb_train_000001.bin") == 2 and server.count("/fineweb_val_000000.bin") == 1
    assert shard.read_bytes() == files["/fineweb_train_000001.bin"] and load_meta(data_dir)["train_tokens"] == 5000


@pytest.mark.parametrize("damage", ["truncated", "bad magic"])
def test_fineweb_bad_download_is_rejected_and_removed(tmp_path, damage):
    files = fineweb_files(1)
    path = "/fineweb_train_000001.bin"
    if damage == "bad magic":
        files[path] = b"\0\0\0\0" + files[path][4:]
    with LocalServer(files) as server:
        if damage == "truncated":  # a server that announces and sends fewer bytes than the file has
            server.lie(path, len(files[path]) - 10)
        with pytest.raises(ShardError) as e:
            prepare.prepare("fineweb10B", shards=1, out=tmp_path / "fw", url=server.url, quiet=True)
    assert "fineweb_train_000001.bin" in str(e.value) and "--url" in str(e.value)
    assert not (tmp_path / "fw" / "fineweb_train_000001.bin").exists()
    assert not (tmp_path / "fw" / "meta.json").exists()


def test_shards_hints_name_the_datasets_prepare_makes():
    """shards.py names prepare.py's datasets in its error messages without importing prepare.py."""
    assert shards.PREPARE_NAMES == tuple(prepare.DATASETS)
    assert shards.DATA_ROOT == prepare.DATA_ROOT == REPO / "data"


def test_fineweb_is_gpt2_only(tmp_path):
    with socket.socket() as s:  # a port nobody listens on: what is not refused fails there, never online
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ValueError, match="GPT-2"):
        prepare.prepare("fineweb10B", tokenizer="bytes", quiet=True)
    with pytest.raises(ValueError, match="comes with its own val shard: drop --val_fraction"):
        prepare.prepare("fineweb10B", val_fraction=0.2, out=tmp_path / "fw", url=dead, quiet=True)
    for count in (0, 100):
        with pytest.raises(ValueError, match=f"--shards must be between 1 and 99 for finewebedu10B, got {count}"):
            prepare.prepare("finewebedu10B", shards=count, out=tmp_path / "fw", url=dead, quiet=True)
    with pytest.raises(DownloadError, match="finewebedu_val_000000.bin failed"):
        prepare.prepare("finewebedu10B", shards=99, out=tmp_path / "fw", url=dead, quiet=True)


# -----------------------------------------------------------------------------
# text: the user's own files

def write_texts(folder):
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second document\n" * 50)
    (folder / "sub" / "c.txt").write_text("third document, the last one\n" * 40)
    (folder / "a.txt").write_text("first document\n" * 60)
    (folder / "ignored.md").write_text("not a .txt file\n")
    return folder


def test_text_gpt2_marks_documents_and_splits_off_the_tail(tmp_path, gpt2_offline):
    folder = write_texts(tmp_path / "in")
    data_dir = prepare.prepare("text", inputs=[folder], tokenizer="gpt2", out=tmp_path / "t", quiet=True)
    tok = get_tokenizer("gpt2")
    train, val = tokens_of(data_dir, "train").tolist(), tokens_of(data_dir, "val").tolist()
    assert train[0] == val[0] == 50256  # every document (and the val tail) starts with <|endoftext|>
    texts = [(folder / n).read_text() for n in ["a.txt", "b.txt", "sub/c.txt"]]  # sorted, recursive, .txt only
    parts = tok.decode(train + val).split("<|endoftext|>")
    assert parts[0] == "" and parts[1:3] == texts[:2]
    head, tail = parts[3:]  # the cut falls in the last document, at the start of a line
    assert head + tail == texts[2] and head.endswith("\n")
    assert tok.decode(val) == "<|endoftext|>" + tail

    again = prepare.prepare("text", inputs=[folder], tokenizer="gpt2", out=tmp_path / "t2", quiet=True)
    assert (again / "text_val_000000.bin").read_bytes() == (data_dir / "text_val_000000.bin").read_bytes()
    # a file named beside its folder, or twice, is read once (twice, it could be in train and in val)
    assert prepare.text_files([folder / "sub" / "c.txt", folder, folder / "a.txt"]) == \
        [folder / "sub" / "c.txt", folder / "a.txt", folder / "b.txt"]


def test_text_large_input_is_sharded_and_stale_shards_removed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prepare, "SHARD_TOKENS", 300)
    folder = write_texts(tmp_path / "in")
    data_dir = prepare.prepare("text", inputs=[folder], out=tmp_path / "t", quiet=True)
    meta = load_meta(data_dir)
    # a blank line between the three train documents; the cut falls inside the last one
    total = sum(len(p.read_bytes()) for p in folder.rglob("*.txt")) + 2 * 2
    assert meta["train_tokens"] + meta["val_tokens"] == total
    assert len(meta["train_files"]) == -(-meta["train_tokens"] // 300) > 1

    prepare.prepare("text", inputs=[folder], out=tmp_path / "t")
    assert "already prepared" in capsys.readouterr().out
    (folder / "b.txt").write_text("short now\n")  # a changed input is prepared again
    prepare.prepare("text", inputs=[folder], out=tmp_path / "t", quiet=True)
    meta = load_meta(data_dir)
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(p.read_bytes()) for p in folder.rglob("*.txt")) + 2 * 2
    stat = (folder / "b.txt").stat()
    (folder / "b.txt").write_text("shirt now\n")  # the same size, even the same time: its bytes tell
    os.utime(folder / "b.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    prepare.prepare("text", inputs=[folder], out=tmp_path / "t", quiet=True)
    assert b"shirt now" in bytes(tokens_of(data_dir, "train").astype(np.uint8))  # (bytes tokens: one per byte)
    assert sorted(p.name for p in data_dir.glob("*.bin")) == sorted(meta["train_files"] + meta["val_files"])
    assert len(meta["train_files"]) == -(-meta["train_tokens"] // 300)


def test_another_val_fraction_never_replaces_a_prepared_dataset(tmp_path):
    """Another split of the same text is another dataset (its val tokens differ): refused, the folder as it was."""
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    data_dir = prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=tmp_path / "t", quiet=True)
    before = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    with pytest.raises(ValueError, match=f"{data_dir} holds a complete dataset with val_fraction 0.1, not 0.2"):
        prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=data_dir, val_fraction=0.2, quiet=True)
    assert {p.name: p.read_bytes() for p in data_dir.iterdir()} == before


def test_a_dataset_rewritten_halfway_has_no_meta_json(tmp_path, monkeypatch):
    """meta.json marks a folder complete: it goes before the first shard is rewritten, so an interrupted
    rewrite (here: a full disk) leaves no meta.json describing shards that are gone or changed."""
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    data_dir = prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=tmp_path / "t", quiet=True)
    (tmp_path / "a.txt").write_text("other text\n" * 80)  # a changed input is prepared again

    def disk_full(path, tokens):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(prepare, "write_shard", disk_full)
    with pytest.raises(OSError):
        prepare.prepare("text", inputs=[tmp_path / "a.txt"], out=data_dir, quiet=True)
    assert not (data_dir / "meta.json").exists()


def test_text_without_text_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .txt files"):
        prepare.prepare("text", inputs=[tmp_path / "empty"], out=tmp_path / "t", quiet=True)
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(ValueError, match="hold no text"):
        prepare.prepare("text", inputs=[tmp_path / "empty"], out=tmp_path / "t", quiet=True)
    (tmp_path / "empty" / "a.txt").write_text("x")
    with pytest.raises(ValueError, match="too small to split"):
        prepare.prepare("text", inputs=[tmp_path / "empty"], out=tmp_path / "t", quiet=True)


def test_never_mixes_two_datasets_in_one_folder(tmp_path):
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "fineweb_train_000001.bin").write_bytes(fineweb_files(1)["/fineweb_train_000001.bin"])
    with pytest.raises(ValueError, match="also holds fineweb_train_000001.bin"):
        prepare.prepare("pydocs", out=tmp_path / "mixed", quiet=True)


# -----------------------------------------------------------------------------
# the command line: expected failures are one line, no traceback

def run_cli(*args):
    env = {k: v for k, v in os.environ.items() if k != prepare.URL_ENV}
    return subprocess.run([sys.executable, str(REPO / "prepare.py"), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=60)


def test_cli_prepares_pydocs(tmp_path):
    result = run_cli("--out", tmp_path / "p")
    assert result.returncode == 0, result.stderr
    assert "train has" in result.stdout and (tmp_path / "p" / "meta.json").exists()


def test_a_full_disk_is_one_line(tmp_path):
    """A write that fails (a file-size limit standing in for a full disk) while preparing, from prepare.py or from
    train.py preparing pydocs on a fresh machine (a copy of the code, so that its data/ is empty), is one line
    that says what failed and what to do, not a traceback."""
    import resource
    import signal

    def small_files():  # (SIGXFSZ ignored: a write past the limit then fails with EFBIG, as ENOSPC would)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    (tmp_path / "a.txt").write_text("some text that does not fit\n" * 2_000)
    result = subprocess.run([sys.executable, str(REPO / "prepare.py"), "text", "--input", str(tmp_path / "a.txt"), "--out",
                             str(tmp_path / "t")], capture_output=True, text=True, timeout=60, preexec_fn=small_files)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr == f"error: could not prepare text in {tmp_path / 't'} (File too large): fix that, then run " \
                            "the same command again\n"
    code = tmp_path / "code"
    code.mkdir()
    for py in REPO.glob("*.py"):
        shutil.copyfile(py, code / py.name)
    result = subprocess.run([sys.executable, str(code / "train.py"), "--max_iters=1", "--device=cpu"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert result.returncode == 1 and result.stderr == (f"error: could not prepare pydocs in {code / 'data' / 'pydocs'} "
                                                        "(File too large): free space or make it writable, then run again\n")


def test_cli_errors_are_one_line(tmp_path):
    files = fineweb_files(1)
    files["/fineweb_val_000000.bin"] = files["/fineweb_val_000000.bin"][:500]
    (tmp_path / "empty").mkdir()
    with LocalServer(files) as fineweb:
        cases = {
            "404": (["shakespeare", "--url", fineweb.url + "/nowhere", "--out", tmp_path / "a"], "HTTP 404"),
            "corrupt": (["fineweb10B", "--url", fineweb.url, "--out", tmp_path / "b"], "fineweb_val_000000.bin"),
            "empty input": (["text", "--input", tmp_path / "empty", "--out", tmp_path / "c"], "no .txt files"),
            "not a url": (["shakespeare", "--url", "not a url", "--out", tmp_path / "d"], "is not an http(s) URL (https://host/path): pass --url"),
        }
        for case, (args, expected) in cases.items():
            result = run_cli(*args)
            assert result.returncode == 1, case
            assert "Traceback" not in result.stderr, case
            last = result.stderr.strip().splitlines()[-1]
            assert last.startswith("error: ") and expected in last, (case, result.stderr)

