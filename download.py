"""
Download one file so that an interrupted or broken transfer never looks like a finished one.

    download(url, dest)  ->  dest

The bytes stream into dest + ".part" with a progress line on stderr. A dropped
connection is resumed with an HTTP Range request (or restarted, if the server ignores
Range), asked If-Range the file is still the one the part began (by the ETag or
Last-Modified it came with, kept in dest + ".part.validator"): a file changed on the
server in between is fetched whole, never stitched from two versions. A file sent with
neither (nothing could tell its versions apart) is fetched whole on every attempt. Timeouts,
dropped connections and 5xx answers are retried with exponential
backoff; 4xx answers fail at once, and so does a URL that is not http(s). Only when the file has the length the server
announced is it renamed (durably: common.durable_replace) to dest; a body sent with no length (no
Content-Length, not chunked: its end is the connection's close) is refused, since a dropped connection
would look the same, unless a published sha256 (or the caller's expected_size) vouches for its bytes. Where the server
publishes the file's sha256 (Hugging Face does, for GPT-2's weights and the FineWeb
shards), the bytes must match it too, or they are fetched again; the verified hash is
kept in dest + ".sha256" (sha256sum's format), and a rerun that finds dest checks it
against that record, fetching it again if it no longer matches. Every expected failure
is a DownloadError with a one-line message that says what to do.
"""

import hashlib
import re
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from common import durable_replace, write_atomic

CHUNK_BYTES = 1 << 16  # a read cut short by a dropped connection is lost, so keep reads small


class DownloadError(RuntimeError):
    """A download that cannot succeed by retrying now; the message says what to do."""


class _Retry(Exception):
    """A failure worth another attempt: a dropped connection, a timeout, a 5xx."""


class _Refused(Exception):
    """A failure no attempt will change: the server refused the request (a 4xx)."""


class _NotAnURL(Exception):
    """requests cannot even send the request: the URL has no scheme, another scheme than http(s), or no host."""


def _content_range(value):
    # "bytes 100-199/200" -> (100, 200); the total may be "*" (unknown) -> (100, None); a 416 names
    # no range, only the length: "bytes */200" -> (None, 200)
    try:
        unit, spec = value.split(" ", 1)
        span, total = spec.split("/", 1)
        return (None if span == "*" else int(span.split("-", 1)[0])), (None if total == "*" else int(total))
    except (AttributeError, ValueError):
        return None, None


def _published_sha256(response):
    """The file's sha256 as the server published it, or None. Hugging Face's resolve URLs redirect
    with the LFS file's sha256 in X-Linked-ETag (huggingface_hub reads the file's hash there too);
    requests follows the redirect, so look through its history. A plain ETag is not trusted, even
    one of 64 hex digits: what it hashes is each server's choice (a CDN's own object hash, a
    hash of a path and a date), and a tag taken for the sha256 that is not would fail every download of the file."""
    for r in (*response.history, response):
        tag = r.headers.get("X-Linked-ETag", "").strip('"').lower()
        if re.fullmatch("[0-9a-f]{64}", tag):
            return tag
    return None


def sha256_of(path):
    """The hex sha256 of a file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_sha256(part, sha256):
    """Raise _Retry, deleting part, if its bytes do not hash to sha256: a file of the right length
    with the wrong bytes (a bad proxy, a flipped bit on disk) must not look finished."""
    if sha256_of(part) != sha256:
        _discard(part)
        raise _Retry(f"the bytes received do not match the sha256 the server published ({sha256[:12]}...)")


def _reason(exc):
    # requests wraps urllib3's error, which wraps the socket's: show the inner one without its object repr
    inner = getattr(exc.args[0], "reason", None) if exc.args else None
    return str(inner).split(": ", 1)[-1] if inner else str(exc) or type(exc).__name__


class _Progress:
    """A one-line progress report on stderr: redrawn in a terminal, a line every 10 s in a log."""

    def __init__(self, desc, done, total, quiet):
        self.desc, self.done, self.total, self.quiet = desc, done, total, quiet
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.time()
        self.start_bytes = done

    def update(self, n):
        self.done += n
        now = time.time()
        if not self.quiet and now - self.last >= (0.2 if self.tty else 10.0):
            self.last = now
            self._show(end="\r" if self.tty else "\n")

    def close(self):
        if not self.quiet:
            self._show(end="\n")

    def _show(self, end):
        mb = self.done / 1e6
        rate = (self.done - self.start_bytes) / 1e6 / max(time.time() - self.start, 1e-6)
        if self.total:
            text = f"{self.desc}: {mb:,.1f}/{self.total / 1e6:,.1f} MB ({100 * self.done / self.total:.0f}%), {rate:.1f} MB/s"
        else:
            text = f"{self.desc}: {mb:,.1f} MB, {rate:.1f} MB/s"
        print(text.ljust(79) if end == "\r" else text, end=end, file=sys.stderr, flush=True)  # pad over a longer line


def _validator_file(part):
    return part.with_name(part.name + ".validator")


def _discard(part):
    """Delete a part and the validator that names its version: neither means anything without the other."""
    part.unlink(missing_ok=True)
    _validator_file(part).unlink(missing_ok=True)


def _validator(response):
    """What identifies this version of the file for If-Range: a strong ETag, else Last-Modified, else None
    (a weak ETag, W/"...", may not be used for ranges)."""
    etag = response.headers.get("ETag")
    return etag if etag and not etag.startswith("W/") else response.headers.get("Last-Modified")


def _attempt(url, part, timeout, desc, quiet):
    """One GET that appends to part (resuming it if it has bytes); raises _Retry if part is not complete
    after it. Returns (the sha256 the server published for the file or None, whether the server said
    where the body ends: a length, or chunks, which urllib3 checks arrive whole)."""
    import requests  # here, not at the top: every train.py start imports this module, and 0.2 s of it was requests
    import urllib3
    have = part.stat().st_size if part.exists() else 0
    validator = _validator_file(part)
    if have and not validator.exists():  # nothing names the version the part holds: its rest may be another's
        _discard(part)
        have = 0
    # identity: a gzip-encoded body would not match Content-Length, nor resume by byte offset
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        if validator.exists():  # the rest of this very version, or (a 200) the whole file as it is now
            headers["If-Range"] = validator.read_text()
    answered, total, sized = False, None, True
    try:
        with requests.get(url, headers=headers, stream=True, timeout=timeout) as r:
            answered = True
            sha256 = _published_sha256(r)
            if r.status_code == 416:  # nothing left after `have`: either part is complete, or it is wrong
                _, total = _content_range(r.headers.get("Content-Range", ""))
                if total == have:
                    return sha256, True
                _discard(part)
                raise _Retry(f"the server rejected resuming at byte {have:,}; starting over")
            if r.status_code == 429 or r.status_code >= 500:
                raise _Retry(f"HTTP {r.status_code} {r.reason}")
            if r.status_code >= 400:
                raise _Refused(f"HTTP {r.status_code} {r.reason} for {url}: check the address")
            if r.status_code == 206:
                start, total = _content_range(r.headers.get("Content-Range"))
                if start != have:
                    _discard(part)
                    raise _Retry(f"the server resumed at byte {start} instead of {have:,}; starting over")
                mode = "ab"
            else:  # 200: the whole file, whether or not we asked for a range (or for the version we had)
                have, mode = 0, "wb"
                length = r.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                sized = total is not None or "chunked" in r.headers.get("Transfer-Encoding", "").lower()
                version = _validator(r)
                if version:
                    write_atomic(validator, lambda f: f.write(version.encode()))
                else:
                    validator.unlink(missing_ok=True)
            progress = _Progress(desc, have, total, quiet)
            with open(part, mode) as f:
                for chunk in r.iter_content(CHUNK_BYTES):
                    f.write(chunk)
                    progress.update(len(chunk))
            progress.close()
    except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as e:
        # a cut mid-body lands here too: urllib3 checks that it got the length it was promised
        if answered:
            size = part.stat().st_size if part.exists() else 0
            of = f" of the {total:,} announced" if total else ""
            raise _Retry(f"the connection dropped after {size:,}{of} bytes") from None
        raise _Retry(f"cannot reach host {urlsplit(url).netloc} ({_reason(e)})") from None
    except requests.exceptions.Timeout:
        raise _Retry(f"no answer from {urlsplit(url).netloc} within {timeout} s") from None
    except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema, requests.exceptions.InvalidURL,
            urllib3.exceptions.LocationValueError):  # (urllib3's: a host it cannot parse, such as a..b)
        raise _NotAnURL() from None
    except requests.exceptions.TooManyRedirects:  # a loop: asking again loops again
        raise _Refused(f"{url} redirects too many times (a redirect loop?): check the address") from None
    except requests.exceptions.RequestException as e:
        raise _Retry(f"{type(e).__name__}: {_reason(e)}") from None
    size = part.stat().st_size
    if total is not None and size < total:
        raise _Retry(f"the server announced {total:,} bytes but sent {size:,}")
    if total is not None and size > total:
        _discard(part)
        raise _Retry(f"received {size:,} bytes, more than the {total:,} announced; starting over")
    return sha256, sized


def download(url, dest, *, desc=None, timeout=30.0, retries=4, backoff=1.0, expected_size=None, quiet=False,
             mirror="pass --url for a mirror"):
    """
    Fetch url into dest (a path). An existing dest is reused without a request: if dest + ".sha256"
    records the hash it was verified against, dest must still hash to it or it is fetched again;
    without a record the caller validates its content.
    retries: attempts after the first, for a failed transfer or bytes that do not match the
    published sha256; retry k (1, 2, ..) first waits backoff * 2**(k-1) seconds.
    expected_size: if given, the final byte count must match it.
    mirror: how the caller's user downloads from elsewhere, for the errors (prepare.py's --url by default).
    Returns dest as a Path; raises DownloadError with a one-line message.
    """
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    record = dest.with_name(dest.name + ".sha256")
    desc = desc or dest.name
    if dest.exists():
        if not record.exists():
            return dest
        recorded = record.read_text().split(" ", 1)[0]
        if sha256_of(dest) == recorded:
            return dest
        # a flipped bit on disk, or a file replaced by hand: the record says these are not the bytes fetched
        if not quiet:
            print(f"{desc}: {dest} does not match the sha256 it was downloaded with ({recorded[:12]}...); "
                  "downloading it again", file=sys.stderr)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    problem = None  # why the last attempt failed
    sha256 = None  # the file's hash, if the server published one
    for attempt in range(retries + 1):
        if attempt:
            delay = backoff * 2 ** (attempt - 1)
            if not quiet:
                print(f"{desc}: {problem}; retrying in {delay:g} s ({attempt}/{retries})", file=sys.stderr)
            time.sleep(delay)
        try:
            published, sized = _attempt(url, part, timeout, desc, quiet)
            sha256 = published or sha256
            if sha256:
                _check_sha256(part, sha256)
            elif not sized and expected_size is None:  # a connection dropped partway ends such a body as its last byte does
                _discard(part)
                raise DownloadError(f"{url} was sent with no length (no Content-Length, not chunked), so a dropped "
                                    f"connection cannot be told from its end: use a server that sends its length, or {mirror}")
            break
        except _Retry as e:
            problem = str(e)
        except _Refused as e:
            raise DownloadError(f"{e}, or {mirror}") from None
        except _NotAnURL:  # the defaults are sound URLs: this one came from where mirror says a mirror goes
            raise DownloadError(f"{url!r} is not an http(s) URL (https://host/path): {mirror}") from None
    else:
        hint = "run again to resume" if part.exists() else "check your network"
        attempts = f"{retries + 1} attempt" + ("s" if retries else "")
        raise DownloadError(f"download of {url} failed after {attempts}: {problem}; {hint}, or {mirror}")
    size = part.stat().st_size
    if expected_size is not None and size != expected_size:
        _discard(part)
        raise DownloadError(f"{url} has {size:,} bytes, expected {expected_size:,}: the file on the server differs; {mirror}")
    # the record first: whenever dest exists, a .sha256 next to it is dest's own
    if sha256:
        write_atomic(record, lambda f: f.write(f"{sha256}  {dest.name}\n".encode()))
    else:
        record.unlink(missing_ok=True)
    durable_replace(part, dest)
    _validator_file(part).unlink(missing_ok=True)
    return dest
