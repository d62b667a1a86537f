"""Tiny Qwen3-architecture models built offline, for the `tiny` profile and the tests.

Nothing is downloaded. The builder trains a byte-level BPE tokenizer with a Qwen-style chat
template on text the project ships (sample dialogues, rosters, prompt templates), creates a small
`Qwen3ForCausalLM`, warm-starts it briefly on the training-split sample dialogues so that it
samples word-like text (and directive-shaped JSON after the Director's prompt), and derives a
`Qwen3ForSequenceClassification` reward model from it (as the paper derives its reward models from
Qwen3-0.6B). Held-out corpora are never used.

The result is deterministic for a spec and cached under `<cache>/tiny-models/<input hash>/`; it
is rebuilt only when the spec, this builder's code, the torch/transformers versions or the text the
models are trained on change. That text is the warm start's examples as rendered (the training-split
sample dialogues in the Speaker's and the Director's prompts), and the rosters and those two templates,
which the tokenizer also reads: a template or a sample file that the build never reads does not rebuild
them. Both directories are ordinary Hugging Face model folders loaded by `from_pretrained`, so the code
that loads them is the code that loads `Qwen/Qwen3-8B` on a GPU machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from mascot.config import SAMPLES_DIR, TINY_MODELS, RunConfig, TinyModelSpec
from mascot.data import load_contexts
from mascot.dialogue.directives import director_messages
from mascot.dialogue.turns import Directive, Turn, opening_turns
from mascot.prompts import TEMPLATES_DIR, speaker_messages
from mascot.roster import Persona, Roster, load_roster
from mascot.torch_runtime import quiet_transformers, require_torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PAD, EOS = "<|endoftext|>", "<|im_end|>"
# Qwen's ChatML layout without tool calling, which the tiny models never see.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Training-split sample corpora only; ESConv is the held-out out-of-domain set.
WARM_START_CORPORA = [("empathetic_dialogues", "empathetic_dialogues"), ("qmsum", "qmsum")]
# The rosters as the package carries them (mascot/profiles is configs/), in a checkout and an installed wheel alike.
ROSTERS_DIR = Path(__file__).resolve().parents[1] / "profiles" / "rosters"
STAGE2_TRAINERS = ("group_rm", "director", "director_dpo", "sft")  # sft: the evaluation's, after Stage 2
# The templates the warm start renders (`speaker_messages`, `director_messages`): the tokenizer also reads them raw.
WARM_START_TEMPLATES = ("speaker.j2", "director.j2")
# Lines in each persona's voice (text the project writes for the warm start), and the instruction that asks for a question.
VOICES = Path(__file__).with_name("tiny_voices.yaml")
QUESTION_INSTRUCTION = "Ask one short question."


@dataclass(frozen=True)
class TinyModels:
    lm: Path
    rm: Path

    def path_for(self, ref: str) -> Path:
        return {"tiny:lm": self.lm, "tiny:rm": self.rm}[ref]


def input_hash(spec: TinyModelSpec) -> str:
    """Hash of everything the build depends on; a change to any of it means a rebuild.

    The text is hashed as the warm start sees it (its examples, rendered), not as the files it comes
    from, so the key follows the rendering code too and ignores whatever the examples never show.
    """
    import torch
    import transformers

    digest = hashlib.sha256()
    digest.update(spec.model_dump_json().encode())
    digest.update(Path(__file__).read_bytes())  # the builder: chat template, example layout, warm start
    digest.update(f"torch={torch.__version__} transformers={transformers.__version__}".encode())
    examples = [{"messages": example.messages, "learn_prompt": example.learn_prompt}
                for example in _training_examples()]
    digest.update(json.dumps(examples, sort_keys=True).encode())
    digest.update(json.dumps(_raw_texts()).encode())
    return digest.hexdigest()[:16]


def _raw_texts() -> list[str]:
    """The files the tokenizer reads as they are, besides the examples: the rosters and the warm start's templates."""
    files = [*sorted(ROSTERS_DIR.glob("*.yaml")), *(TEMPLATES_DIR / name for name in WARM_START_TEMPLATES)]
    return [path.read_text(encoding="utf-8", errors="replace") for path in files]


def build_tiny_models(spec: TinyModelSpec, cache_root: str | Path, progress: bool = True) -> TinyModels:
    """Return the cached tiny models for `spec`, building them first if needed."""
    require_torch()
    target = Path(cache_root) / "tiny-models" / input_hash(spec)
    models = TinyModels(lm=target / "lm", rm=target / "rm")
    if (target / "complete").exists():
        return models
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with quiet_transformers():
            _build(spec, staging, progress)
        (staging / "complete").write_text(spec.model_dump_json(indent=2))
        try:
            os.rename(staging, target)  # atomic: readers see a whole build or none
        except OSError:
            if not (target / "complete").exists():  # another process did not win the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models


def resolve_tiny_models(config: RunConfig, progress: bool = True, *, trainers: bool = True,
                        stage2: bool = True) -> RunConfig:
    """A copy of `config` in which every `tiny:` model reference names its built folder.

    The tiny models are built (or found in the cache) once, here, so that every step downstream gets
    a model `from_pretrained` can load. A judge keeps its label: one without a `name` was labelled by
    its model reference, and judgments.parquet must not change with where the cache lives. With
    `trainers=False` (a run that trains nothing) the trainers' references are left as they are, and
    with `stage2=False` (a Stage 1 run) Stage 2's roles and trainers are, so a data-only Stage 1 run
    on HTTP backends builds nothing and never imports torch.
    """
    def needed(loc: tuple) -> bool:
        if loc[0] == "stage2" or loc[:2] in {("train", name) for name in STAGE2_TRAINERS}:
            return stage2
        return trainers or loc[0] != "train"

    refs = {loc: ref for loc, ref in config.model_refs().items() if needed(loc)}
    if not any(ref in TINY_MODELS for ref in refs.values()):
        return config
    assert config.tiny is not None  # RunConfig validation guarantees it
    models = build_tiny_models(config.tiny, config.cache.root, progress)
    resolved = config.model_copy(deep=True)
    for judge in [*resolved.stage1.judges, *(resolved.stage2.judges if resolved.stage2 else [])]:
        if judge.backend is not None and judge.backend.model in TINY_MODELS:
            judge.name = judge.label
    for loc, ref in refs.items():
        if ref in TINY_MODELS:
            _section_at(resolved, loc[:-1]).model = str(models.path_for(ref))
    return resolved


def _section_at(config: RunConfig, loc: tuple):
    section = config
    for part in loc:
        section = section[part] if isinstance(part, int) else getattr(section, part)
    return section


@dataclass(frozen=True)
class Example:
    """A warm-start dialogue, and whether its prompt is learned too or only its last (assistant) message."""

    messages: list[dict]
    learn_prompt: bool
    directive: bool = False  # a Director's prompt answered by a directive: half of every warm-start batch


def _training_examples() -> list[Example]:
    """Stage 1-shaped examples: a persona's speaker prompt, the context, then a real next turn; the same prompts
    answered in the persona's voice (`VOICES`), with and without a directive; and Stage 2-shaped ones: the
    Director's prompt over the context, then a directive.

    A Speaker example is learned whole: its context is the dialogue text whose register the model
    samples. A directive example is learned on its directive only: the Director's prompt is a long
    template that the model never writes, and learning it too left the model writing almost no valid
    directive after 300 steps (8% of samples, against 66% with the directive alone).

    Empathetic Dialogues contexts are answered by the listener turn that followed them; a meeting
    window is answered by its own last turn. Personas take turns in roster order, so the tiny model
    sees every persona prompt and learns which domain's register follows which prompt. The voice examples
    stand in for an instruction-tuned model: after a persona's prompt it answers in that persona's words, and
    after a directive that asks for one short question it asks one.
    """
    rosters = {roster.domain: roster for roster in map(load_roster, sorted(ROSTERS_DIR.glob("*.yaml")))}
    missing = {"emotional_support", "meetings"} - set(rosters)
    if missing:
        raise FileNotFoundError(f"tiny models are built from the rosters in {ROSTERS_DIR}, which lacks a roster "
                                f"for {sorted(missing)}; run from a clone of the repository")
    voices = yaml.safe_load(VOICES.read_text(encoding="utf-8"))
    examples, directives = [], Counter()  # directives: how many directive examples each domain has so far
    for source, folder in WARM_START_CORPORA:
        for index, context in enumerate(load_contexts(source, SAMPLES_DIR / folder, split="train")):
            roster = rosters[context.domain]
            personas = roster.active
            history, reply = context.history, context.metadata.get("reference_response")
            if reply is None:
                history, reply = history[:-1], history[-1].content
            if not history:
                continue
            context = context.model_copy(update={"history": history})
            prompt = speaker_messages(personas[index % len(personas)], context)
            examples.append(Example([*prompt, {"role": "assistant", "content": reply}], learn_prompt=True))
            # One in the voice of the next persona, so every persona's voice is taught equally often.
            voice = personas[(index + 1) % len(personas)]
            if voice.id in voices:
                examples.append(_voice_example(voice, context, voices[voice.id], index // len(personas)))
            # Directive-shaped examples over the opening and over the opening and a companion's reply, as
            # an episode's states look. A meeting window gives more: also over its shorter prefixes, each
            # twice, since the sample meetings are few, their prompts long and their persona ids long.
            opening = opening_turns(context)
            states = [opening, [*opening, Turn(personas[index % len(personas)].id, reply)]]
            if context.domain == "meetings":
                states = [*states, *(opening[:cut] for cut in range(2, len(opening), 3))] * 2
            for turns in states:
                examples.append(Example(_directive_example(roster, turns, directives[context.domain]),
                                        learn_prompt=False, directive=True))
                directives[context.domain] += 1
    return examples


def _instruction(persona: Persona, round: int) -> str:
    """The first clause of one of the persona's style rules: a directive's instruction is one short sentence."""
    return re.split(r"[;,:]", persona.style_rules[round % len(persona.style_rules)])[0].strip().rstrip(".") + "."


def _voice_example(persona: Persona, context, lines: dict[str, list[str]], round: int) -> Example:
    """The persona's prompt answered by one of its voice lines, the `round`-th time its voice is taught: without
    a directive, with one of its own instructions, or with the instruction to ask one short question (then the
    line is a question), in turn."""
    kind = round % 3
    directive = None if kind == 0 else Directive(
        next_speaker=persona.id, instruction=QUESTION_INSTRUCTION if kind == 2 else _instruction(persona, round))
    pool = lines["questions" if kind == 2 else "statements"]
    reply = pool[(round // 3) % len(pool)]
    return Example([*speaker_messages(persona, context, directive), {"role": "assistant", "content": reply}],
                   learn_prompt=False)


def _directive_example(roster: Roster, turns: list[Turn], count: int) -> list[dict]:
    """The Director's prompt over some turns, answered by a directive-shaped JSON line: the `count`-th directive
    example of the domain names the personas in turn, so each is named equally often, with the first clause of
    one of its style rules as the instruction. Only the shape is taught; which persona fits which moment is left
    for Stage 2's training to find."""
    personas = roster.active
    persona, round = personas[count % len(personas)], count // len(personas)
    directive = json.dumps({"next_speaker": persona.id, "instruction": _instruction(persona, round)})
    return [*director_messages(roster, turns), {"role": "assistant", "content": directive}]


def _build_tokenizer(spec: TinyModelSpec, examples: list[Example]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # The text the key covers (`input_hash`): the examples, and the rosters and templates they were rendered from.
    texts = [m["content"] for example in examples for m in example.messages] + _raw_texts()
    bpe = Tokenizer(models.BPE())
    # JSON's quotes and braces are tokens of their own. Merged with the punctuation before them (`."}`), a
    # directive closed only after that one token: a sampled "." alone, as prose ends, was followed by the end of
    # the turn: 43% of the Director's directives at the known-optimum check's states were invalid, nearly all unclosed.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r'["{}]'), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    # Each persona id is one token, as a Director's choice of speaker is one decision. Split into pieces, the ids of
    # the meeting roster were recombined ("decision_item_captain"): 62% of that Director's directives were invalid,
    # most of them naming such an id.
    personas = sorted({p.id for path in ROSTERS_DIR.glob("*.yaml") for p in load_roster(path).personas})
    bpe.add_tokens([AddedToken(persona, single_word=True, normalized=False) for persona in personas])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE,
                                   model_max_length=spec.max_position_embeddings)


def _build(spec: TinyModelSpec, out: Path, progress: bool) -> None:
    torch = require_torch()
    from transformers import (
        AutoModelForSequenceClassification,
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(spec.seed)
    examples = _training_examples()
    tokenizer = _build_tokenizer(spec, examples)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen3ForCausalLM(config)
    _warm_start(model, tokenizer, examples, spec, progress)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=1.0, top_p=0.95, max_new_tokens=64,
        # A reply ends at <|im_end|>; an undertrained model may instead open a new turn, which also ends it.
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out / "lm")
    tokenizer.save_pretrained(out / "lm")

    torch.manual_seed(spec.seed + 1)  # the reward head is freshly initialised, reproducibly
    reward_model = AutoModelForSequenceClassification.from_pretrained(out / "lm", num_labels=1)
    reward_model.config.pad_token_id = tokenizer.pad_token_id
    reward_model.save_pretrained(out / "rm")
    tokenizer.save_pretrained(out / "rm")


def _warm_start(model, tokenizer, examples: list[Example], spec: TinyModelSpec, progress: bool) -> None:
    """A few hundred language-model steps so samples are word-like rather than noise."""
    import torch
    from rich.progress import Progress

    if spec.warm_start_steps == 0:
        return
    # Long enough for a Director's prompt over a meeting window (up to about 1,000 tokens); cut from the left beyond
    # that. At 768 most meeting prompts were cut, and their Director wrote 66% invalid directives at full length.
    max_len = min(1280, spec.max_position_embeddings)
    # Cut from the left: the reply at the end is what the model must learn to produce.
    sequences, unlearned = [], []  # token ids, and how many leading ones carry no loss
    for example in examples:
        ids = tokenizer.apply_chat_template(example.messages, tokenize=True, return_dict=False)
        sequences.append(torch.tensor(ids[-max_len:]))
        prompt = 0 if example.learn_prompt else len(tokenizer.apply_chat_template(
            example.messages[:-1], tokenize=True, return_dict=False, add_generation_prompt=True))
        unlearned.append(max(prompt - max(len(ids) - max_len, 0), 0))
    pools = [[i for i, example in enumerate(examples) if example.directive == kind] for kind in (True, False)]
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=spec.warm_start_steps)
    model.train()
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("warm-starting tiny LM", total=spec.warm_start_steps)
        for _ in range(spec.warm_start_steps):
            # Half of every batch is directive examples, whatever their share of the examples: the directive's JSON
            # is the one exact format the tiny model must write, and the voice examples crowded it out otherwise (at
            # 300 steps 88% of the Director's samples were invalid without half batches and 78% with them; at 600
            # steps with them, 5%).
            batch_ids = [pool[i] for pool in pools
                         for i in torch.randint(len(pool), (4,), generator=generator).tolist()]
            batch = torch.nn.utils.rnn.pad_sequence([sequences[i] for i in batch_ids], batch_first=True,
                                                    padding_value=tokenizer.pad_token_id)
            attention = (batch != tokenizer.pad_token_id).long()
            labels = batch.masked_fill(attention == 0, -100)
            for row, index in enumerate(batch_ids):
                labels[row, :unlearned[index]] = -100
            loss = model(input_ids=batch, attention_mask=attention, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            bar.update(task, advance=1, description=f"warm-starting tiny LM (loss {loss.item():.2f})")
    model.eval()
