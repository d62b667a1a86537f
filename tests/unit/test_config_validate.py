"""`mascot config validate` on the shipped configs and on broken configs, rosters and user files."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from mascot.config import load_config
from mascot.yamlio import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
runner = CliRunner()


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of configs/ so broken variants can sit beside the rosters they refer to."""
    shutil.copytree(CONFIGS, tmp_path / "configs")
    return tmp_path / "configs"


def _write(folder: Path, name: str, data: dict | str | bytes) -> Path:
    path = folder / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _set(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[_key(node, part)]
    last = _key(node, last)
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


def _key(node, part: str):
    """A dotted-path part as the key it is: list indices and integer mapping keys (rubric anchors) are ints."""
    return int(part) if isinstance(node, list) or (part.isdigit() and part not in node) else part


_DELETE = object()

# (case id, file that gets broken, mutation: (dotted path, value), expected fragments). Each case breaks
# one thing; the message must name the field's full YAML path, what was expected and what was found.
KEY = "sk-proj-Zx81Kd02LmQp77WvBn3"  # shaped like an API key, pasted where its variable's name belongs
BROKEN_CONFIGS = [
    # Types, ranges and unknown fields
    ("k-too-small", "tiny.yaml", ("stage1.k", 0), ["stage1.k", "greater than or equal to 2", "got 0"]),
    ("typo-field", "tiny.yaml", ("stage1.marign", 0.5), ["stage1.marign", "did you mean 'margin'"]),
    ("missing-section", "tiny.yaml", ("train", _DELETE), ["train", "missing required field"]),
    ("section-is-a-number", "tiny.yaml", ("stage1", 5), ["stage1", "expected a mapping", "got int"]),
    ("section-is-a-list", "tiny.yaml", ("tracking", ["offline"]), ["tracking", "expected a mapping", "got a list"]),
    ("number-is-a-mapping", "tiny.yaml", ("stage1.k", {"value": 8}), ["stage1.k", "valid integer", "got a mapping"]),
    ("bad-backend-kind", "tiny.yaml", ("generation.kind", "vllm"), ["generation.kind", "'openai', 'anthropic' or 'google'",
                                                                    "got 'vllm'"]),
    ("temperature-not-number", "tiny.yaml", ("generation.params.temperature", "hot"),
     ["generation.params.temperature", "valid number", "got 'hot'"]),
    ("lora-rank-text", "paper.yaml", ("train.speaker.lora.r", "sixteen"),
     ["train.speaker.lora.r", "valid integer", "got 'sixteen'"]),
    ("rm-learning-rate-zero", "tiny.yaml", ("train.persona_rm.learning_rate", 0),
     ["train.persona_rm.learning_rate", "greater than 0"]),
    ("bad-run-name", "tiny.yaml", ("run.name", "my run!"), ["run.name", "should match pattern"]),
    ("max-batch-zero", "tiny.yaml", ("generation.max_batch", 0), ["generation.max_batch", "greater than or equal to 1"]),
    ("max-batch-for-a-server", "paper.yaml", ("generation.max_batch", 8),
     ["generation.max_batch", "is for kind: transformers", "batches by itself"]),
    ("negative-seed", "tiny.yaml", ("run.seed", -1), ["run.seed", "greater than or equal to 0", "got -1"]),
    ("moving-alias-for-an-api-judge", "paper.yaml", ("stage1.judges.0.backend.model", "gpt-4o"),
     ["stage1.judges[0].backend.model", "'gpt-4o' is a moving alias", "cache keys on the name",
      "'gpt-4o-2024-08-06'"]),
    ("moving-anthropic-alias", "paper.yaml", ("eval.pairwise.backend", {"kind": "anthropic", "model": "claude-sonnet-4-5"}),
     ["eval.pairwise.backend.model", "'claude-sonnet-4-5' is a moving alias", "'claude-sonnet-4-5-20250929'"]),
    ("top-k-for-a-vendor-api", "paper.yaml", ("stage1.judges.0.backend.params.top_k", 20),
     ["stage1.judges[0].backend.params.top_k", "the openai vendor API does not take it"]),
    ("top-k-zero", "tiny.yaml", ("generation.params.top_k", 0),
     ["generation.params.top_k", "greater than or equal to 1"]),
    ("min-p-above-one", "tiny.yaml", ("train.speaker.min_p", 1.5), ["train.speaker.min_p", "less than or equal to 1"]),
    ("vllm-mode-unknown", "paper.yaml", ("train.speaker.vllm_mode", "remote"),
     ["train.speaker.vllm_mode", "'colocate' or 'server'", "got 'remote'"]),
    ("held-out-fraction-one", "tiny.yaml", ("data.held_out_fraction", 1.0),
     ["data.held_out_fraction", "less than 1", "got 1.0"]),
    ("reward-weight-typo", "paper.yaml", ("train.speaker.reward_weights.persona", 1.0),
     ["train.speaker.reward_weights.persona", "did you mean 'persona_rm'"]),
    # Quoted numbers and booleans are strings, never coerced
    ("quoted-integer", "tiny.yaml", ("stage1.k", "8"), ["stage1.k", "valid integer", "remove the quotes", "got '8'"]),
    ("quoted-float", "tiny.yaml", ("train.speaker.learning_rate", "5e-4"),
     ["train.speaker.learning_rate", "valid number", "remove the quotes", "got '5e-4'"]),
    ("quoted-boolean", "paper.yaml", ("train.speaker.use_vllm", "false"),
     ["train.speaker.use_vllm", "valid boolean", "got 'false'"]),
    ("float-for-integer", "tiny.yaml", ("stage1.shard_size", 8.0), ["stage1.shard_size", "valid integer", "got 8.0"]),
    ("boolean-for-integer", "tiny.yaml", ("train.speaker.max_steps", True),
     ["train.speaker.max_steps", "valid integer", "got True"]),
    ("path-is-a-number", "tiny.yaml", ("data.roster", 5), ["data.roster", "expected a path", "got int"]),
    ("path-is-empty", "tiny.yaml", ("data.roster", ""), ["data.roster", "empty string"]),
    # Non-finite numbers
    ("margin-infinite", "tiny.yaml", ("stage1.margin", float("inf")), ["stage1.margin", "finite number", "got inf"]),
    ("learning-rate-nan", "tiny.yaml", ("train.speaker.learning_rate", float("nan")),
     ["train.speaker.learning_rate", "finite number", "got nan"]),
    ("timeout-infinite", "paper.yaml", ("generation.timeout_s", float("inf")), ["generation.timeout_s", "finite number"]),
    # Secrets where names belong, credentials in URLs
    ("api-key-in-api-key-env", "paper.yaml", ("generation.api_key_env", KEY),
     ["generation.api_key_env", "not the key itself", "got '<redacted>'"]),
    ("hf-token-in-api-key-env", "paper.yaml", ("stage1.judges.0.backend.api_key_env", "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4"),
     ["stage1.judges[0].backend.api_key_env", "not the key itself", "got '<redacted>'"]),
    ("random-key-in-api-key-env", "paper.yaml", ("generation.api_key_env", "e3b0c44298fc1c149afbf4c8996fb924"),
     ["generation.api_key_env", "not the key itself"]),
    ("api-key-env-not-a-name", "paper.yaml", ("generation.api_key_env", "my key"),
     ["generation.api_key_env", "environment variable name"]),
    ("url-with-credentials", "paper.yaml", ("generation.base_url", "http://admin:hunter2pass@127.0.0.1:8000/v1"),
     ["generation.base_url", "must not carry credentials", "<redacted>@127.0.0.1:8000"]),
    ("url-with-key-in-query", "paper.yaml", ("stage1.judges.1.backend.base_url", "http://127.0.0.1:8001/v1?api_key=xyz"),
     ["stage1.judges[1].backend.base_url", "must not carry credentials", "api_key=<redacted>"]),
    ("url-without-scheme", "paper.yaml", ("generation.base_url", "localhost:8000/v1"),
     ["generation.base_url", "http:// or https:// URL", "got 'localhost:8000/v1'"]),
    # Model references and devices
    ("unknown-tiny-model", "tiny.yaml", ("train.speaker.model", "tiny:huge"),
     ["train.speaker.model", "unknown tiny model", "got 'tiny:huge'"]),
    ("empty-model", "tiny.yaml", ("train.persona_rm.model", ""), ["train.persona_rm.model", "at least 1 character"]),
    ("blank-model", "paper.yaml", ("generation.model", "   "), ["generation.model", "at least 1 character"]),
    ("tiny-model-on-a-server", "paper.yaml", ("generation.model", "tiny:lm"),
     ["generation.model", "needs kind: transformers", "got 'tiny:lm'"]),
    ("tiny-judge-on-a-server", "paper.yaml", ("stage1.judges.2.backend.model", "tiny:rm"),
     ["stage1.judges[2].backend.model", "needs kind: transformers"]),
    ("tiny-section-missing", "tiny.yaml", ("tiny", _DELETE), ["generation.model", "needs a 'tiny' section"]),
    ("unknown-device", "tiny.yaml", ("generation.device", "gpu"), ["generation.device", "torch device", "got 'gpu'"]),
    ("device-bad-index", "tiny.yaml", ("generation.device", "cuda:first"), ["generation.device", "torch device"]),
    ("base-url-in-process", "tiny.yaml", ("generation.base_url", "http://127.0.0.1:8000/v1"),
     ["generation.base_url", "kind: transformers runs the model in this process"]),
    ("adapter-on-a-server", "paper.yaml", ("generation.adapter", "adapters/speaker"),
     ["generation.adapter", "serve adapters with vLLM"]),
    ("load-adapter-in-process", "tiny.yaml", ("generation.load_adapter", True),
     ["generation.load_adapter", "kind: transformers cannot load one"]),
    ("adapter-hash-in-a-config", "paper.yaml", ("stage2.speaker.adapter_sha256", "ab" * 32),
     ["stage2.speaker.adapter_sha256", "is set by the flow from the run's adapter"]),
    # Rules across fields and files
    ("bf16-on-a-cpu-run", "tiny.yaml", ("train.speaker.bf16", True), ["train.speaker.bf16", "use_cpu is true"]),
    ("margin-beyond-the-scale", "tiny.yaml", ("stage1.margin", 4.5),
     ["stage1.margin", "scores of rubric", "run from 1 to 5", "largest gap is 4", "got 4.5"]),
    ("reward-weights-all-zero", "tiny.yaml", ("train.speaker.reward_weights", {"persona_rm": 0, "format": 0,
                                                                              "conciseness": 0}),
     ["train.speaker.reward_weights", "every reward weight is 0"]),
    ("reward-weight-negative", "tiny.yaml", ("train.speaker.reward_weights.format", -0.5),
     ["train.speaker.reward_weights.format", "greater than or equal to 0", "got -0.5"]),
    ("held-out-is-the-training-corpus", "tiny.yaml",
     ("data.held_out", [{"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "split": "train"}]),
     ["data.held_out[0]", "is the training corpus"]),
    ("path-and-hub", "tiny.yaml", ("data.corpus.hub_name", "facebook/empathetic_dialogues"),
     ["data.corpus.hub_name", "exactly one of 'path'"]),
    ("corpus-wrong-domain", "tiny.yaml", ("data.corpus.source", "qmsum"),
     ["data.corpus.source", "belongs to domain 'meetings'"]),
    ("held-out-wrong-domain", "tiny.yaml", ("data.held_out.0.source", "qmsum"),
     ["data.held_out[0].source", "belongs to domain 'meetings'"]),
    ("heads-do-not-divide", "tiny.yaml", ("tiny.num_attention_heads", 3),
     ["tiny.num_attention_heads", "must be divisible by num_attention_heads (3)"]),
    ("kv-heads-do-not-divide", "tiny.yaml", ("tiny.num_key_value_heads", 3),
     ["tiny.num_key_value_heads", "must be divisible by num_key_value_heads (3)"]),
    ("llm-judge-without-backend", "tiny.yaml", ("stage1.judges", [{"kind": "llm"}]),
     ["stage1.judges[0].backend", "needs 'backend'"]),
    ("heuristic-judge-with-backend", "tiny.yaml",
     ("stage1.judges", [{"kind": "heuristic", "backend": {"kind": "transformers", "model": "tiny:lm"}}]),
     ["stage1.judges[0].backend", "takes no 'backend'"]),
    ("duplicate-judge-names", "tiny.yaml", ("stage1.judges", [{"kind": "heuristic"}, {"kind": "heuristic"}]),
     ["stage1.judges[1]", "judge names must be unique; 'heuristic' repeats"]),
    ("no-judges", "tiny.yaml", ("stage1.judges", []), ["stage1.judges", "at least 1 item"]),
    ("grpo-groups-do-not-fit", "tiny.yaml", ("train.speaker.num_generations", 3),
     ["train.speaker.num_generations", "(8) must be divisible by num_generations (3)"]),
    ("conciseness-band-inverted", "tiny.yaml", ("train.speaker.min_words", 50),
     ["train.speaker.min_words", "min_words (50) must not exceed max_words (40)"]),
    ("rubric-wrong-domain", "tiny.yaml", ("stage1.rubric", "rubrics/meetings.yaml"),
     ["stage1.rubric", "rubric", "is for 'meetings'"]),
    ("roster-wrong-domain", "tiny.yaml", ("data.roster", "rosters/meetings.yaml"),
     ["data.roster", "is for 'meetings'", "data.domain is 'emotional_support'"]),
    # Files a config points at: reported at the config line that names them
    ("corpus-not-downloaded", "tiny.yaml", ("data.corpus.path", "no/such/corpus"),
     ["data.corpus.path", "empathetic_dialogues corpus is not downloaded", "github.com/facebookresearch"]),
    ("roster-file-missing", "tiny.yaml", ("data.roster", "rosters/nope.yaml"), ["data.roster", "no such file", "nope.yaml"]),
    ("users-file-missing", "tiny.yaml", ("data.users", "users/nope.yaml"), ["data.users", "no such file", "nope.yaml"]),
    ("rubric-file-missing", "tiny.yaml", ("stage1.rubric", "rubrics/nope.yaml"),
     ["stage1.rubric", "no such file", "nope.yaml"]),
    # Files that load but that the run cannot use: reported at the config line that names them
    ("persona-rubric-for-the-group-judge", "tiny.yaml", ("stage2.rubric", "rubrics/emotional_support.yaml"),
     ["stage2.rubric", "judge 'heuristic' (stage2.judges[0]) cannot score rubric", "rubrics/emotional_support.yaml",
      "group heuristic judge has no formula for criteria ['emotional_expressiveness'",
      "it can score: persona_fidelity, originality"]),
    ("group-rubric-for-the-reply-judge", "tiny.yaml", ("stage1.rubric", "rubrics/group_emotional_support.yaml"),
     ["stage1.rubric", "judge 'heuristic' (stage1.judges[0]) cannot score rubric", "group_emotional_support.yaml",
      "no feature formula for criteria ['persona_fidelity'"]),
    # The evaluation's section
    ("eval-without-mascot", "tiny.yaml", ("eval.systems", ["zero_shot", "few_shot"]),
     ["eval.systems", "compares 'mascot' with the other systems"]),
    ("eval-unknown-system", "tiny.yaml", ("eval.systems", ["mascot", "gpt_5"]), ["eval.systems[1]", "'zero_shot'"]),
    ("eval-repeated-seed", "tiny.yaml", ("eval.seeds", [0, 0]), ["eval.seeds", "may appear once"]),
    ("eval-no-seed", "tiny.yaml", ("eval.seeds", []), ["eval.seeds", "at least 1 item"]),
    ("eval-no-training-run", "tiny.yaml", ("eval.training_seeds", 0),
     ["eval.training_seeds", "greater than or equal to 1", "got 0"]),
    ("eval-assistant-is-a-group", "tiny.yaml", ("eval.assistant", "rosters/emotional_support.yaml"),
     ["eval.assistant", "exactly one enabled persona", "with 3 enabled"]),
    ("eval-assistant-missing", "tiny.yaml", ("eval.assistant", "rosters/nope.yaml"),
     ["eval.assistant", "no such file", "nope.yaml"]),
    ("eval-group-rubric-for-the-reply-judge", "tiny.yaml", ("eval.rubric", "rubrics/group_emotional_support.yaml"),
     ["eval.rubric", "judge 'heuristic' (eval.judges[0]) cannot score rubric", "group_emotional_support.yaml"]),
    ("eval-llm-judge-without-backend", "tiny.yaml", ("eval.pairwise", {"kind": "llm"}),
     ["eval.pairwise.backend", "needs 'backend'"]),
    ("eval-pairwise-judge-cannot-score-its-rubric", "tiny.yaml", ("eval.group_rubric", "rubrics/emotional_support.yaml"),
     ["eval.pairwise", "the pairwise judge 'heuristic' weighs by the collective rubric",
      "(eval.group_rubric) and cannot score it: the group heuristic judge has no formula"]),
    ("eval-neutral-rubric-other-domain", "tiny.yaml", ("eval.neutral_rubric", "rubrics/outcome_meetings.yaml"),
     ["eval.neutral_rubric", "outcome_meetings.yaml is for 'meetings', but data.domain is 'emotional_support'"]),
    ("eval-neutral-rubric-unscorable", "tiny.yaml", ("eval.neutral_rubric", "rubrics/emotional_support.yaml"),
     ["eval.neutral_rubric", "the pairwise judge 'heuristic' cannot score rubric", "has no formula"]),
    ("eval-block-tokens-do-not-split", "tiny.yaml", ("eval.block_tokens", 81),
     ["eval.block_tokens", "a group's 2 companion turns per block", "must be a multiple of 2, e.g. 80"]),
    ("eval-primary-baseline-not-evaluated", "tiny.yaml", ("eval.primary", {"baseline": "mascot_dpo"}),
     ["eval.primary.baseline", "'mascot_dpo' is not a baseline of this evaluation", "multi_agent, mascot_p"]),
    ("eval-primary-baseline-unknown", "tiny.yaml", ("eval.primary", {"baseline": "gpt_5"}),
     ["eval.primary.baseline", "'multi_agent'", "got 'gpt_5'"]),
    ("eval-primary-metric-unknown", "tiny.yaml", ("eval.primary", {"metric": "warmth"}),
     ["eval.primary.metric", "'warmth' is not a criterion of rubric", "group_emotional_support.yaml",
      "'overall' or one of persona_fidelity"]),
    ("eval-primary-persona-metric-unknown", "tiny.yaml", ("eval.primary", {"level": "persona", "metric": "originality"}),
     ["eval.primary.metric", "'originality' is not a criterion of rubric", "rubrics/emotional_support.yaml"]),
    ("eval-primary-automatic-metric-unknown", "tiny.yaml", ("eval.primary", {"level": "automatic", "metric": "bleu"}),
     ["eval.primary.metric", "'bleu' is not an automatic metric", "distinct_1_per_turn"]),
    ("eval-primary-collective-against-one-voice", "tiny.yaml", ("eval.primary", {"baseline": "zero_shot",
                                                                                "level": "collective"}),
     ["eval.primary.level", "'zero_shot' is a single assistant", "compares group systems only"]),
    ("eval-primary-unknown-set", "tiny.yaml", ("eval.primary", {"eval_set": "esconv:train"}),
     ["eval.primary.eval_set", "'esconv:train' is not an evaluation set", "held_out, all, esconv:test"]),
    ("eval-adapter-is-a-file", "tiny.yaml", ("eval.speaker", {"kind": "transformers", "model": "tiny:lm",
                                                             "adapter": "tiny.yaml"}),
     ["eval.speaker.adapter", "tiny.yaml is a file; expected a PEFT adapter folder"]),
    ("rubric-is-a-folder", "tiny.yaml", ("stage1.rubric", "rubrics"), ["stage1.rubric", "rubrics is a folder; expected a file"]),
    # The chat's section
    ("chat-no-turns", "tiny.yaml", ("chat.turns", 0), ["chat.turns", "greater than or equal to 1", "got 0"]),
    ("chat-rules-missing", "tiny.yaml", ("chat.safety.rules", "rules/nope.yaml"),
     ["chat.safety.rules", "no such file", "nope.yaml"]),
    ("chat-rules-is-a-folder", "tiny.yaml", ("chat.safety.rules", "rosters"), ["chat.safety.rules", "is a folder"]),
    ("chat-rules-not-a-rules-file", "tiny.yaml", ("chat.safety.rules", "rosters/emotional_support.yaml"),
     ["chat.safety.rules", "emotional_support.yaml is not a safety-rules file the chat can use"]),
    ("chat-adapter-missing", "tiny.yaml", ("chat.speaker", {"kind": "transformers", "model": "tiny:lm",
                                                           "adapter": "runs/nope/stage1/speaker"}),
     ["chat.speaker.adapter", "runs/nope/stage1/speaker does not exist; expected a PEFT adapter folder"]),
    ("accelerate-config-missing", "tiny.yaml", ("train.speaker.accelerate_config", "accelerate/nope.yaml"),
     ["train.speaker.accelerate_config", "no such file", "nope.yaml"]),
    ("training-python-missing", "tiny.yaml", ("train.speaker.python", "/srv/nope-env/bin/python"),
     ["train.speaker.python", "no such file", "/srv/nope-env/bin/python"]),
    ("chat-classifier-threshold", "tiny.yaml", ("chat.safety.classifier", {"model": "x/y", "threshold": 2}),
     ["chat.safety.classifier.threshold", "less than or equal to 1"]),
    ("chat-speaker-typo", "tiny.yaml", ("chat.speaker", {"kind": "openai", "modle": "speaker"}),
     ["chat.speaker.modle", "did you mean 'model'"]),
]

BROKEN_TEXT = [
    ("not-utf8", b"run:\n  name: caf\xe9\n", ["not UTF-8 text"]),
    ("invalid-yaml", "run:\n  name: x\n   seed: 1\n", ["broken.yaml:3", "invalid YAML"]),
    ("duplicate-key", "run:\n  name: x\n  name: y\n", ["broken.yaml:3", "run.name", "more than once"]),
    ("empty-file", "", ["file is empty"]),
    ("top-level-list", "- a\n- b\n", ["expected a mapping at the top"]),
]

ROSTER = CONFIGS / "rosters" / "emotional_support.yaml"
BROKEN_ROSTERS = [
    ("duplicate-ids", ("personas.1.id", "anchor"), ["personas[1].id", "persona ids must be unique; 'anchor' repeats"]),
    ("missing-style-rules", ("personas.1.style_rules", _DELETE), ["personas[1].style_rules", "missing required field"]),
    ("empty-must-not", ("personas.0.must_not", []), ["personas[0].must_not", "at least 1 item"]),
    ("id-not-slug", ("personas.2.id", "The Beacon"), ["personas[2].id", "should match pattern", "got 'The Beacon'"]),
    ("blank-name", ("personas.0.name", "   "), ["personas[0].name", "at least 1 character"]),
    ("none-enabled", ("personas", [{**_yaml(ROSTER)["personas"][0], "enabled": False}]),
     ["personas", "at least one persona must be enabled"]),
    ("unknown-domain", ("domain", "therapy"), ["domain", "'emotional_support' or 'meetings'", "got 'therapy'"]),
    ("typo-in-persona", ("personas.0.descripton", "x"), ["personas[0].descripton", "did you mean 'description'"]),
    ("quoted-boolean", ("personas.1.asks_questions", "yes"), ["personas[1].asks_questions", "valid boolean", "got 'yes'"]),
]

USERS = CONFIGS / "users" / "big_five.yaml"
BROKEN_USERS = [
    ("trait-out-of-range", ("profiles.0.big_five.neuroticism", 1.5),
     ["profiles[0].big_five.neuroticism", "less than or equal to 1", "got 1.5"]),
    ("missing-trait", ("profiles.1.big_five.openness", _DELETE), ["profiles[1].big_five.openness", "missing"]),
    ("no-domains", ("profiles.2.domains", []), ["profiles[2].domains", "at least 1 item"]),
    ("quoted-trait", ("profiles.0.big_five.openness", "0.5"), ["profiles[0].big_five.openness", "remove the quotes"]),
    ("trait-nan", ("profiles.0.big_five.openness", float("nan")), ["profiles[0].big_five.openness", "finite number"]),
]


RUBRIC = CONFIGS / "rubrics" / "emotional_support.yaml"
BROKEN_RUBRICS = [
    ("anchor-missing", ("criteria.0.anchors.5", _DELETE), ["criteria[0].anchors", "one anchor for each score 1..5"]),
    ("duplicate-criterion", ("criteria.1.id", "emotional_expressiveness"),
     ["criteria[1].id", "criterion ids must be unique; 'emotional_expressiveness' repeats"]),
    ("scale-inverted", ("scale_max", 1), ["scale_max", "must be above scale_min (1)"]),
    ("criterion-id-not-slug", ("criteria.2.id", "Persona Consistency"), ["criteria[2].id", "should match pattern"]),
    ("no-criteria", ("criteria", []), ["criteria", "at least 1 item"]),
    ("quoted-scale", ("scale_max", "5"), ["scale_max", "valid integer", "got '5'"]),
]

SECRETS = (KEY, "hunter2pass", "api_key=xyz", "aB3dE6gH9jK2mN5pQ8sT1vW4", "e3b0c44298fc1c149afbf4c8996fb924")


def _check(path: Path, fragments: list[str], *args: str) -> str:
    """`config validate` exits 2, every problem is one `file:line: yaml.path: message` line (the first
    fragment is the YAML path where one is expected), and no traceback, dict dump or secret is shown.
    Returns the output."""
    result = runner.invoke(app, ["config", "validate", str(path), *args])
    assert result.exit_code == 2, result.output
    for fragment in fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"
    problems = result.output.splitlines()[1:]
    assert problems and all(re.match(r"  \S+\.yaml(:\d+)?: (\S+|<top level>): ", line) for line in problems), result.output
    assert "Traceback" not in result.output and "{'" not in result.output and "':" not in result.output
    assert not any(secret in result.output for secret in SECRETS), result.output
    return result.output


def _located(output: str, file: str, yaml_path: str) -> bool:
    return re.search(rf"{re.escape(file)}:\d+: {re.escape(yaml_path)}: ", output) is not None


def test_tiny_config_is_valid():
    result = runner.invoke(app, ["config", "validate", str(CONFIGS / "tiny.yaml")])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "K=8" in result.output


def test_paper_config_is_valid_once_its_corpora_are_downloaded(workdir):
    args = ["config", "validate", str(workdir / "paper.yaml"), "--no-machine-checks"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert _located(result.output, "paper.yaml", "data.held_out[0].path")
    assert _located(result.output, "paper.yaml", "data.corpus.path")
    assert "esconv corpus is not downloaded" in result.output and "github.com/thu-coai" in result.output
    assert "mascot data fetch --config" in result.output
    esconv = workdir.parent / "data" / "esconv" / "ESConv.json"
    esconv.parent.mkdir(parents=True)
    esconv.write_text("[]")
    (workdir.parent / "data" / "empathetic_dialogues").mkdir()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "K=8" in result.output and "r=16" in result.output and "phi-4" in result.output


def test_validate_says_for_each_corpus_whether_release_files_or_the_hubs_parquet_conversion_are_read(workdir):
    (workdir.parent / "data" / "esconv").mkdir(parents=True)
    (workdir.parent / "data" / "esconv" / "ESConv.json").write_text("[]")
    (workdir.parent / "data" / "empathetic_dialogues").mkdir()
    result = runner.invoke(app, ["config", "validate", str(workdir / "paper.yaml"), "--no-machine-checks"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the summary table wraps long values onto the lines below
    assert re.search(r"corpus empathetic_dialogues train: release files at \S+,? read by the release-format loader "
                     r"\(`mascot data fetch` downloads empatheticdialogues.tar.gz\)(, limit \d+)? held out esconv test: release "
                     r"files at \S+,? read by the release-format loader", text), text

    data = _yaml(workdir / "paper.yaml")
    data["data"]["corpus"] = {"source": "empathetic_dialogues", "hub_name": "facebook/empathetic_dialogues"}
    result = runner.invoke(app, ["config", "validate", str(_write(workdir, "hub.yaml", data)), "--no-machine-checks"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert ("corpus empathetic_dialogues train: the Hugging Face Hub's parquet conversion of "
            "facebook/empathetic_dialogues (revision refs/convert/parquet), read by datasets held out esconv") in text


def _give_paper_its_corpora(workdir: Path, data: dict) -> None:
    """Stand-ins for the paper profile's downloaded corpora (an ED folder, an ESConv file) beside the config."""
    (workdir / "esconv.json").write_text("[]")
    (workdir / "ed").mkdir(exist_ok=True)
    if "path" in data["data"]["held_out"][0]:
        data["data"]["held_out"][0]["path"] = "esconv.json"
    if "path" in data["data"]["corpus"]:
        data["data"]["corpus"]["path"] = "ed"


def test_bf16_needs_a_gpu_on_the_machine_that_validates(workdir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    data = _yaml(workdir / "paper.yaml")
    _give_paper_its_corpora(workdir, data)
    path = _write(workdir, "paper-here.yaml", data)
    _check(path, ["6 problem(s)", "train.persona_rm.bf16: bf16 needs a CUDA GPU, and none is visible",
                  "train.speaker.bf16", "train.group_rm.bf16", "train.director.bf16", "train.director_dpo.bf16", "train.sft.bf16",
                  "--no-machine-checks"])
    assert runner.invoke(app, ["config", "validate", str(path), "--no-machine-checks"]).exit_code == 0


def test_a_cuda_device_needs_a_gpu_too(workdir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = _write(workdir, "cuda.yaml", _set(_yaml(workdir / "tiny.yaml"), "generation.device", "cuda:1"))
    _check(path, ["generation.device", "device 'cuda:1' is a CUDA GPU, and none is visible"])
    # every role's device, the chat's too, as eval.director's
    data = _set(_yaml(workdir / "tiny.yaml"), "chat.speaker", {"kind": "transformers", "model": "tiny:lm",
                                                                "device": "cuda"})
    data = _set(data, "chat.safety.classifier", {"model": "some/classifier", "device": "cuda"})
    output = _check(_write(workdir, "chat-cuda.yaml", data), ["2 problem(s)", "device 'cuda' is a CUDA GPU"])
    for where in ("chat.speaker.device", "chat.safety.classifier.device"):
        assert _located(output, "chat-cuda.yaml", where), output
    assert runner.invoke(app, ["config", "validate", str(workdir / "chat-cuda.yaml"),
                               "--no-machine-checks"]).exit_code == 0


@pytest.mark.parametrize("kind", ["dask", "ray"])
def test_a_dask_or_ray_runner_needs_its_prefect_integration_on_the_machine(workdir, monkeypatch, kind):
    import importlib.util

    path = _write(workdir, f"{kind}.yaml", _set(_yaml(workdir / "tiny.yaml"), "runner", {"kind": kind, "workers": 2}))
    find_spec = importlib.util.find_spec
    assert runner.invoke(app, ["config", "validate", str(path)]).exit_code == 0  # installed here (its extra, in all)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == f"prefect_{kind}"
                        else find_spec(name, *a))
    _check(path, ["runner.kind", f"the {kind} runner needs prefect-{kind}", f"pip install 'mascot[{kind}]'"])


def test_shipped_rosters_rubrics_and_users_are_valid():
    paths = [str(p) for folder in ("rosters", "rubrics") for p in sorted((CONFIGS / folder).glob("*.yaml"))]
    result = runner.invoke(app, ["config", "validate", *paths, str(USERS)])
    assert result.exit_code == 0, result.output
    assert "The Anchor" in result.output and "Critic" in result.output
    assert "empathetic_support" in result.output and "scores 1-5" in result.output


@pytest.mark.parametrize("case, name, mutation, fragments", BROKEN_CONFIGS, ids=[c[0] for c in BROKEN_CONFIGS])
def test_broken_config(workdir, case, name, mutation, fragments):
    data = _set(_yaml(workdir / name), *mutation)
    if name == "paper.yaml":  # give the paper profile its corpora so only the mutation is wrong
        _give_paper_its_corpora(workdir, data)
    path = _write(workdir, f"broken-{case}.yaml", data)
    _check(path, fragments, "--no-machine-checks")
    output = runner.invoke(app, ["config", "validate", str(path), "--no-machine-checks"]).output
    assert _located(output, path.name, fragments[0]), f"no line for {fragments[0]}:\n{output}"


def test_the_bad_config_suite_is_large():
    assert len(BROKEN_CONFIGS) >= 60 and len({case for case, *_ in BROKEN_CONFIGS}) == len(BROKEN_CONFIGS)


@pytest.mark.parametrize("case, text, fragments", BROKEN_TEXT, ids=[c[0] for c in BROKEN_TEXT])
def test_broken_yaml_text(tmp_path, case, text, fragments):
    _check(_write(tmp_path, "broken.yaml", text), fragments)


@pytest.mark.parametrize("case, mutation, fragments", BROKEN_ROSTERS, ids=[c[0] for c in BROKEN_ROSTERS])
def test_broken_roster(tmp_path, case, mutation, fragments):
    _check(_write(tmp_path, "roster.yaml", _set(_yaml(ROSTER), *mutation)), fragments)


@pytest.mark.parametrize("case, mutation, fragments", BROKEN_USERS, ids=[c[0] for c in BROKEN_USERS])
def test_broken_users(tmp_path, case, mutation, fragments):
    _check(_write(tmp_path, "users.yaml", _set(_yaml(USERS), *mutation)), fragments)


@pytest.mark.parametrize("case, mutation, fragments", BROKEN_RUBRICS, ids=[c[0] for c in BROKEN_RUBRICS])
def test_broken_rubric(tmp_path, case, mutation, fragments):
    _check(_write(tmp_path, "rubric.yaml", _set(_yaml(RUBRIC), *mutation)), fragments)


def test_a_broken_file_that_a_config_names_is_reported_at_its_own_line(workdir):
    rubric = _write(workdir, "rubric-broken.yaml", _set(_yaml(RUBRIC), "criteria.0.anchors.5", _DELETE))
    config = _write(workdir, "names-broken-rubric.yaml", _set(_yaml(workdir / "tiny.yaml"), "stage1.rubric",
                                                             str(rubric)))
    _check(config, ["rubric-broken.yaml:", "criteria[0].anchors"])


def test_problem_points_at_line(workdir):
    text = re.sub(r"(?m)^  k: 8.*$", "  k: many", (workdir / "tiny.yaml").read_text())
    path = _write(workdir, "broken-line.yaml", text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.strip() == "k: many")
    _check(path, [f"broken-line.yaml:{line}: stage1.k"])


def test_every_problem_is_listed(workdir):
    data = _set(_set(_yaml(workdir / "tiny.yaml"), "stage1.k", 0), "stage1.margin", -1)
    _check(_write(workdir, "broken-two.yaml", data), ["2 problem(s)", "stage1.k", "stage1.margin"])


def test_console_command_exit_status(workdir):
    broken = _write(workdir, "broken.yaml", _set(_yaml(workdir / "tiny.yaml"), "stage1.k", 0))
    mascot = Path(sys.executable).parent / "mascot"
    result = subprocess.run([str(mascot), "config", "validate", str(broken)], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "stage1.k" in result.stderr


def test_relative_paths_resolve_against_config_folder(workdir):
    config = load_config(workdir / "tiny.yaml")
    assert config.data.roster == workdir / "rosters" / "emotional_support.yaml"
    assert config.data.corpus.path.is_dir()


def test_the_primary_endpoint_defaults_to_the_untrained_group_on_the_collective_rubric(workdir):
    config = load_config(workdir / "tiny.yaml")
    assert config.eval.primary.model_dump() == {"baseline": "multi_agent", "level": "collective", "metric": "overall",
                                                "eval_set": "held_out"}
    data = _set(_yaml(workdir / "tiny.yaml"), "eval.systems", ["mascot", "zero_shot", "mascot_c"])
    assert load_config(_write(workdir, "no-multi-agent.yaml", data)).eval.primary.baseline == "mascot_c"
    data = _set(_yaml(workdir / "tiny.yaml"), "eval.systems", ["mascot", "zero_shot"])
    primary = load_config(_write(workdir, "singles.yaml", data)).eval.primary
    assert (primary.baseline, primary.level) == ("zero_shot", "persona")


def test_the_docs_list_every_field():
    from mascot.config.docs import field_table

    docs = (REPO / "docs" / "configuration.md").read_text()
    assert field_table() in docs, "docs/configuration.md is stale: paste `python -m mascot.config.docs` into it"


def test_stage2_needs_its_trainers_and_a_collective_rubric_of_the_domain(workdir):
    data = _yaml(workdir / "tiny.yaml")
    del data["train"]["director"]
    _check(_write(workdir, "no-director.yaml", data), ["train.director", "Stage 2 (the 'stage2' section) trains"])
    data = _yaml(workdir / "tiny.yaml")
    data["stage2"]["rubric"] = "rubrics/group_meetings.yaml"
    data["stage2"]["margin"] = 9.0
    _check(_write(workdir, "wrong-rubric.yaml", data),
           ["stage2.rubric: rubric", "is for 'meetings', but data.domain is 'emotional_support'",
            "stage2.margin: no pair can reach a margin of 9"])


def test_an_evaluation_needs_stage2(workdir):
    data = _yaml(workdir / "tiny.yaml")
    for key in ("group_rm", "director", "director_dpo", "director_eval", "sft"):
        del data["train"][key]
    del data["stage2"]
    _check(_write(workdir, "eval-only.yaml", data), ["eval", "plays the trained Speaker and Director",
                                                     "needs a 'stage2' section"])


def test_a_listed_system_needs_the_section_that_trains_or_serves_it(workdir):
    data = _yaml(workdir / "tiny.yaml")
    del data["train"]["director_dpo"]
    data["eval"]["systems"].append("mascot_dpo")
    output = _check(_write(workdir, "no-dpo.yaml", data), [
        "eval.systems[10]", ("'mascot_dpo' plays the DPO Director, which train.director_dpo trains (or "
        "eval.director_dpo serves), but the config has neither section")], "--no-machine-checks")
    assert _located(output, "no-dpo.yaml", "eval.systems[10]"), output
    data["eval"]["director_dpo"] = {"kind": "openai", "model": "director-dpo", "base_url": "http://127.0.0.1:8000/v1"}
    served = runner.invoke(app, ["config", "validate", str(_write(workdir, "served-dpo.yaml", data))])
    assert served.exit_code == 0, served.output


def test_the_chat_safety_rules_are_loaded_and_compiled_at_their_config_line(workdir):
    from mascot.chat.safety import DEFAULT_RULES

    # A broken regular expression in a copy of the shipped rules: the first quoted pattern loses its closing.
    text = DEFAULT_RULES.read_text()
    first = re.search(r"(?m)^\s*- '\\b", text)
    broken = text[:first.end()] + "(" + text[first.end():]
    line = text[:first.start()].count("\n") + 1
    rules = _write(workdir, "rules-broken.yaml", broken)
    path = _write(workdir, "broken-rules.yaml", _set(_yaml(workdir / "tiny.yaml"), "chat.safety.rules", str(rules)))
    output = _check(path, ["chat.safety.rules", f"{rules} is not a safety-rules file the chat can use",
                           f"rules-broken.yaml:{line}:"], "--no-machine-checks")
    assert _located(output, "broken-rules.yaml", "chat.safety.rules"), output
    rules.write_text(text)
    assert runner.invoke(app, ["config", "validate", str(path), "--no-machine-checks"]).exit_code == 0


def test_the_sft_baseline_needs_its_trainer(workdir):
    data = _yaml(workdir / "tiny.yaml")
    del data["train"]["sft"]
    _check(_write(workdir, "no-sft.yaml", data), ["eval.systems", "'sft' baseline is trained by train.sft",
                                                 "drop 'sft'"])
    data["eval"]["systems"].remove("sft")
    assert runner.invoke(app, ["config", "validate", str(_write(workdir, "no-sft-system.yaml", data))]).exit_code == 0


def test_a_config_without_stage2_is_a_stage1_config(workdir):
    data = _yaml(workdir / "tiny.yaml")
    for key in ("group_rm", "director", "director_dpo", "director_eval", "sft"):
        del data["train"][key]
    del data["stage2"], data["eval"]  # the evaluation plays Stage 2's Director
    assert runner.invoke(app, ["config", "validate", str(_write(workdir, "stage1-only.yaml", data))]).exit_code == 0


@pytest.mark.parametrize("profile", ["tiny.yaml", "tiny_meetings.yaml"])
def test_the_tiny_profiles_of_both_domains_validate_with_stage2(profile):
    result = runner.invoke(app, ["config", "validate", str(CONFIGS / profile)])
    assert result.exit_code == 0, result.output
    assert "stage 2" in result.output and "group RM" in result.output


def test_the_paper_profiles_of_both_domains_validate_but_for_their_corpora(workdir):
    for profile, corpora in (("paper.yaml", ("empathetic_dialogues", "esconv")), ("paper_meetings.yaml", ("qmsum",))):
        result = runner.invoke(app, ["config", "validate", str(workdir / profile), "--no-machine-checks"])
        problems = result.output.splitlines()[1:]
        assert problems and all(any(f"the {corpus} corpus is not downloaded" in line for corpus in corpora)
                                for line in problems), result.output


def _one_persona_roster(workdir: Path) -> str:
    roster = _yaml(workdir / "rosters" / "emotional_support.yaml")
    for persona in roster["personas"][1:]:
        persona["enabled"] = False
    return _write(workdir, "one-persona.yaml", roster).name


def _meetings_users(workdir: Path) -> str:
    users = _yaml(workdir / "users" / "big_five.yaml")
    users["profiles"] = [p for p in users["profiles"] if p["domains"] == ["meetings"]]
    return _write(workdir, "meetings-users.yaml", users).name


def test_stage2_needs_two_enabled_personas_for_the_director_to_choose_from(workdir):
    data = _set(_yaml(workdir / "tiny.yaml"), "data.roster", _one_persona_roster(workdir))
    path = _write(workdir, "one-persona-run.yaml", data)
    output = _check(path, ["data.roster", "one-persona.yaml has 1 enabled persona(s) (anchor)",
                           "Stage 2's Director chooses the next speaker", "needs at least two"])
    assert _located(output, path.name, "data.roster"), output
    for key in ("group_rm", "director", "director_dpo", "director_eval"):  # Stage 1 alone needs one persona only
        del data["train"][key]
    del data["stage2"], data["eval"]  # the evaluation plays Stage 2's Director
    assert runner.invoke(app, ["config", "validate", str(_write(workdir, "one-persona-stage1.yaml", data))]).exit_code == 0


def test_user_profiles_need_one_for_the_domain(workdir):
    path = _write(workdir, "meetings-users-run.yaml",
                  _set(_yaml(workdir / "tiny.yaml"), "data.users", _meetings_users(workdir)))
    output = _check(path, ["data.users", "meetings-users.yaml have none for domain 'emotional_support' (data.domain)",
                           "add a profile whose domains include 'emotional_support'"])
    assert _located(output, path.name, "data.users"), output


def test_every_file_the_run_cannot_use_is_listed_at_its_own_line(workdir):
    data = _set(_yaml(workdir / "tiny.yaml"), "data.roster", _one_persona_roster(workdir))
    data = _set(_set(data, "data.users", _meetings_users(workdir)), "stage2.rubric", "rubrics/emotional_support.yaml")
    path = _write(workdir, "three-problems.yaml", data)
    # the fourth: the pairwise judge weighs by stage2.rubric too, where eval.group_rubric is not given
    output = _check(path, ["4 problem(s)", "enabled persona(s)", "have none for domain", "cannot score rubric",
                           "the pairwise judge 'heuristic' weighs by the collective rubric"])
    assert _located(output, "three-problems.yaml", "eval.pairwise"), output
    rows = path.read_text().splitlines()
    stage2 = rows.index("stage2:")
    for yaml_path, key, start in (("data.roster", "roster:", 0), ("data.users", "users:", 0),
                                  ("stage2.rubric", "rubric:", stage2)):
        line = next(i for i, row in enumerate(rows, 1) if i > start and row.strip().startswith(key))
        assert f"three-problems.yaml:{line}: {yaml_path}: " in output, output


def test_a_config_whose_stage2_cannot_run_is_refused_before_stage1_runs(workdir):
    path = _write(workdir, "persona-rubric.yaml", _set(_yaml(workdir / "tiny.yaml"), "stage2.rubric",
                                                       "rubrics/emotional_support.yaml"))
    result = runner.invoke(app, ["run", "stage1", "--config", str(path), "--until", "pairs"])
    assert result.exit_code == 2 and "stage2.rubric: judge 'heuristic'" in result.output, result.output
    from flows.stage1 import stage1  # a deployment runs the flow without the CLI: it checks the same

    with pytest.raises(ConfigError, match=r"stage2\.rubric: judge 'heuristic'"):
        stage1.fn(str(path), until="pairs")
    assert not (workdir.parent / "runs").exists()


def test_several_training_seeds_refuse_a_trained_role_served_by_hand(workdir):
    """A module served by hand is one adapter, so it cannot play each training seed's Speaker; the paper profile,
    whose flow loads every adapter into the server, takes three."""
    data = _set(_yaml(workdir / "tiny.yaml"), "eval.training_seeds", 2)
    data["eval"]["speaker"] = {"kind": "openai", "model": "speaker", "base_url": "http://127.0.0.1:8000/v1"}
    path = _write(workdir, "hand-served.yaml", data)
    fragments = ["eval.speaker.load_adapter", "eval.training_seeds is 2", "served by hand"]
    _check(path, fragments, "--no-machine-checks")
    data["eval"]["training_seeds"] = 1
    assert runner.invoke(app, ["config", "validate", str(_write(workdir, "once.yaml", data)),
                               "--no-machine-checks"]).exit_code == 0
    paper = _set(_yaml(workdir / "paper.yaml"), "eval.training_seeds", 3)
    _give_paper_its_corpora(workdir, paper)
    result = runner.invoke(app, ["config", "validate", str(_write(workdir, "paper3.yaml", paper)), "--no-machine-checks"])
    assert result.exit_code == 0, result.output
