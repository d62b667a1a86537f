"""`mascot plan`'s evaluation counts against the requests a real evaluation makes (issue 35, item 7).

configs/paper.yaml, every role and judge of its evaluation served by one loopback server that speaks OpenAI's wire
format (tests/chat_server.py) under a model name of its own, and the counts made small: 4 contexts of the package's
Empathetic Dialogues sample (1 held out) and 1 of its ESConv sample, the paper's 3 seeds, 3 blocks of 3 turns and
all ten systems. The evaluation's library steps play and judge them as flows/evaluate.py does, and the server counts
what it was asked, by model. The server's structured replies are valid, so every directive and judgment is asked
once (the plan's "at least"), and its replies never carry CoT's marker, so every CoT turn is sampled
`cot_attempts` times (the plan's "at most"): here both bounds are exact.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve

from mascot import plan
from mascot.artifacts import merge_parquet
from mascot.config import RunConfig
from mascot.data.contexts import write_contexts
from mascot.evaluation import conversations, pairwise, scoring
from mascot.evaluation.systems import Components, FewShotExample, system_setup
from mascot.judges.panel import PanelSpec
from mascot.roster import load_roster, load_user_profiles
from mascot.rubrics import load_rubric
from mascot.yamlio import YamlDocument, validate_document

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ROLES = {("generation",): "base-speaker", ("stage2", "director"): "base-director",
         ("stage2", "speaker"): "trained-speaker", ("stage2", "user"): "simulated-user",
         ("eval", "director"): "trained-director"}


def loopback_paper_config(tmp_path: Path, url: str) -> Path:
    """configs/paper.yaml with its evaluation's roles and judges on the loopback server, each under its own model
    name (the persona-level and collective panels apart), and small counts."""
    text = (REPO / "configs" / "paper.yaml").read_text()
    for folder in ("rosters/", "rubrics/", "users/"):
        text = text.replace(f" {folder}", f" {REPO}/configs/{folder}")
    config = yaml.safe_load(text)
    config["run"]["output_dir"] = str(tmp_path / "runs")
    config["data"]["corpus"] = {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 4}
    config["data"]["held_out"] = [{"source": "esconv", "path": "samples:esconv/ESConv.json", "split": "test",
                                   "limit": 1}]
    config["data"]["held_out_fraction"] = 0.25
    v1 = f"{url}/v1"
    for path, model in ROLES.items():
        section = config
        for key in path:
            section = section[key]
        section.update(model=model, base_url=v1, load_adapter=False, api_key_env="VLLM_API_KEY")
        section["params"]["max_new_tokens"] = 8
    config["eval"]["sft"] = {"kind": "openai", "model": "sft-speaker", "base_url": v1, "api_key_env": "VLLM_API_KEY",
                             "params": {"max_new_tokens": 8}}
    for panel in ("judges", "group_judges"):
        for judge in config["eval"][panel]:
            judge["backend"].update(model=f"{panel}-{judge['name']}", base_url=v1, api_key_env="VLLM_API_KEY")
    config["eval"]["pairwise"]["backend"].update(model="pairwise", base_url=v1)
    path = tmp_path / "configs" / "paper-loopback.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def play_and_judge(config: RunConfig, root: Path) -> None:
    """The evaluation's conversations, judgments and preferences, by the steps flows/evaluate.py runs. Each system
    has a request cache of its own, so that no system's request is answered from another's (MASCOT-P's and
    MASCOT-C's first directive of a conversation is MASCOT's): the server sees every request asked."""
    evaluation, stage = config.eval, config.stage2
    stage1 = write_contexts(config.data, config.run.seed, root / "stage1" / "contexts.parquet")
    contexts = conversations.write_eval_contexts(config.data, stage1, config.run.seed, evaluation.out_of_domain,
                                                 root / "eval" / "contexts.parquet")
    ids = contexts.read_parquet()["context_id"].to_list()
    roster, assistant = load_roster(config.data.roster), load_roster(evaluation.assistant)
    parts = Components(base_speaker=config.generation, trained_speaker=stage.speaker, base_director=stage.director,
                       trained_director=evaluation.director, user=stage.user, sft_speaker=evaluation.sft)
    examples = [FewShotExample(context_id=f"example-{i}", message="I lost my job today.", reply="That is hard.")
                for i in range(evaluation.few_shot_examples)]
    played = []
    for name in evaluation.systems:
        setup = system_setup(name, parts, roster, assistant, load_user_profiles(config.data.users).profiles,
                             stage.episodes.block_turns, stage.episodes.max_directive_attempts, examples,
                             evaluation.self_consistency_samples,
                             block_tokens=stage.episodes.block_turns * stage.speaker.params.max_new_tokens,
                             cot_reasoning_tokens=evaluation.cot_reasoning_tokens,
                             cot_attempts=evaluation.cot_attempts)
        job = conversations.ConversationJob(system=setup, contexts=contexts, seeds=evaluation.seeds,
                                            blocks=evaluation.blocks, requests=root / "cache" / f"{name}.sqlite")
        played.append(conversations.play_shard(job, ids, root / "eval" / f"conversations-{name}.parquet"))
    merged = merge_parquet(played, root / "eval" / "conversations.parquet")
    job = scoring.ScoringJob(
        persona_panel=PanelSpec.load(evaluation.judges, config.stage1.rubric),
        group_panel=PanelSpec.load(evaluation.group_judges, stage.rubric, "block"), roster=roster,
        assistant=assistant, contexts=contexts, seed=config.run.seed, requests=root / "cache" / "judges.sqlite")
    scoring.judge_conversations(job, merged, root / "eval" / "judgments.parquet")
    pairwise.judge_preferences(pairwise.PairwiseJob(
        judge=evaluation.pairwise, rubric=job.group_panel.rubric, neutral_rubric=load_rubric(evaluation.neutral_rubric),
        roster=roster, assistant=assistant, contexts=contexts, seed=config.run.seed,
        requests=root / "cache" / "pairwise.sqlite"), merged, root / "eval" / "preferences.parquet")


def test_the_plans_evaluation_requests_are_the_requests_a_real_evaluation_asks(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "loopback")
    server = make_app(seconds_per_token=0.0)
    with serve(server) as url:
        path = loopback_paper_config(tmp_path, url)
        config = validate_document(YamlDocument.read(path), RunConfig, context={"base_dir": path.parent})
        play_and_judge(config, tmp_path / "run")
    counts = plan.counts(config, personas=3)
    assert (counts.held_out, counts.out_of_domain) == (1, 1)
    planned = Counter()
    for item in plan.requests(config, counts, plan.GUESSED_RATES):
        if item.stage == "eval":
            planned[item.backend.split(" @ ")[0]] += item.requests
    asked = server.state.stats.by_model
    assert dict(planned) == asked, (dict(planned), asked)
    # The count is not trivially met: (1 + 1) contexts x 3 seeds = 6 conversations a system, 4 groups of 9 turns
    # and 6 single assistants of 3, every persona-level judge on each of their 6 x 54 companion turns.
    assert asked["judges-gpt-4o"] == 6 * (4 * 9 + 6 * 3)
    assert asked["pairwise"] == 9 * 6 * 2
