"""Tiny offline models: loadable through the normal from_pretrained path, deterministic, cached."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from mascot.config import TinyModelSpec
from mascot.data import SAMPLES_DIR, load_contexts
from mascot.prompts import speaker_messages
from mascot.roster import load_roster
from mascot.train.tiny import build_tiny_models, input_hash

QUICK = TinyModelSpec(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                      vocab_size=600, warm_start_steps=3)


def test_models_load_with_auto_classes(tiny_models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models.lm)
    lm = AutoModelForCausalLM.from_pretrained(tiny_models.lm)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_models.rm)
    assert lm.config.model_type == rm.config.model_type == "qwen3"
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == tokenizer.pad_token_id
    assert lm.generation_config.do_sample is True
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    batch = tokenizer(["I feel alone today.", "We decided to ship it."], return_tensors="pt", padding=True)
    with torch.no_grad():
        scores = rm(**batch).logits
    assert scores.shape == (2, 1) and torch.isfinite(scores).all()


def test_warm_started_samples_are_word_like(tiny_models, tiny_config):
    """On a held-out context, most sampled words are words of the training dialogues, not noise."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models.lm)
    lm = AutoModelForCausalLM.from_pretrained(tiny_models.lm)
    train = [*load_contexts("empathetic_dialogues", SAMPLES_DIR / "empathetic_dialogues"),
             *load_contexts("qmsum", SAMPLES_DIR / "qmsum")]
    known = {w for c in train for m in c.history for w in re.findall(r"[a-z']+", m.content.lower())}
    held_out = load_contexts("empathetic_dialogues", SAMPLES_DIR / "empathetic_dialogues", split="validation")[0]
    anchor = load_roster(tiny_config.data.roster).get("anchor")
    inputs = tokenizer.apply_chat_template(speaker_messages(anchor, held_out), add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    torch.manual_seed(0)
    with torch.no_grad():
        # 64 samples: at 16 the share's sampling noise (about 0.03) is as large as a build's margin over 0.75.
        out = lm.generate(**inputs, max_new_tokens=40, num_return_sequences=64)
    texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    words = [w for t in texts for w in re.findall(r"[a-z']+", t.lower())]
    assert len(words) >= 120, texts
    assert sum(w in known for w in words) / len(words) > 0.75, texts


def test_build_is_deterministic(tmp_path):
    first = build_tiny_models(QUICK, tmp_path / "a", progress=False)
    second = build_tiny_models(QUICK, tmp_path / "b", progress=False)
    for name in ("lm/model.safetensors", "rm/model.safetensors", "lm/tokenizer.json"):
        assert (first.lm.parent / name).read_bytes() == (second.lm.parent / name).read_bytes(), name


def test_build_is_cached_and_keyed_by_inputs(tmp_path):
    models = build_tiny_models(QUICK, tmp_path, progress=False)
    stamp = (models.lm / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_models(QUICK, tmp_path, progress=False) == models
    assert (models.lm / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    changed = QUICK.model_copy(update={"seed": 1})
    assert input_hash(changed) != input_hash(QUICK)
    assert build_tiny_models(changed, tmp_path, progress=False).lm != models.lm
    assert not list(tmp_path.glob("tiny-models/.*")), "no staging folders are left behind"


def test_missing_build_leaves_nothing_half_written(tmp_path, monkeypatch):
    from mascot.train import tiny

    def explode(*args, **kwargs):
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(tiny, "_warm_start", explode)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_tiny_models(QUICK.model_copy(update={"warm_start_steps": 1}), tmp_path, progress=False)
    assert list((tmp_path / "tiny-models").iterdir()) == []


def test_a_data_only_stage1_run_on_a_server_builds_nothing_even_when_stage2_is_tiny(tiny_config, tmp_path):
    from mascot.config import BackendConfig
    from mascot.train.tiny import resolve_tiny_models

    server = BackendConfig(kind="openai", model="served", base_url="http://127.0.0.1:9/v1")
    config = tiny_config.model_copy(update={"generation": server, "cache": tiny_config.cache.model_copy(
        update={"dir": tmp_path})})
    assert config.stage2.director.model == "tiny:lm"
    assert resolve_tiny_models(config, trainers=False, stage2=False) is config
    assert not (tmp_path / "tiny-models").exists()


def test_key_covers_only_the_text_the_models_are_trained_on(tmp_path, monkeypatch):
    """A template or a sample file the warm start never shows leaves the key as it is; a change to a
    template or a sample the warm start does show gives a new key."""
    import jinja2

    from mascot import prompts
    from mascot.train import tiny

    templates, samples = tmp_path / "prompts", tmp_path / "samples"
    shutil.copytree(prompts.TEMPLATES_DIR, templates, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(SAMPLES_DIR, samples)
    # The build's text read from the copies, which this test edits.
    monkeypatch.setattr(prompts, "_environment", lambda: jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates), undefined=jinja2.StrictUndefined, autoescape=False))
    monkeypatch.setattr(tiny, "SAMPLES_DIR", samples)
    monkeypatch.setattr(tiny, "TEMPLATES_DIR", templates)
    key = input_hash(QUICK)

    (templates / "brand_new.j2").write_text("A template that no part of the build renders: {{ anything }}\n")
    (templates / "judge.j2").write_text((templates / "judge.j2").read_text() + "\nOne more rubric line.\n")
    esconv = samples / "esconv" / "ESConv.json"
    esconv.write_text(esconv.read_text().replace("a", "b", 1))  # the held-out out-of-domain corpus
    (samples / "empathetic_dialogues" / "notes.md").write_text("a file beside the corpus\n")
    assert input_hash(QUICK) == key

    director = (templates / "director.j2").read_text()
    (templates / "director.j2").write_text(director + "\nAnswer in one line.\n")
    assert input_hash(QUICK) != key
    (templates / "director.j2").write_text(director)
    assert input_hash(QUICK) == key  # a revert finds the same build

    train = samples / "empathetic_dialogues" / "train.csv"
    train.write_text(train.read_text().replace("That's wonderful! How long", "That's great! How long", 1))
    assert input_hash(QUICK) != key


@pytest.mark.parametrize("roster", ["emotional_support", "meetings"])
def test_every_persona_is_the_untrained_directors_choice_often_enough_to_learn_from(tiny_models, tiny_config, roster):
    """The warm-started Director writes a valid directive in at least 85% of its samples at the training contexts'
    openings, and names every persona in at least 10% of its valid ones: a persona it never names gives GRPO no sample
    to reward, so no Director could learn to choose it, and an invalid directive is no choice at all (the fallback
    speaks, at random), only noise in the rewards a choice is learned from."""
    from collections import Counter

    from mascot.known_optima.director_grpo import check_policy, director_world, sample_speakers

    team = load_roster(tiny_config.data.roster.parent / f"{roster}.yaml")
    world = director_world(team, {"emotional_support": "empathetic_dialogues", "meetings": "qmsum"}[roster])
    policy = check_policy(tiny_config.train.director, tiny_models.lm, steps=1)
    sampled = [speaker for speakers in sample_speakers(policy, None, world, world.training[:40], 8, seed=0).values()
               for speaker in speakers]
    named = Counter(speaker for speaker in sampled if speaker is not None)
    valid = sum(named.values())
    assert valid >= 0.85 * len(sampled), f"{len(sampled) - valid} of {len(sampled)} directives invalid: {named}"
    assert all(named[p.id] / valid >= 0.10 for p in team.active), named
