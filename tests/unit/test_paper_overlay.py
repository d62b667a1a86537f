"""The overlay that CI runs the paper profile with (tests/data/paper_overlay.yaml) changes only what a CPU cannot
run, so the shape that tests/integration/test_paper_profile.py runs is the paper profile's own (issue 34)."""

from __future__ import annotations

import yaml
from paper_overlay import PAPER, leaves, merge, overlay_changes, paper_on_cpu

from mascot.config import load_config
from mascot.config.loading import backends

# What a CPU cannot run: the models and their precision, vLLM inside TRL, the servers, the corpora on disk, where
# files go, and wandb online.
CPU_ONLY = {"model", "base_url", "use_cpu", "bf16", "gradient_checkpointing", "use_vllm", "path", "output_dir",
            "wandb_mode"}
COUNTS = {"limit", "k", "max_new_tokens", "block_turns", "trajectory_blocks", "branches", "seeds", "blocks",
          "few_shot_examples", "self_consistency_samples", "cot_reasoning_tokens", "cot_attempts", "max_steps",
          "batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length", "max_length",
          "epochs", "rollouts", "samples_per_prompt", "bootstrap_resamples"}
ADDED_SECTIONS = {"tiny", "cache"}  # the tiny models' build, and the test's own cache
# Keys the paper does not set, which the overlay may add: a server for the judges the paper sends to the vendor's
# API, the CPU for trainers, and a count for the held-out corpus.
ADDED_KEYS = {"base_url", "use_cpu", "limit"}


def test_the_overlay_changes_only_what_a_cpu_cannot_run_and_drops_nothing():
    paper, changes = yaml.safe_load(PAPER.read_text()), overlay_changes()
    before, after, listed = leaves(paper), leaves(merge(paper, changes)), leaves(changes)
    assert set(before) <= set(after), f"the overlay drops {sorted(set(before) - set(after))}"
    changed = {path for path, value in after.items() if path not in before or before[path] != value}
    assert changed == set(listed), "every key the overlay lists changes the paper's value, and no other does"
    for path in changed:
        if path[0] in ADDED_SECTIONS:
            continue
        assert path[-1] in CPU_ONLY | COUNTS, f"{'.'.join(map(str, path))} is neither a CPU's limit nor a count"
        assert path in before or path[-1] in ADDED_KEYS, f"{'.'.join(map(str, path))} is not in the paper profile"


def shape(config) -> dict:
    """What makes a config the paper's rather than the tiny profile's: how each role and judge is reached, the
    panels, the systems, and how Stage 2 plays and trains."""
    roles = {loc: (backend.kind, backend.load_adapter, backend.api_key_env) for loc, backend in backends(config).items()}
    panels = {name: [(judge.kind, judge.name) for judge in panel] for name, panel in (
        ("stage1", config.stage1.judges), ("stage2", config.stage2.judges), ("eval", config.eval.judges),
        ("eval_group", config.eval.group_judges), ("pairwise", [config.eval.pairwise]))}
    return {"roles": roles, "panels": panels, "systems": config.eval.systems, "mode": config.stage2.episodes.mode,
            "data": (config.data.corpus.source, [corpus.source for corpus in config.data.held_out]),
            "stage2_rubric": config.stage2.rubric, "rewards": config.train.director.reward_weights,
            "speaker_rewards": config.train.speaker.reward_weights}


def test_the_overlaid_profile_has_the_paper_profiles_shape(tmp_path):
    paper = load_config(PAPER, check_corpora=False)
    config = load_config(paper_on_cpu(tmp_path, "http://127.0.0.1:9000", "http://127.0.0.1:9001"))
    assert shape(config) == shape(paper)
    # The shape itself: every role served over HTTP, the trained ones loaded at runtime (and the Director's policy
    # snapshots, into the base Director's server), every judge an LLM at a server, and the evaluation's panels
    # configured apart from the training judges.
    served = {loc: backend for loc, backend in backends(config).items()
              if not {"judges", "group_judges", "pairwise"} & set(loc)}
    assert {backend.base_url for backend in served.values()} == {"http://127.0.0.1:9000/v1"}
    assert [loc for loc, backend in served.items() if backend.load_adapter] == [
        ("stage2", "director"), ("stage2", "speaker"), ("eval", "director")]
    judges = {loc: backend for loc, backend in backends(config).items() if loc not in served}
    assert {backend.base_url for backend in judges.values()} == {"http://127.0.0.1:9001/v1"} and len(judges) == 11
    assert [len(config.eval.judges), len(config.eval.group_judges)] == [3, 3]
    assert config.eval.pairwise.backend.model not in {judge.backend.model for judge in config.stage1.judges}
