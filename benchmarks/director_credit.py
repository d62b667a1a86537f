"""Benchmark: does the tiny Director learn check 2's cue-conditioned choice, and which of GRPO's tokens stop it?

    python benchmarks/director_credit.py [--steps 60] [--batch-size 64] [--generations 16] [--samples 8]
                                         [--arm grpo|choice|sft ...] [--temperature T]
                                         [--cache DIR]

On known-optimum check 2's Director prompts (`mascot.known_optima.stage2_chain.cue_contexts`: 72 training
contexts, 36 held out), each arm trains the tiny profile's Director to name the persona that fits the cue in the
person's message, with no rollout and no group reward model in between:

- `grpo`: the project's GRPO trainer (`train_grpo_policy`, check 1's settings) with the loss on the whole directive
  (`train.director.credit: directive`), rewarded 1 when the completion's `next_speaker` names the fitting persona,
  whether or not the rest of the directive is valid, else 0;
- `choice`: the same, with the loss (and its KL term) on the completion's tokens up to the end of its `next_speaker`
  value only (`credit: choice`, `mascot.train.choice_credit`); sampling and reward as in `grpo`;
- `sft`: supervision with the same LoRA: `{"next_speaker": "<the fitting persona>"` after each training prompt,
  `--sft-epochs` epochs of batches of 8 at `--sft-learning-rate`.

For each arm it prints, on the held-out and on the training prompts, the share of valid directives and the
fitting share among them, before and after, and the trained choice by cue class. docs/stage2.md reads it: where
`sft` and `choice` rise and `grpo` does not, the choice is learnable and GRPO's credit over the directive's other
tokens is what hides it.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("grpo", "choice", "sft")
NEXT_SPEAKER = re.compile(r'"next_speaker"\s*:\s*"([a-z_]+)"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=ARMS, action="append", help="run only this arm (repeatable)")
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps")
    parser.add_argument("--batch-size", type=int, default=64, help="GRPO completions per step")
    parser.add_argument("--generations", type=int, default=16, help="GRPO completions per prompt")
    parser.add_argument("--sft-epochs", type=int, default=10, help="the `sft` arm's passes over the training prompts")
    parser.add_argument("--sft-learning-rate", type=float, default=1e-3, help="the `sft` arm's AdamW step")
    parser.add_argument("--samples", type=int, default=8, help="directives sampled per prompt and policy")
    parser.add_argument("--temperature", type=float, default=None, help="the Director's sampling temperature, in "
                        "training and in the measurements (default: the profile's, train.director.temperature)")
    parser.add_argument("--cache", type=Path, default=None, help="where the tiny models are built (default: the "
                        "profile's cache)")
    args = parser.parse_args()

    from mascot.config import load_config
    from mascot.train.tiny import resolve_tiny_models

    profile = load_config(REPO / "configs" / "tiny.yaml")
    if args.cache:
        profile = profile.model_copy(update={"cache": profile.cache.model_copy(update={"dir": args.cache})})
    profile = resolve_tiny_models(profile)
    world, fitting = cue_world(profile)
    policy = director_policy(profile, args)
    base = {split: measure(policy, None, world, split, fitting, args.samples) for split in ("held_out", "training")}
    print(f"check 2's prompts: {len(world.training)} training, {len(world.held_out)} held out; the untrained "
          f"Director: {line(base)}", flush=True)
    for arm in args.arm or ARMS:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mascot-credit-") as scratch:
            if arm == "sft":
                adapter = train_choice_sft(policy, world, fitting, Path(scratch), args.sft_epochs,
                                           args.sft_learning_rate)
            else:
                credit = "choice" if arm == "choice" else "directive"
                adapter = train_grpo(policy.model_copy(update={"credit": credit}), world, fitting, Path(scratch))
            after = {split: measure(policy, adapter, world, split, fitting, args.samples)
                     for split in ("held_out", "training")}
        print(f"{arm:<7} {line(after)} ({time.perf_counter() - started:.0f} s)\n        held-out choices by cue: "
              f"{after['held_out']['choices']}", flush=True)


def cue_world(profile):
    """Check 2's contexts as check 1's Director world, and context id -> the persona that fits its cue."""
    from mascot.dialogue.directives import director_messages
    from mascot.dialogue.turns import opening_turns
    from mascot.known_optima.director_grpo import DirectorWorld, Prompt
    from mascot.known_optima.stage2_chain import cue_contexts, preferred
    from mascot.roster import load_roster

    roster = load_roster(profile.data.roster)
    contexts, held_out = cue_contexts()
    fitting = {c.id: preferred()[c.metadata["cue"]] for c in contexts}
    prompts = {c.id: Prompt(c.id, director_messages(roster, opening_turns(c))) for c in contexts}
    world = DirectorWorld(roster, [p for i, p in prompts.items() if i not in held_out],
                          [p for i, p in prompts.items() if i in held_out])
    return world, fitting


def director_policy(profile, args):
    from mascot.known_optima.director_grpo import check_policy

    return check_policy(profile.train.director, profile.train.director.model, args.steps).model_copy(
        update={"batch_size": args.batch_size, "num_generations": args.generations,
                **({} if args.temperature is None else {"temperature": args.temperature})})


class CueReward:
    """1 when the completion's `next_speaker` names the persona that fits its prompt's cue, else 0."""

    __name__ = "cue"  # TRL logs a reward function under its name

    def __init__(self, fitting: dict[str, str]):
        self.fitting = fitting

    def __call__(self, prompts: list, completions: list, prompt_id: list[str], **_) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [float(named(text) == self.fitting[i]) for text, i in zip(texts, prompt_id, strict=True)]


def named(text: str) -> str | None:
    match = NEXT_SPEAKER.search(text)
    return match.group(1) if match else None


def train_grpo(policy, world, fitting, out: Path) -> Path:
    from mascot.stage2.director import credit_until
    from mascot.train.grpo import train_grpo_policy

    prompts = [{"prompt": p.messages, "prompt_id": p.id} for p in world.training]
    return train_grpo_policy(policy, prompts, [CueReward(fitting)], [1.0], out / "adapter", out / "checkpoints",
                             name="director-credit", credit_until=credit_until(policy)).path


def train_choice_sft(policy, world, fitting, out: Path, epochs: int, learning_rate: float) -> Path:
    """The Director's LoRA, trained by cross-entropy on `{"next_speaker": "<fitting persona>"` after each training
    prompt (the prompt itself unlearned)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot.train.lora import peft_lora_config

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(policy.model)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(policy.model), peft_lora_config(policy.lora))
    rows = []
    for prompt in world.training:
        text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text + '{"next_speaker": "' + fitting[prompt.id] + '"', add_special_tokens=False)["input_ids"]
        rows.append((ids, len(tokenizer(text, add_special_tokens=False)["input_ids"])))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    order = random.Random(0)
    for _ in range(epochs):
        order.shuffle(rows)
        for start in range(0, len(rows), 8):
            batch = rows[start:start + 8]
            loss = 0.0
            for ids, prompt_length in batch:
                inputs = torch.tensor([ids])
                labels = inputs.clone()
                labels[0, :prompt_length] = -100
                loss = loss + model(input_ids=inputs, labels=labels).loss / len(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.save_pretrained(out / "adapter")
    return out / "adapter"


def measure(policy, adapter: Path | None, world, split: str, fitting: dict[str, str], samples: int) -> dict:
    """On the split's prompts, sampled as GRPO samples: the share of valid directives, the fitting share among
    them (averaged over the prompts with a valid one), and each persona's share of the valid ones per cue class."""
    from mascot.known_optima.director_grpo import sample_speakers

    prompts = getattr(world, split)
    speakers = sample_speakers(policy, adapter, world, prompts, samples, seed=0)
    valid = {i: [s for s in named_list if s is not None] for i, named_list in speakers.items()}
    fits = [sum(s == fitting[i] for s in v) / len(v) for i, v in valid.items() if v]
    by_cue: dict[str, Counter] = {}
    for i, v in valid.items():
        by_cue.setdefault(fitting[i], Counter()).update(v)
    choices = "; ".join(f"fits {cue}: " + " ".join(f"{p} {n / sum(c.values()):.2f}" for p, n in sorted(c.items()))
                        for cue, c in sorted(by_cue.items()))
    return {"valid": sum(map(len, valid.values())) / sum(map(len, speakers.values())),
            "fit": sum(fits) / len(fits), "choices": choices}


def line(measured: dict) -> str:
    return "; ".join(f"{split}: valid {m['valid']:.0%}, fitting among valid {m['fit']:.3f}"
                     for split, m in measured.items())


if __name__ == "__main__":
    main()
