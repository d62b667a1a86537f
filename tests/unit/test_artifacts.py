"""Run-directory artifacts: atomic writes, content hashes, manifest, explicit cache keys."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import polars as pl
import pytest

from mascot.artifacts import (
    STAGE_REPORT_FROM_PARTIAL,
    Artifact,
    ArtifactChanged,
    RunDir,
    atomic_dir,
    dir_artifact,
    keyed_path,
    write_json,
    write_parquet,
    write_text,
)
from mascot.rubrics import load_rubric
from tasks.caching import artifact_cache_key


def test_write_parquet_is_atomic_and_hashed(tmp_path):
    path = tmp_path / "stage1" / "pairs.parquet"
    artifact = write_parquet(pl.DataFrame({"a": [1, 2]}), path)
    assert artifact.read_parquet()["a"].to_list() == [1, 2]
    assert write_parquet(pl.DataFrame({"a": [1, 2]}), path).sha256 == artifact.sha256  # same content, same hash

    class Killed(Exception):
        pass

    with pytest.raises(Killed), pytest.MonkeyPatch.context() as patch:
        def crash(self, target, **kwargs):
            target.write_bytes(b"half a file")
            raise Killed

        patch.setattr(pl.DataFrame, "write_parquet", crash)
        write_parquet(pl.DataFrame({"a": [3]}), path)
    assert artifact.read_parquet()["a"].to_list() == [1, 2], "the old artifact survives a failed write"
    assert [p.name for p in path.parent.iterdir()] == ["pairs.parquet"], "no temporary file is left"


def test_changed_or_missing_artifacts_are_refused(tmp_path):
    artifact = write_json({"x": 1}, tmp_path / "a.json")
    artifact.path.write_text('{"x": 2}')
    with pytest.raises(ArtifactChanged, match="changed after the step that wrote it ran.*--refresh"):
        artifact.verified()
    artifact.path.unlink()
    with pytest.raises(ArtifactChanged, match="is missing.*--refresh"):
        artifact.verified()


def test_step_outputs_are_named_by_key_and_linked_from_the_contract_names(tmp_path, tiny_config):
    run = RunDir(tmp_path / "run")
    contract = run.path("stage1", "pairs.parquet")
    first, second = keyed_path(contract, "a" * 64), keyed_path(contract, "b" * 64)
    assert first == run.path("stage1", "steps", f"pairs-{'a' * 16}.parquet")
    one = write_parquet(pl.DataFrame({"a": [1]}), first)
    two = write_parquet(pl.DataFrame({"a": [2]}), second)
    run.record({"stage1/pairs": two})
    assert run.contract_path("stage1/pairs", two) == contract
    assert contract.is_symlink() and pl.read_parquet(contract)["a"].to_list() == [2]
    run.record({"stage1/pairs": one})  # a rerun that hits the first key's cache points the name back
    assert pl.read_parquet(contract)["a"].to_list() == [1] and two.read_parquet()["a"].to_list() == [2]
    recorded = json.loads(run.manifest.read_text())["artifacts"]["stage1/pairs"]
    assert recorded == {"path": "stage1/pairs.parquet", "sha256": one.sha256, "file": f"stage1/steps/{first.name}"}

    model = run.path("stage1", "persona_rm")  # a folder left by an older layout is replaced by the link
    (model / "old").mkdir(parents=True)
    folder = keyed_path(model, "c" * 64)
    (folder / "weights").mkdir(parents=True)
    run.record({"stage1/persona_rm": dir_artifact(folder)})
    assert model.is_symlink() and (model / "weights").is_dir() and not (model / "old").exists()


def test_a_partial_rerun_reports_beside_a_report_that_went_further_never_over_it(tmp_path):
    run, steps = RunDir(tmp_path / "run"), ("pairs", "persona_rm", "speaker")
    contract = run.path("stage1", "report.md")

    def report(text: str, key: str) -> dict[str, Artifact]:
        return {"stage1/report": write_text(text, keyed_path(run.path("stage1", "report"), key * 64) / "report.md")}

    first = report("pairs only", "a")  # a first run that stops at pairs has the run's report
    assert run.record_report("stage1", "pairs", steps, first) == first and contract.read_text() == "pairs only"
    run.record_report("stage1", "speaker", steps, report("the Speaker", "b"))
    assert contract.read_text() == "the Speaker"

    partial = report("pairs again", "c")  # `--until pairs` after the Speaker: beside the finished report
    recorded = run.record_report("stage1", "pairs", steps, partial)
    assert contract.read_text() == "the Speaker"
    assert recorded == {"stage1/partial/until-pairs/report": partial["stage1/report"]}
    beside = run.path("stage1", "partial", "until-pairs", "report.md")
    assert beside.read_text() == "pairs again"
    # The partial report's link reaches the stage's report from where it is linked and from its own file.
    for folder in (beside.parent, partial["stage1/report"].path.parent):
        assert (folder / STAGE_REPORT_FROM_PARTIAL).resolve() == contract.resolve()
    manifest = json.loads(run.manifest.read_text())
    assert manifest["reports"] == {"stage1": "speaker"} and "stage1/partial/until-pairs/report" in manifest["artifacts"]

    run.record_report("stage1", "speaker", steps, report("the Speaker, retrained", "d"))  # as far: it replaces
    assert contract.read_text() == "the Speaker, retrained"


def test_manifest_records_config_and_concurrent_artifacts(tmp_path, tiny_config):
    run = RunDir(tmp_path / "run")
    run.start(tiny_config)

    def record(i: int) -> None:
        run.record({f"shards/{i}": write_json({"i": i}, run.root / "shards" / f"{i}.json")})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(record, range(20)))
    manifest = json.loads(run.manifest.read_text())
    assert len(manifest["artifacts"]) == 20
    assert manifest["config"]["run"]["name"] == "tiny" and len(manifest["config_hash"]) == 64
    assert manifest["packages"]["polars"] and "git_commit" in manifest


def _key(fn, **parameters) -> str:
    return artifact_cache_key(SimpleNamespace(task=SimpleNamespace(name="judge", fn=fn)), parameters)


def test_cache_key_follows_source_config_slice_and_input_hashes(tmp_path, tiny_config):
    def judge(rubric, candidates):
        return rubric, candidates

    def judge_v2(rubric, candidates):  # the same parameters, other source
        return candidates, rubric

    rubric = load_rubric(tiny_config.stage1.rubric)
    shard = Artifact(path=tmp_path / "shard.parquet", sha256="a" * 64)
    key = _key(judge, rubric=rubric, candidates=shard)
    assert key == _key(judge, rubric=load_rubric(tiny_config.stage1.rubric), candidates=shard)
    changed = rubric.model_copy(update={"name": rubric.name + " v2"})
    assert _key(judge, rubric=changed, candidates=shard) != key
    assert _key(judge, rubric=rubric, candidates=shard.model_copy(update={"sha256": "b" * 64})) != key
    assert _key(judge_v2, rubric=rubric, candidates=shard) != key


def test_a_folder_artifact_hashes_names_and_contents(tmp_path):
    out = tmp_path / "model"
    with atomic_dir(out) as staging:
        (staging / "config.json").write_text("{}")
        (staging / "weights").mkdir()
        (staging / "weights" / "a.bin").write_bytes(b"\x00\x01")
    artifact = dir_artifact(out)
    assert artifact.verified() == out
    (out / "weights" / "a.bin").write_bytes(b"\x00\x02")
    with pytest.raises(ArtifactChanged, match="changed after the step that wrote it ran"):
        artifact.verified()
    (out / "weights" / "a.bin").write_bytes(b"\x00\x01")
    (out / "weights" / "a.bin").rename(out / "weights" / "b.bin")  # same bytes, other name
    with pytest.raises(ArtifactChanged, match="changed after the step that wrote it ran"):
        artifact.verified()


def test_atomic_dir_replaces_a_folder_whole_or_not_at_all(tmp_path):
    out = tmp_path / "adapter"
    with atomic_dir(out) as staging:
        (staging / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(out) as staging:
        (staging / "new.txt").write_text("new")
        raise RuntimeError("killed mid-write")
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    with atomic_dir(out) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"], "no staging or old folders are left behind"
