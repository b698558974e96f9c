"""Fetch one public file over HTTP(S) into place atomically, with errors that say what to do.

Every dataset the pipeline can download goes through :func:`fetch_url`: the body is streamed into a
temporary file *in the destination folder* and renamed onto the destination only once it is
complete, so a failed or interrupted download never leaves a partial file that a later run (or
Snakemake) would trust. Failures raise :class:`DownloadError`, whose message names the dataset, the
URL and the config key that lets a user point the pipeline at a local copy instead (the usual way
out on a machine without network access).
"""

from __future__ import annotations

import http.client
import os
import socket
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

__all__ = ["DownloadError", "fetch_url"]

_CHUNK = 1 << 16
_USER_AGENT = "fedrepro-data-fetch/0.1 (+python urllib)"


class DownloadError(RuntimeError):
    """A dataset file could not be downloaded; the message says which URL and which config key to set."""


def _open_with_deadline(url: str, timeout: float):
    """``urlopen`` with ``timeout`` for every socket operation *and* as a deadline for the connect phase.

    The socket timeout does not cover name resolution, which can block much longer on a machine
    whose resolver is unreachable; the connection is therefore opened in a helper thread that the
    caller stops waiting for after ``timeout`` seconds (plus a small grace period).
    """
    result: dict = {}

    def worker() -> None:
        try:
            req = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
            result["resp"] = urllib.request.urlopen(req, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            result["exc"] = exc

    t = threading.Thread(target=worker, name="fedrepro-fetch-connect", daemon=True)
    t.start()
    t.join(timeout + 1.0)
    if t.is_alive():
        raise TimeoutError(f"no connection within {timeout:g} s")
    if "exc" in result:
        raise result["exc"]
    return result["resp"]


def fetch_url(
    url: str, dest: str | os.PathLike, timeout: float, config_key: str, dataset: str
) -> Path:
    """Download ``url`` to ``dest`` atomically and return ``dest``.

    Parameters
    ----------
    url:
        ``http(s)://`` address of the file.
    dest:
        Destination file. Its folder is created if needed; the body is written to a temporary file
        beside it and renamed onto ``dest`` only after the whole body (as many bytes as the server's
        ``Content-Length`` announced, when it sent one) has arrived.
    timeout:
        Seconds allowed for connecting and for each read; offline, the call fails within about this
        time.
    config_key:
        The config key that lets the user use a local copy instead (named in the error message).
    dataset:
        Human-readable dataset name for the error message.

    Raises
    ------
    DownloadError
        On any network, HTTP or file-system failure. No partial file is left behind, and a folder
        that this call created is removed again if it is still empty.
    """
    dest = Path(dest)
    if not url.startswith(("https://", "http://")):
        raise DownloadError(
            f"{dataset}: refusing to fetch {url!r}: only http(s) URLs are supported"
        )
    created: list[Path] = []
    parent = dest.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    tmp: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        tmp = Path(tmp_name)
        with os.fdopen(fd, "wb") as fh:
            with _open_with_deadline(url, timeout) as resp:
                status = getattr(resp, "status", 200)
                if status != 200:
                    raise urllib.error.HTTPError(
                        url, status, f"unexpected HTTP status {status}", resp.headers, None
                    )
                expected = resp.headers.get("Content-Length")
                got = 0
                while True:
                    chunk = resp.read(_CHUNK)
                    if not chunk:
                        break
                    fh.write(chunk)
                    got += len(chunk)
                if expected is not None and expected.isdigit() and got != int(expected):
                    raise OSError(f"connection closed after {got} of {expected} bytes")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        tmp = None
        return dest
    except (
        urllib.error.URLError,
        http.client.HTTPException,
        OSError,
        TimeoutError,
        ValueError,
    ) as exc:
        reason = (
            exc.reason
            if isinstance(exc, urllib.error.URLError)
            and not isinstance(exc, urllib.error.HTTPError)
            else exc
        )
        raise DownloadError(
            f"{dataset}: could not download {url} ({type(exc).__name__}: {reason}). "
            f"If this machine has no internet access, fetch the file elsewhere and set the config key "
            f"`{config_key}` to the folder holding your local copy."
        ) from exc
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
        for folder in created:  # innermost first
            try:
                if folder.exists() and not dest.exists():
                    folder.rmdir()
            except OSError:
                break


def check_reachable(url: str, timeout: float) -> None:
    """Connect to ``url``'s host within ``timeout`` seconds (name resolution included) or raise.

    The hub client retries a failed connection for ~20 s; this check makes an offline machine fail
    within ``timeout`` instead.
    """
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    proxy = urllib.request.getproxies().get(parsed.scheme)
    if proxy and not urllib.request.proxy_bypass(host):  # the client will go through the proxy
        parsed = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    result: dict[str, BaseException] = {}

    def worker() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            result["exc"] = exc

    thread = threading.Thread(target=worker, name="fedrepro-reachable", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    if thread.is_alive():
        raise TimeoutError(f"no connection to {host}:{port} within {timeout:g} s")
    if "exc" in result:
        raise OSError(f"cannot reach {host}:{port} ({result['exc']})") from result["exc"]
