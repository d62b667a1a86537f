"""The run directory: its layout, atomic writes, content hashes and the manifest.

Steps hand each other `Artifact`s (a path and the SHA-256 of its bytes), never data frames: a
downstream step reads the file and checks the hash, and the hash is part of its cache key.

A cached step writes into `<stage>/steps/`, under a name that carries its cache key
(`keyed_path`), so no run overwrites a file that another run's cache still names. The contract's
names (`stage1/pairs.parquet`) are links to the current step outputs, updated by `RunDir.record`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.redaction import redact

PACKAGES = ("mascot", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "prefect", "polars",
            "openai", "pydantic", "wandb")


RECOMPUTE = "Rerun with --refresh (the flow's `refresh` parameter) to compute every step again."


class ArtifactChanged(ValueError):
    """A step's input is not the file its producer wrote. Pipeline steps never cause this (they write
    new files under new names); a hand edit or deletion does, and recomputing every step repairs it."""


class Artifact(BaseModel):
    """A file or folder in the run directory and the hash of its content."""

    model_config = ConfigDict(frozen=True)

    path: Path
    sha256: str

    def verified(self) -> Path:
        """The path, after checking the file is still the one that was written."""
        if not self.path.exists():
            raise self.missing()
        actual = path_sha256(self.path)
        if actual != self.sha256:
            raise ArtifactChanged(f"artifact {self.path} changed after the step that wrote it ran (sha256 "
                                  f"{actual[:12]}, expected {self.sha256[:12]}): it was edited or replaced "
                                  f"outside the pipeline. {RECOMPUTE}")
        return self.path

    def missing(self) -> ArtifactChanged:
        return ArtifactChanged(f"artifact {self.path} is missing: it was deleted after the step that wrote it "
                               f"ran. {RECOMPUTE}")

    def read_parquet(self) -> pl.DataFrame:
        return pl.read_parquet(self.verified())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def path_sha256(path: Path) -> str:
    """A file's SHA-256; for a folder, the SHA-256 of its files' relative paths and hashes."""
    if not path.is_dir():
        return file_sha256(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_sha256(data: Any) -> str:
    """Hash of JSON-able data (pydantic models are dumped first)."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it into place only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield an empty staging folder beside `path`; it replaces `path` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield staging
        if path.exists():  # a folder cannot be renamed over a folder: move the old one aside first
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(staging, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def keyed_path(out: Path, key: str) -> Path:
    """Where a cached step writes `out` (`<stage>/pairs.parquet`): `<stage>/steps/pairs-<key[:16]>.parquet`."""
    return out.parent / "steps" / f"{out.stem}-{key[:16]}{out.suffix}"


def partial_report_name(name: str, step: str) -> str:
    """The name under which a partial run's report file `name` ("stage1/report") is recorded, when the run's
    report already describes a later step (`RunDir.describes_beyond`): "stage1/partial/until-pairs/report".

    Two folders below the stage's, as a step's output is (`<stage>/steps/report-<key>/`), so one relative
    link, `STAGE_REPORT_FROM_PARTIAL`, reaches the stage's own report from either place."""
    stage, file = name.split("/", 1)
    return f"{stage}/partial/until-{step}/{file}"


STAGE_REPORT_FROM_PARTIAL = "../../report.md"


def link(path: Path, target: Path) -> None:
    """Make `path` a relative symlink to `target`, atomically; whatever was at `path` goes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.link")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    temporary.symlink_to(os.path.relpath(target, path.parent))
    if path.is_dir() and not path.is_symlink():  # a folder from an older run: no rename can replace it
        shutil.rmtree(path)
    os.replace(temporary, path)


def training_seed_name(name: str, training_seed: int) -> str:
    """The run directory's name of a trained part (`speaker`, `director`) for a training seed of
    eval.training_seeds: the name itself for seed 0, so a run trained once is laid out as before, and
    `<name>-seed<k>` beside it for the others."""
    return name if training_seed == 0 else f"{name}-seed{training_seed}"


def dir_artifact(path: Path) -> Artifact:
    return Artifact(path=path, sha256=path_sha256(path))


def write_parquet(frame: pl.DataFrame, path: Path) -> Artifact:
    with atomic_path(path) as temporary:
        frame.write_parquet(temporary)
    return Artifact(path=path, sha256=file_sha256(path))


def merge_parquet(parts: list[Artifact], out: Path) -> Artifact:
    """One parquet file of the rows of `parts`, in order (shards into the stage's table)."""
    return write_parquet(pl.concat([part.read_parquet() for part in parts], how="vertical"), out)


def write_json(data: Any, path: Path) -> Artifact:
    with atomic_path(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return Artifact(path=path, sha256=file_sha256(path))


def write_text(text: str, path: Path) -> Artifact:
    with atomic_path(path) as temporary:
        temporary.write_text(text)
    return Artifact(path=path, sha256=file_sha256(path))


class RunDir:
    """Paths of one run, as fixed by the run-directory contract in docs/architecture.md."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def path(self, stage: str, *parts: str) -> Path:
        """An artifact's path: `path("stage1", "pairs.parquet")` is `<run>/stage1/pairs.parquet`."""
        return self.root.joinpath(stage, *parts)

    def shard(self, stage: str, kind: str, index: int) -> Path:
        return self.path(stage, f"{kind}-{index:05d}.parquet")

    @property
    def prefect_results(self) -> Path:
        """Prefect's persisted task results: inside the run, so deleting a run also drops its cache."""
        return self.root / ".prefect-results"

    def contract_path(self, name: str, artifact: Artifact) -> Path:
        """Where the contract puts artifact `name` ("stage1/pairs"): `<run>/stage1/pairs.parquet`."""
        return self.root / f"{name}{artifact.path.suffix}"

    def record(self, artifacts: dict[str, Artifact]) -> None:
        """Link each artifact's contract path to it, and add its hash to the manifest (safe against
        concurrent writers)."""
        with self._locked_manifest() as manifest:
            recorded = manifest.setdefault("artifacts", {})
            for name, artifact in artifacts.items():
                if not artifact.path.exists():  # a cache hit on a file deleted by hand: no dangling link
                    raise artifact.missing()
                contract = self.contract_path(name, artifact)
                if contract != artifact.path:
                    link(contract, artifact.path)
                recorded[name] = {"path": str(contract.relative_to(self.root)), "sha256": artifact.sha256,
                                  "file": str(artifact.path.relative_to(self.root))}

    def record_report(self, stage: str, step: str, steps: tuple[str, ...],
                      written: dict[str, Artifact]) -> dict[str, Artifact]:
        """Record a report's files (`written`, by contract name) of a run of `stage` that went as far as `step`
        (one of the stage's `steps`, in order), and return them under the names they were recorded as.

        A report never replaces one that describes a later step: a partial rerun (`--until pairs` after the
        Speaker was trained) must not hide the finished report. Its files are recorded beside it instead,
        under `partial_report_name`, and the finished report stays the stage's."""
        if self.describes_beyond(stage, step, steps):
            written = {partial_report_name(name, step): artifact for name, artifact in written.items()}
            self.record(written)
            return written
        self.record(written)
        with self._locked_manifest() as manifest:
            manifest.setdefault("reports", {})[stage] = step
        return written

    def describes_beyond(self, stage: str, step: str, steps: tuple[str, ...]) -> bool:
        """Whether the stage's recorded report (`record_report`) describes a step after `step`."""
        manifest = json.loads(self.manifest.read_text()) if self.manifest.exists() else {}
        reported = manifest.get("reports", {}).get(stage)
        return reported in steps and steps.index(reported) > steps.index(step)

    def is_recorded(self, name: str) -> bool:
        """Whether a finished step recorded artifact `name` (what was trained, say), unchecked."""
        manifest = json.loads(self.manifest.read_text()) if self.manifest.exists() else {}
        return name in manifest.get("artifacts", {})

    def recorded(self, name: str, needed_by: str) -> Artifact:
        """An artifact a finished step recorded (`stage1/speaker`, say), checked against its hash."""
        manifest = json.loads(self.manifest.read_text()) if self.manifest.exists() else {}
        entry = manifest.get("artifacts", {}).get(name)
        if entry is None:
            stage = name.split("/")[0]
            raise FileNotFoundError(f"{needed_by} reads {name} of run {self.root}, which has none: run {stage} of "
                                    f"this run first (`mascot run {stage}` with the same config and run name)")
        artifact = Artifact(path=self.root / entry["file"], sha256=entry["sha256"])
        artifact.verified()
        return artifact

    def start(self, config: BaseModel, config_path: Path | None = None, *, stage: str | None = None,
              until: str | None = None) -> None:
        """Write the run's identity to the manifest: config, its hash, package versions, git commit, and
        what was asked for (`resume`: the config file, the stage and its last step), so that the same
        run can be started again from the run directory alone.

        The config is written redacted: it holds no secret by design, and should one have got
        past validation, it still does not reach the file.
        """
        with self._locked_manifest() as manifest:
            manifest.update(
                config=redact(config.model_dump(mode="json")),
                config_hash=content_sha256(config),
                config_path=str(config_path.resolve()) if config_path else None,
                packages=package_versions(),
                git_commit=git_commit(),
            )
            if stage is not None:
                manifest["resume"] = {"stage": stage, "until": until}

    def resume_request(self) -> dict[str, str]:
        """What the run's last flow was asked to do: its config file, config hash, run name, stage and last step."""
        if not self.manifest.exists():
            raise FileNotFoundError(f"{self.root} has no manifest.json: it is not a run directory, or its run "
                                    "never started")
        manifest = json.loads(self.manifest.read_text())
        if not manifest.get("resume") or not manifest.get("config_path"):
            raise ValueError(f"{self.manifest} does not say which stage ran or from which config file, so the run "
                             "cannot be resumed from it; start it again with `mascot run`")
        return {**manifest["resume"], "config_path": manifest["config_path"], "config_hash": manifest["config_hash"],
                "run_name": manifest["config"]["run"]["name"]}

    @contextlib.contextmanager
    def _locked_manifest(self) -> Iterator[dict]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".manifest.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            manifest = json.loads(self.manifest.read_text()) if self.manifest.exists() else {}
            yield manifest
            write_json(manifest, self.manifest)


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    """The commit of the checkout the code runs from, with '+dirty' when it has local changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")
