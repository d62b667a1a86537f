"""`mascot data fetch` against a loopback HTTP server serving tiny files in each corpus's release format.

The files are the project's own samples (mascot/data/samples, written for the tests, no corpus text):
the Empathetic Dialogues CSVs packed as the release tarball, QMSum's jsonl as its ALL/jsonl files,
and ESConv.json. The publishers' URLs are replaced by MASCOT_DATA_URL_<SOURCE>; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from loopback_servers import free_port, serve_files
from typer.testing import CliRunner

from cli.main import app
from mascot.config import load_config
from mascot.data import SAMPLES_DIR, load_corpus
from mascot.data.fetch import LOCK_NAME, FetchError, fetch_file

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
ESCONV = "/esconv/ESConv.json"


def _ed_tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in ("train.csv", "valid.csv", "test.csv"):
            archive.add(SAMPLES_DIR / "empathetic_dialogues" / name, arcname=f"empatheticdialogues/{name}")
    return buffer.getvalue()


FILES = {
    "/ed/empatheticdialogues.tar.gz": _ed_tarball(),
    ESCONV: (SAMPLES_DIR / "esconv" / "ESConv.json").read_bytes(),
    **{f"/qmsum/{split}.jsonl": (SAMPLES_DIR / "qmsum" / "Product" / "jsonl" / f"{split}.jsonl").read_bytes()
       for split in ("train", "val", "test")},
}


@pytest.fixture
def server(monkeypatch):
    with serve_files(FILES) as served:
        for source, folder in (("EMPATHETIC_DIALOGUES", "ed"), ("ESCONV", "esconv"), ("QMSUM", "qmsum")):
            monkeypatch.setenv(f"MASCOT_DATA_URL_{source}", f"{served.url}/{folder}")
        yield served


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path / "configs"


def _fetch(config: Path):
    return runner.invoke(app, ["data", "fetch", "--config", str(config)])


def _esconv(configs: Path) -> Path:
    return configs.parent / "data" / "esconv" / "ESConv.json"


def test_fetch_downloads_the_paper_profiles_corpora_which_then_load_and_validate(server, configs):
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 0, result.output
    data = configs.parent / "data"
    assert (data / "empathetic_dialogues" / "empatheticdialogues" / "train.csv").read_bytes() == \
        (SAMPLES_DIR / "empathetic_dialogues" / "train.csv").read_bytes()
    assert _esconv(configs).read_bytes() == FILES[ESCONV]
    # No publisher publishes a checksum: the first download's SHA-256 is recorded beside the data.
    lock = json.loads((data / "esconv" / LOCK_NAME).read_text())
    assert lock["ESConv.json"]["sha256"] == hashlib.sha256(FILES[ESCONV]).hexdigest()
    assert lock["ESConv.json"]["size"] == len(FILES[ESCONV]) and lock["ESConv.json"]["url"] == server.url + ESCONV
    assert "recorded in the lock" in result.output

    config = load_config(configs / "paper.yaml")  # the corpora are there now, so the config is whole
    train, held_out = load_corpus(config.data.corpus), load_corpus(config.data.held_out[0])
    assert train and all(c.source == "empathetic_dialogues" for c in train)
    assert held_out and all(c.source == "esconv" for c in held_out)
    validated = runner.invoke(app, ["config", "validate", str(configs / "paper.yaml"), "--no-machine-checks"])
    assert validated.exit_code == 0, validated.output

    sent = dict(server.sent)
    again = _fetch(configs / "paper.yaml")  # a second fetch checks what is there against the lock, downloads nothing
    assert again.exit_code == 0, again.output
    assert server.sent == sent and again.output.count("verified") == 2, again.output


def test_fetch_downloads_qmsum_for_the_meetings_profile(server, configs):
    result = _fetch(configs / "paper_meetings.yaml")
    assert result.exit_code == 0, result.output
    # The corpus and the held-out entry name the same folder: each file is downloaded once.
    assert [server.sent.get(f"/qmsum/{s}.jsonl") for s in ("train", "val", "test")] == \
        [len(FILES[f"/qmsum/{s}.jsonl"]) for s in ("train", "val", "test")]
    config = load_config(configs / "paper_meetings.yaml")
    assert load_corpus(config.data.corpus) and load_corpus(config.data.held_out[0])


def test_a_partial_download_is_resumed_asking_only_for_the_rest(server, configs):
    target = _esconv(configs)
    target.parent.mkdir(parents=True)
    have = 1000
    target.with_name("ESConv.json.partial").write_bytes(FILES[ESCONV][:have])
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 0, result.output
    assert (ESCONV, f"bytes={have}-") in server.ranges
    assert server.sent[ESCONV] == len(FILES[ESCONV]) - have, "the server sent only the bytes the part lacked"
    assert target.read_bytes() == FILES[ESCONV] and "resumed" in result.output
    assert not target.with_name("ESConv.json.partial").exists()


def test_a_truncated_download_keeps_its_part_and_the_next_fetch_finishes_it(server, configs):
    server.cut_after[ESCONV] = 4000
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert server.url + ESCONV in message and f"after 4000 of {len(FILES[ESCONV])} bytes" in message, message
    assert "run the fetch again" in message and "Traceback" not in result.output
    partial = _esconv(configs).with_name("ESConv.json.partial")
    assert partial.read_bytes() == FILES[ESCONV][:4000] and not _esconv(configs).exists()

    del server.cut_after[ESCONV]
    sent = server.sent[ESCONV]
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 0, result.output
    assert server.sent[ESCONV] - sent == len(FILES[ESCONV]) - 4000
    assert _esconv(configs).read_bytes() == FILES[ESCONV]


def test_a_corrupted_download_is_rejected_against_the_lock_and_kept_aside(server, configs):
    assert _fetch(configs / "paper.yaml").exit_code == 0
    good = hashlib.sha256(FILES[ESCONV]).hexdigest()
    _esconv(configs).unlink()  # fetched again later, from a server that now serves other bytes
    corrupted = bytearray(FILES[ESCONV])
    corrupted[100] ^= 0xFF
    server.files[ESCONV] = bytes(corrupted)
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    actual = hashlib.sha256(corrupted).hexdigest()
    assert server.url + ESCONV in message and "SHA-256 mismatch" in message, message
    assert f"expected {good} (lock)" in message and f"actual {actual}" in message, message
    assert _esconv(configs).with_name("ESConv.json.rejected").read_bytes() == bytes(corrupted)
    assert not _esconv(configs).exists() and not _esconv(configs).with_name("ESConv.json.partial").exists()
    assert json.loads((_esconv(configs).parent / LOCK_NAME).read_text())["ESConv.json"]["sha256"] == good


def test_a_changed_file_on_disk_is_reported_and_left_as_it_is(server, configs):
    assert _fetch(configs / "paper.yaml").exit_code == 0
    _esconv(configs).write_text("[]")
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert "is not the file" in message and hashlib.sha256(b"[]").hexdigest() in message, message
    assert _esconv(configs).read_text() == "[]"


def test_a_missing_file_is_a_404_naming_the_url(server, configs):
    del server.files[ESCONV]
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert f"{server.url}{ESCONV}: HTTP 404" in message and "nothing was saved" in message, message
    assert not _esconv(configs).parent.joinpath("ESConv.json.partial").exists()


def test_an_unreachable_server_is_a_network_error_naming_the_url(configs, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}/esconv"  # a port nothing listens on
    monkeypatch.setenv("MASCOT_DATA_URL_EMPATHETIC_DIALOGUES", url)
    result = _fetch(configs / "paper.yaml")
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert f"{url}/empatheticdialogues.tar.gz: the download stopped after 0 of" in message, message
    assert "ConnectError" in message and "Traceback" not in result.output


@pytest.mark.parametrize(("known", "what"), [({"size": 5}, "size mismatch: expected 5 bytes"),
                                             ({"sha256": "0" * 64}, f"SHA-256 mismatch: expected {'0' * 64} (publisher)")])
def test_a_publishers_size_or_checksum_is_checked(server, tmp_path, known, what):
    destination = tmp_path / "ESConv.json"
    with pytest.raises(FetchError) as excinfo:
        fetch_file(server.url + ESCONV, destination, lock=tmp_path / LOCK_NAME, **known)
    assert what in str(excinfo.value) and server.url + ESCONV in str(excinfo.value)
    assert not destination.exists() and (tmp_path / "ESConv.json.rejected").exists()
    assert not (tmp_path / LOCK_NAME).exists(), "a file that failed its check is never recorded"


def test_fetch_help_explains_itself():
    result = runner.invoke(app, ["data", "fetch", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "SHA-256" in text and "resumes" in text and "MASCOT_DATA_URL_" in text
