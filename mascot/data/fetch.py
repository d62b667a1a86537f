"""Downloading a corpus's release files, checked and resumable: what `mascot data fetch` runs.

A file is written to `<name>.partial` first and takes its own name only once it is whole and
checked, so a file with the right name is never half a download. A download that stops (network
error, a server that closes early) keeps its `.partial`; the next fetch asks the server for the rest
with an HTTP Range request and appends it. A file whose size or SHA-256 is wrong is moved aside to
`<name>.rejected` (nothing is deleted) and the error names the URL, the expected and the actual value.

What a file is checked against: the size and SHA-256 its publisher states (`mascot.data.sources`),
else those recorded in the lock file beside the data (`mascot-data.lock.json`) by the first fetch.
None of the corpora's publishers states a checksum, so the first fetch trusts what it gets and says
so; every later fetch, on this machine or on one given the same folder, must get the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from mascot.data.sources import RELEASES, ReleaseFile, corpus_folder, release_files

if TYPE_CHECKING:
    from mascot.config import CorpusConfig

LOCK_NAME = "mascot-data.lock.json"

# Called as bytes arrive: (the file being written, bytes so far, the whole size where the server says it).
ProgressCallback = Callable[[Path, int, int | None], None]


class FetchError(RuntimeError):
    """A download that failed or did not check out; the message says what to do next."""


@dataclass(frozen=True)
class Fetched:
    path: Path
    url: str
    size: int
    sha256: str
    action: str   # downloaded, resumed, verified (already there and checked) or recorded (there, now locked)
    checked_against: str   # "publisher", "lock", or "nothing yet (recorded in the lock)"


def fetch_corpus(corpus: CorpusConfig, *, on_progress: ProgressCallback | None = None,
                 timeout_s: float = 60) -> list[Fetched]:
    """Every release file of a config's local corpus entry, in the folder the entry names."""
    release = RELEASES[corpus.source]
    lock = corpus_folder(corpus) / LOCK_NAME
    fetched = []
    for file, destination in release_files(corpus):
        result = fetch_file(release.url(file), destination, lock=lock, size=file.size, sha256=file.sha256,
                            on_progress=on_progress, timeout_s=timeout_s)
        if file.unpack:
            unpack(result.path)
        fetched.append(result)
    return fetched


def fetch_file(url: str, destination: Path, *, lock: Path, size: int | None = None, sha256: str | None = None,
               on_progress: ProgressCallback | None = None, timeout_s: float = 60) -> Fetched:
    """Download `url` to `destination` (resuming its `.partial`) unless it is there; check size and SHA-256."""
    key = destination.relative_to(lock.parent).as_posix()
    locked = _read_lock(lock).get(key, {})
    expected_size = size if size is not None else locked.get("size")
    expected_sha = sha256 if sha256 is not None else locked.get("sha256")
    against = "publisher" if sha256 is not None else "lock" if expected_sha else "nothing yet (recorded in the lock)"
    if destination.exists():
        actual = _sha256(destination)
        if expected_sha is not None and actual != expected_sha:
            raise FetchError(f"{destination} is there but is not the file {url} gave before: SHA-256 expected "
                             f"{expected_sha} ({against}), actual {actual}. It is left as it is; move it away to "
                             "fetch it again")
        if expected_sha is None:
            _record(lock, key, url, destination.stat().st_size, actual)
        return Fetched(destination, url, destination.stat().st_size, actual,
                       "verified" if expected_sha else "recorded", against)

    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    resumed_from = _download(url, partial, on_progress, timeout_s)
    actual_size = partial.stat().st_size
    if expected_size is not None and actual_size != expected_size:
        _reject(partial, destination, url, "size", f"{expected_size} bytes", f"{actual_size} bytes", against)
    actual_sha = _sha256(partial)
    if expected_sha is not None and actual_sha != expected_sha:
        _reject(partial, destination, url, "SHA-256", expected_sha, actual_sha, against)
    partial.replace(destination)
    if expected_sha is None:
        _record(lock, key, url, actual_size, actual_sha)
    return Fetched(destination, url, actual_size, actual_sha, "resumed" if resumed_from else "downloaded", against)


def _download(url: str, partial: Path, on_progress: ProgressCallback | None, timeout_s: float) -> int:
    """Fill `partial` with the whole body of `url`, asking only for what it lacks; returns the bytes it had."""
    offset = partial.stat().st_size if partial.exists() else 0
    # identity: byte ranges must count the file's own bytes, not those of a compressed transfer.
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
    done, total = offset, None
    try:
        with httpx.stream("GET", url, headers=headers, timeout=timeout_s, follow_redirects=True) as response:
            if response.status_code == 416 and offset:  # nothing after the part we have: it is whole already
                return offset
            if response.status_code not in (200, 206):
                raise FetchError(f"{url}: HTTP {response.status_code} {response.reason_phrase}; nothing was saved"
                                 + (f" (the {offset} bytes in {partial} are kept)" if offset else ""))
            if response.status_code == 200:  # the server ignored the Range header: start over
                offset = done = 0
                total = _int(response.headers.get("content-length"))
            else:
                total = _int(response.headers.get("content-range", "").rpartition("/")[2])
            with open(partial, "ab" if offset else "wb") as out:
                for chunk in response.iter_raw():  # written as it arrives, so a cut keeps every byte received
                    out.write(chunk)
                    done += len(chunk)
                    if on_progress is not None:
                        on_progress(partial, done, total)
    except httpx.HTTPError as error:
        raise FetchError(f"{url}: the download stopped after {done} of {total or 'an unknown number of'} bytes "
                         f"({type(error).__name__}: {error}). The {done} bytes are kept in {partial}; run the "
                         "fetch again to download the rest") from error
    if total is not None and done != total:
        raise FetchError(f"{url}: the server sent {done} of {total} bytes. They are kept in {partial}; run the "
                         "fetch again to download the rest")
    return offset


def unpack(tarball: Path) -> None:
    """Unpack a verified tarball beside itself, writing only the members that are not there yet."""
    try:
        with tarfile.open(tarball) as archive:
            missing = [m for m in archive.getmembers() if not (tarball.parent / m.name).exists()]
            archive.extractall(tarball.parent, members=missing, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise FetchError(f"{tarball}: cannot unpack it ({error}); delete it and its lock entry in "
                         f"{tarball.parent / LOCK_NAME} to fetch it again") from error


def _reject(partial: Path, destination: Path, url: str, what: str, expected: str, actual: str, against: str):
    rejected = destination.with_name(destination.name + ".rejected")
    partial.replace(rejected)
    raise FetchError(f"{url}: {what} mismatch: expected {expected} ({against}), actual {actual}. The download is "
                     f"kept aside at {rejected}; {destination} was not written")


def _read_lock(lock: Path) -> dict[str, dict]:
    if not lock.exists():
        return {}
    try:
        return json.loads(lock.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise FetchError(f"{lock}: not a valid lock file (line {error.lineno}: {error.msg}); it records the "
                         "SHA-256 of each file fetched before") from error


def _record(lock: Path, key: str, url: str, size: int, sha256: str) -> None:
    entries = _read_lock(lock)
    entries[key] = {"url": url, "size": size, "sha256": sha256}
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _int(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


__all__ = ["LOCK_NAME", "FetchError", "Fetched", "ReleaseFile", "fetch_corpus", "fetch_file", "unpack"]
