"""Where each corpus comes from: its publisher's files, and how a config's corpus entry is read.

`mascot data fetch` downloads the files below into the folder a config names; `mascot config
validate` prints `corpus_route` for each corpus, so a user sees before a run whether a corpus is read
from release files on disk or from the Hugging Face Hub's parquet conversion.

No publisher of these three corpora publishes a size or a checksum, so `size` and `sha256` are None:
the first download's SHA-256 is then recorded in a lock file beside the data (`mascot.data.fetch`)
and every later fetch is checked against it. Fill them in here if a publisher ever publishes them.
A base URL can be replaced by the environment variable `MASCOT_DATA_URL_<SOURCE>` (a mirror, or a
test's loopback server); the file names and their checks stay the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mascot.config import CorpusConfig

# The hub's parquet conversion of a dataset: a branch the hub writes for every dataset it can show,
# script-based ones included, which datasets >= 4 reads because it is plain parquet.
HUB_PARQUET_REVISION = "refs/convert/parquet"


@dataclass(frozen=True)
class ReleaseFile:
    """One file of a corpus release: its name at the base URL, where it goes under the corpus folder."""

    name: str
    folder: str = "."             # below the corpus folder; the loader looks there
    size: int | None = None       # bytes, where the publisher states them
    sha256: str | None = None     # where the publisher publishes one
    unpack: bool = False          # a tarball that is unpacked into `folder` once verified


@dataclass(frozen=True)
class CorpusRelease:
    source: str
    base_url: str
    files: tuple[ReleaseFile, ...]
    license: str

    @property
    def url_variable(self) -> str:
        return f"MASCOT_DATA_URL_{self.source.upper()}"

    def base(self) -> str:
        """The base URL, from the environment variable where it is set."""
        base = os.environ.get(self.url_variable) or self.base_url
        return base if base.endswith("/") else base + "/"

    def url(self, file: ReleaseFile) -> str:
        return self.base() + file.name


RELEASES: dict[str, CorpusRelease] = {
    "empathetic_dialogues": CorpusRelease(
        source="empathetic_dialogues",
        # The tarball the corpus's authors publish (and the hub's loading script downloads).
        base_url="https://dl.fbaipublicfiles.com/parlai/empatheticdialogues/",
        files=(ReleaseFile("empatheticdialogues.tar.gz", unpack=True),),
        license="CC BY-NC 4.0",
    ),
    "qmsum": CorpusRelease(
        source="qmsum",
        base_url="https://raw.githubusercontent.com/Yale-LILY/QMSum/main/data/ALL/jsonl/",
        files=tuple(ReleaseFile(f"{split}.jsonl", folder="ALL/jsonl") for split in ("train", "val", "test")),
        license="MIT",
    ),
    "esconv": CorpusRelease(
        source="esconv",
        base_url="https://raw.githubusercontent.com/thu-coai/Emotional-Support-Conversation/main/",
        files=(ReleaseFile("ESConv.json"),),
        license="CC BY-NC 4.0",
    ),
}


def corpus_folder(corpus: CorpusConfig) -> Path:
    """The folder a fetch fills for a corpus entry with a `path`: the path, or its folder for ESConv's file."""
    assert corpus.path is not None
    if corpus.source == "esconv" and corpus.path.suffix == ".json":
        return corpus.path.parent
    return corpus.path


def release_files(corpus: CorpusConfig) -> list[tuple[ReleaseFile, Path]]:
    """Each release file of a local corpus entry with the path it is saved at."""
    folder = corpus_folder(corpus)
    if corpus.source == "esconv" and corpus.path is not None and corpus.path.suffix == ".json":
        return [(RELEASES["esconv"].files[0], corpus.path)]  # the config names the file itself
    return [(file, folder / file.folder / file.name) for file in RELEASES[corpus.source].files]


def corpus_route(corpus: CorpusConfig) -> str:
    """One line: how the run reads this corpus entry."""
    if corpus.hub_name is not None:
        return (f"{corpus.source} {corpus.split}: the Hugging Face Hub's parquet conversion of {corpus.hub_name} "
                f"(revision {HUB_PARQUET_REVISION}), read by datasets")
    release = RELEASES[corpus.source]
    return (f"{corpus.source} {corpus.split}: release files at {corpus.path}, read by the release-format loader "
            f"(`mascot data fetch` downloads {', '.join(f.name for f in release.files)})")
