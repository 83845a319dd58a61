"""
A file server on 127.0.0.1 for tests of download code, standard library only.

    with LocalServer({"/a.bin": b"...", "/input.txt": Path("input.txt")}) as server:
        server.cut("/a.bin", after=1000)      # next GET of /a.bin drops the connection after 1000 bytes
        download(server.url + "/a.bin", dest)
        assert server.count("/a.bin") == 2

Every file goes with an ETag of its content, as most servers send one (headers() can set another).
It honours Range requests (206 + Content-Range, 416 past the end; with If-Range, only
if it names the file's ETag now, else the whole file), answers 404 for
unknown paths, closes the connection after every response (HTTP/1.0), and records
every request as (method, path, Range header) in server.requests. Misbehaviour is set
per path: cut(), lie(), fail(), ignore_range(), corrupt(), unsized(), unversioned(); headers() and redirect()
answer like Hugging Face's resolve URLs (a 302 whose X-Linked-ETag is the file's sha256).
"""

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class LocalServer:
    def __init__(self, files=None, root=None):
        """files: {url path: bytes or Path}; root: a folder whose files are served under /."""
        self.files = dict(files or {})
        self.root = Path(root) if root else None
        self.requests = []
        self._cut = {}           # path -> bytes to send before dropping the connection (once)
        self._lie = {}           # path -> length to announce; sends at most that many bytes
        self._fail = {}          # path -> [status, times left] (times None: always)
        self._ignore_range = set()
        self._corrupt = {}       # path -> GETs left that flip the first byte (None: all)
        self._unsized = set()    # paths sent without a Content-Length
        self._unversioned = set()  # paths sent without an ETag
        self._headers = {}       # path -> extra response headers
        self._redirect = {}      # path -> where a GET of it is sent (302)
        self._lock = threading.Lock()
        self._httpd = None

    # --- misbehaviour, per path ---------------------------------------------------------
    def cut(self, path, after):
        """The next GET of path announces the full length, sends `after` bytes, then drops the connection."""
        self._cut[path] = after

    def lie(self, path, length):
        """Every GET of path announces `length` bytes (Content-Length and Content-Range) and sends at most that."""
        self._lie[path] = length

    def fail(self, path, status, times=None):
        """Answer `status` (e.g. 404, 503) to the next `times` GETs of path, or to all of them if times is None."""
        self._fail[path] = [status, times]

    def ignore_range(self, path):
        """Answer 200 with the whole file even when a Range is asked for, like some servers do."""
        self._ignore_range.add(path)

    def corrupt(self, path, times=None):
        """The next `times` GETs of path (all, if None) flip its first byte: the right length, wrong bytes."""
        self._corrupt[path] = times

    def unsized(self, path):
        """Send path with no Content-Length: its body ends where the server closes the connection (HTTP/1.0)."""
        self._unsized.add(path)

    def unversioned(self, path):
        """Send path with no ETag (nor Last-Modified, which this server never sends): nothing tells its versions apart."""
        self._unversioned.add(path)

    # --- Hugging Face's answers ---------------------------------------------------------
    def headers(self, path, headers):
        """Send these extra headers (e.g. an ETag) with every answer for path."""
        self._headers[path] = dict(headers)

    def redirect(self, path, to):
        """Answer a GET of path with 302 to the path `to` (with path's headers()), as a resolve URL does."""
        self._redirect[path] = to

    # --- inspection -------------------------------------------------------------------
    def count(self, path):
        """Number of requests for path so far."""
        return sum(1 for _, p, _ in self.requests if p == path)

    def url_for(self, path):
        return self.url + path

    # --- lifecycle --------------------------------------------------------------------
    def __enter__(self):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # a short poll interval: shutdown() waits for it, and tests start many servers
        threading.Thread(target=self._httpd.serve_forever, kwargs=dict(poll_interval=0.02), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()

    def _content(self, path):
        if path in self.files:
            data = self.files[path]
            return data.read_bytes() if isinstance(data, Path) else bytes(data)
        if self.root is not None:
            file = (self.root / path.lstrip("/")).resolve()
            if file.is_relative_to(self.root.resolve()) and file.is_file():
                return file.read_bytes()
        return None


def _handler(server):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            asked = self.headers.get("Range")
            with server._lock:
                server.requests.append(("GET", path, asked))
                failure = server._fail.get(path)
                if failure and failure[1] is not None:
                    failure[1] -= 1
                    if failure[1] < 0:
                        failure = None
                cut = server._cut.pop(path, None)
                corrupt = path in server._corrupt and server._corrupt[path] != 0
                if corrupt and server._corrupt[path] is not None:
                    server._corrupt[path] -= 1
            extra = server._headers.get(path, {})
            if failure:
                return self._empty(failure[0])
            if path in server._redirect:
                return self._empty(302, {"Location": server._redirect[path], **extra})
            data = server._content(path)
            if data is None:
                return self._empty(404)
            size = server._lie.get(path, len(data))
            if path not in server._unversioned:
                extra = {"ETag": f'"{hashlib.sha1(data).hexdigest()[:16]}"', **extra}
            same_version = self.headers.get("If-Range") in (None, extra.get("ETag"))
            ranged = bool(asked) and path not in server._ignore_range and same_version
            start, end = 0, size - 1
            if ranged:  # "bytes=N-" or "bytes=N-M"
                first, last = asked.removeprefix("bytes=").split("-", 1)
                start, end = int(first), min(int(last), size - 1) if last else size - 1
                if start >= size:
                    return self._empty(416, {"Content-Range": f"bytes */{size}"})
            if corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            body = data[start:end + 1]
            self.send_response(206 if ranged else 200)
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            for key, value in extra.items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/octet-stream")
            if path not in server._unsized:
                self.send_header("Content-Length", str(end + 1 - start))
            self.end_headers()
            self.wfile.write(body if cut is None else body[:cut])
            self.wfile.flush()
            # returning closes the connection (HTTP/1.0): a short body reads as a dropped connection

        def _empty(self, status, headers=()):
            self.send_response(status)
            for key, value in dict(headers).items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler
