"""Adapters on the serving engine (mascot.llm.served_adapters), against the chat server playing vLLM: loaded at
runtime under a name that carries their hash, checked where served by hand, and refused with what to do."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve
from served_models import ServedModels, random_adapter
from stage1_runs import REPO
from typer.testing import CliRunner

from cli.main import app
from mascot.artifacts import Artifact, path_sha256
from mascot.config import BackendConfig
from mascot.llm.served_adapters import AdapterServingError, ServedSnapshots, serve_adapter


def artifact(folder) -> Artifact:
    return Artifact(path=folder, sha256=path_sha256(folder))


def role(url: str, **fields) -> BackendConfig:
    return BackendConfig(kind="openai", base_url=f"{url}/v1", **{"model": "base", **fields})


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    """Two trainings of one role in a run's folder, and one in another run's."""
    runs = tmp_path_factory.mktemp("runs")
    return runs / "run", [artifact(random_adapter(tiny_models.lm, runs / "run" / "stage1" / "steps" / f"speaker-{seed}",
                                                  seed)) for seed in (1, 2)] + \
        [artifact(random_adapter(tiny_models.lm, runs / "other" / "stage1" / "speaker", 3))]


def test_an_adapter_is_loaded_under_its_hash_and_the_run_unloads_the_one_it_retrained(adapters):
    run, (first, second, others) = adapters
    served = ServedModels("base", allow_runtime_lora=True)
    with serve(make_app(seconds_per_token=0.0, served=served)) as url:
        config = role(url, load_adapter=True)
        other_run = serve_adapter(config, "speaker", others, run.parent / "other")
        resolved = serve_adapter(config, "speaker", first, run)
        assert resolved.model == f"speaker-{first.sha256[:8]}" and resolved.adapter_sha256 == first.sha256
        assert not resolved.load_adapter and served.modules[resolved.model].path == str(first.path.resolve())
        assert serve_adapter(config, "speaker", first, run) == resolved  # a resume: loaded already, nothing changes
        assert serve_adapter(config, "director", first, run).model == f"director-{first.sha256[:8]}"

        retrained = serve_adapter(config, "speaker", second, run)
        assert retrained.model == f"speaker-{second.sha256[:8]}"
        # The run's old Speaker is unloaded; another run's Speaker and this run's Director stay.
        assert served.unloads == [resolved.model]
        assert sorted(served.modules) == sorted([other_run.model, retrained.model, f"director-{first.sha256[:8]}"])
        assert served.loads == [other_run.model, resolved.model, f"director-{first.sha256[:8]}", retrained.model]


def test_a_server_without_runtime_loading_gets_one_error_naming_the_variable_and_the_command(adapters):
    run, (first, *_) = adapters
    with serve(make_app(seconds_per_token=0.0, served=ServedModels("Qwen/Qwen3-8B"))) as url, \
            pytest.raises(AdapterServingError) as refused:
        serve_adapter(role(url, model="Qwen/Qwen3-8B", load_adapter=True), "speaker", first, run)
    message = str(refused.value)
    assert "`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen3-8B --enable-lora`" in message
    assert f"vllm serve Qwen/Qwen3-8B --enable-lora --lora-modules speaker-{first.sha256[:8]}=" \
           f"{first.path.resolve()}" in message


def test_a_module_served_by_hand_is_checked_before_any_request_and_keyed_by_the_runs_adapter(adapters):
    run, (first, second, _) = adapters
    served = ServedModels("base")
    app = make_app(seconds_per_token=0.0, served=served)
    with serve(app) as url:
        with pytest.raises(AdapterServingError, match=r"does not serve 'speaker'.*--lora-modules speaker="):
            serve_adapter(role(url, model="speaker"), "speaker", first, run)
        served.add("speaker", first.path)
        assert serve_adapter(role(url, model="speaker"), "speaker", first, run).adapter_sha256 == first.sha256
        assert serve_adapter(role(url, model="speaker"), "speaker", second, run).adapter_sha256 == second.sha256
        # A run stopped before training its Speaker: the module must still be served, and is keyed by its name.
        assert serve_adapter(role(url, model="speaker"), "speaker", None, run) == role(url, model="speaker")
        with pytest.raises(AdapterServingError, match="does not serve 'other'"):
            serve_adapter(role(url, model="other"), "speaker", None, run)
        with pytest.raises(AdapterServingError, match="no trained speaker adapter to load"):
            serve_adapter(role(url, load_adapter=True), "speaker", None, run)
    assert app.state.stats.requests == 0


def test_an_unreachable_server_is_named(adapters):
    run, (first, *_) = adapters
    with pytest.raises(AdapterServingError, match="127.0.0.1:9/v1 is unavailable"):
        serve_adapter(BackendConfig(kind="openai", model="speaker", base_url="http://127.0.0.1:9/v1",
                                    max_retries=0), "speaker",
                      first, run)


def test_config_validate_asks_the_server_for_a_module_served_by_hand(tmp_path, adapters):
    _, (first, *_) = adapters
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    config = yaml.safe_load((tmp_path / "configs" / "tiny.yaml").read_text())
    served = ServedModels("base")
    with serve(make_app(seconds_per_token=0.0, served=served)) as url:
        config["stage2"]["speaker"] = {"kind": "openai", "model": "speaker", "base_url": f"{url}/v1"}
        path = tmp_path / "configs" / "served.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        missing = CliRunner().invoke(app, ["config", "validate", str(path)])
        assert missing.exit_code == 2, missing.output
        assert re.search(r"served\.yaml:\d+: stage2\.speaker\.model: the server at .* does not serve 'speaker' "
                         r"\(it serves: base\)", missing.output), missing.output
        assert CliRunner().invoke(app, ["config", "validate", str(path), "--no-machine-checks"]).exit_code == 0
        served.add("speaker", first.path)
        assert CliRunner().invoke(app, ["config", "validate", str(path)]).exit_code == 0
        config["eval"]["director"] = {"kind": "openai", "model": "director", "base_url": "http://127.0.0.1:9/v1"}
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        unanswered = CliRunner().invoke(app, ["config", "validate", str(path)])
        assert unanswered.exit_code == 0 and "not checked: eval.director: the server at http://127.0.0.1:9/v1 did " \
            "not answer" in " ".join(unanswered.output.split()), unanswered.output
        del config["eval"]["director"]
        config["stage2"]["speaker"]["adapter_sha256"] = first.sha256  # the flow's to set
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        written = CliRunner().invoke(app, ["config", "validate", str(path)])
    assert written.exit_code == 2 and "stage2.speaker.adapter_sha256: is set by the flow" in written.output


def test_the_chat_loads_the_runs_speaker_and_director_into_the_server_before_the_first_message(tmp_path, tiny_models):
    from chat_runs import group_run

    from mascot.artifacts import RunDir
    from mascot.chat.group import trained_roles
    from mascot.config import load_config

    root = group_run(tmp_path, tiny_models)
    run, served = RunDir(root), ServedModels("Qwen/Qwen3-8B", allow_runtime_lora=True)
    app = make_app(seconds_per_token=0.0, served=served)
    with serve(app) as url:
        server = role(url, model="Qwen/Qwen3-8B", load_adapter=True)
        config = load_config(tmp_path / "chat.yaml")
        config = config.model_copy(update={"stage2": config.stage2.model_copy(update={"speaker": server}),
                                           "eval": config.eval.model_copy(update={"director": server})})
        speaker, director = trained_roles(config, run)
    hashes = [run.recorded(name, "test").sha256[:8] for name in ("stage1/speaker", "stage2/director")]
    assert (speaker.model, director.model) == (f"speaker-{hashes[0]}", f"director-{hashes[1]}")
    assert served.loads == [speaker.model, director.model] and app.state.stats.requests == 0


def test_a_policy_in_training_holds_one_snapshot_on_the_server_named_by_its_content(adapters):
    _, (first, second, _) = adapters
    served = ServedModels("base", allow_runtime_lora=True)
    with serve(make_app(seconds_per_token=0.0, served=served)) as url:
        config = role(url, load_adapter=True)
        names = [f"director-{first.sha256[:8]}", f"director-{second.sha256[:8]}"]
        # A resumed run: the step it had reached is listed already, so it is asked for, not loaded again.
        served.add(names[0], first.path)
        snapshots = ServedSnapshots(config, "director")
        step = snapshots.backend(first.path)
        assert (step.model, step.adapter_sha256, step.load_adapter) == (names[0], first.sha256, False)
        assert snapshots.backend(first.path) is step and served.loads == []  # once per step
        # The next step's snapshot is loaded, then the one before it unloaded; the last, when training ends.
        assert snapshots.backend(second.path).model == names[1]
        assert (served.loads, served.unloads, sorted(served.modules)) == ([names[1]], [names[0]], [names[1]])
        snapshots.close()
        assert served.unloads == names and served.modules == {}
        with pytest.raises(ValueError, match="load_adapter"):
            ServedSnapshots(role(url), "director")


def test_a_server_without_runtime_loading_refuses_snapshots_with_the_variable_and_the_way_back(adapters):
    _, (first, *_) = adapters
    with serve(make_app(seconds_per_token=0.0, served=ServedModels("Qwen/Qwen3-8B"))) as url, \
            pytest.raises(AdapterServingError) as refused:
        ServedSnapshots(role(url, model="Qwen/Qwen3-8B", load_adapter=True), "director").backend(first.path)
    message = str(refused.value)
    assert "`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen3-8B --enable-lora`" in message
    assert "stage2.director's load_adapter: false" in message and "--lora-modules" not in message
