"""`mascot plan`: what a run will ask for, before it runs: requests per backend and their tokens, the API
judges' cost at the config's list prices, the training steps, GPU-hours per stage and peak memory per GPU.

Everything is counted from the config, without data or models: the contexts are `data.corpus.limit` (a plan
needs one), the held-out share as `mascot.data.contexts` draws it, the parameters of each trained model by
building it on the meta device from its shape (`MODEL_SHAPES`, or a local folder's config.json), so nothing is
downloaded and no memory is taken. What a count cannot know before the run is a bound and says so (the
preference pairs, which the judges' scores decide; the Director's retried directives; a CoT turn's samplings).
Rates that turn work into hours are guesses (`GUESSED_RATES`) until the GPU smoke script measures them
(`plan.rates`).

Counted: Stage 1 (sampling, judging, the Speaker's before/after), Stage 2's episodes, group judging, the
Director's GRPO rollouts and its before/after, and the evaluation (`mascot.plan_evaluation`): every system's
conversations over the held-out contexts and, with eval.out_of_domain, each data.held_out corpus's `limit` of
contexts (a plan needs one), its judges' scoring, and the SFT baseline's training. With eval.training_seeds N,
the Speaker's GRPO and the GRPO Director train N times (and the Director's GRPO rollouts are asked N times), and the
systems built from them play N times (`mascot.plan_evaluation`); the reward models and the before/after train and
run once. Not counted: MASCOT with the DPO
Director where eval.systems does not list it (the flow adds it where Stage 2 trained one), and requests that a
judge or the Director repeats after an unusable reply.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mascot.config import (
    BackendConfig,
    GRPOPolicyConfig,
    RewardModelConfig,
    RunConfig,
    SamplingParams,
    TrainerConfig,
)
from mascot.llm.served_adapters import loads_adapters
from mascot.plan_evaluation import evaluation_asks
from mascot.train.grpo import served_policy

# Guesses, for one H100, until benchmarks/gpu_smoke.py measures them: output tokens a second of a vLLM server
# under a full batch, per model; seconds per optimisation step of each trainer at the paper profile's shapes;
# the prompt tokens of each kind of request (rendered prompts, not counted here).
GUESSED_RATES: dict[str, float] = {
    "tokens_per_s/Qwen/Qwen3-8B": 2500.0,
    "tokens_per_s/google/gemma-3-27b-it": 900.0,
    "tokens_per_s/microsoft/phi-4": 1600.0,
    "tokens_per_s/default": 1500.0,
    "s_per_step/reward_model": 1.0,
    "s_per_step/speaker": 40.0,
    "s_per_step/director": 180.0,
    "s_per_step/sft": 20.0,
    "s_per_step/director_dpo": 20.0,
    "prompt_tokens/speaker": 600.0,
    "prompt_tokens/judge": 1200.0,
    "prompt_tokens/director": 900.0,
    "prompt_tokens/user": 900.0,
    "prompt_tokens/group_judge": 2500.0,
    "prompt_tokens/pairwise_judge": 5000.0,
}

# Shapes of the paper's models (their config.json), so that their parameters are counted without a download.
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-8B": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                      "tie_word_embeddings": False},
    "Qwen/Qwen3-0.6B": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                        "tie_word_embeddings": True},
}
GPU_BYTES = 80e9  # an H100; `mascot plan --gpu-memory-gb` for another


@dataclass(frozen=True)
class Work:
    """Requests of one step to one backend."""

    stage: str
    step: str
    backend: str  # the model, and the server it is asked on
    requests: int
    completions: int
    max_output_tokens: int
    prompt_tokens: int  # estimated (GUESSED_RATES)
    api: bool  # a paid API (no base_url, or an API vendor's kind)


@dataclass(frozen=True)
class Training:
    stage: str
    name: str
    steps: int
    upper_bound: bool  # steps of a reward model depend on the pairs the judges keep
    processes: int
    runs: int = 1  # times it trains, once per training seed (eval.training_seeds); `steps` is one run's


@dataclass(frozen=True)
class Memory:
    name: str
    trained_bytes: int  # parameters, gradients and Adam's two moments of what trains
    frozen_bytes: int  # the frozen base under a LoRA adapter
    engine_bytes: int  # TRL's colocated vLLM: its share of the GPU
    scorer_bytes: int  # reward models and in-process copies the step loads for its rewards

    @property
    def total(self) -> int:
        return self.trained_bytes + self.frozen_bytes + self.engine_bytes + self.scorer_bytes


class PlanError(ValueError):
    """The config lacks what a plan counts from (data.corpus.limit)."""


@dataclass(frozen=True)
class Counts:
    contexts: int
    held_out: int
    personas: int
    out_of_domain: int = 0  # the evaluation's contexts of data.held_out (their limits), where it plays them

    @property
    def train(self) -> int:
        return self.contexts - self.held_out

    @property
    def evaluated(self) -> int:
        """Contexts every evaluated system plays once per seed: Stage 1's held-out ones, then data.held_out's."""
        return self.held_out + self.out_of_domain


def counts(config: RunConfig, personas: int) -> Counts:
    limit = config.data.corpus.limit
    if limit is None:
        raise PlanError("data.corpus.limit is not set, so the number of contexts is the corpus's, which a plan does "
                        "not read: set it to the contexts the run should sample")
    # As mascot.data.contexts.held_out_contexts draws it, over clusters; one context per cluster assumed (QMSum's
    # windows of one meeting share one, so there the split is near this, not exactly it).
    held = min(limit - 1, max(1, math.ceil(config.data.held_out_fraction * limit)))
    return Counts(limit, held, personas, _out_of_domain(config))


def _out_of_domain(config: RunConfig) -> int:
    """The evaluation's contexts of data.held_out: each corpus's limit (the run keeps at most that many), where the
    evaluation plays them (eval.out_of_domain)."""
    if config.eval is None or not config.eval.out_of_domain:
        return 0
    for index, corpus in enumerate(config.data.held_out):
        if corpus.limit is None:
            raise PlanError(f"data.held_out[{index}].limit is not set, so the evaluation plays every context of "
                            f"{corpus.source}:{corpus.split}, which a plan does not read: set it to the contexts "
                            "the evaluation should play, or eval.out_of_domain to false")
    return sum(corpus.limit for corpus in config.data.held_out)


def _label(backend: BackendConfig) -> str:
    return backend.model + (f" @ {backend.base_url}" if backend.base_url else " (API)" if backend.kind != "transformers"
                            else " (in-process)")


def _is_api(backend: BackendConfig) -> bool:
    return backend.kind in ("anthropic", "google") or (backend.kind == "openai" and backend.base_url is None)


def _work(stage: str, step: str, backend: BackendConfig, requests: int, n: int, kind: str,
          rates: dict[str, float]) -> Work:
    return Work(stage, step, _label(backend), requests, requests * n, requests * n * backend.params.max_new_tokens,
                int(requests * rates[f"prompt_tokens/{kind}"]), _is_api(backend))


def requests(config: RunConfig, c: Counts, rates: dict[str, float]) -> list[Work]:
    """Every request the counted steps make, by step and backend. A judge request scores one reply or trajectory."""
    s1 = config.stage1
    queries = c.contexts * c.personas
    work = [_work("stage1", "sample candidates", config.generation, queries, s1.k, "speaker", rates)]
    candidates = queries * s1.k
    work += [_work("stage1", f"judge ({judge.label})", judge.backend, candidates, 1, "judge", rates)
             for judge in s1.judges if judge.backend is not None]
    held_queries = c.held_out * c.personas
    compared = held_queries * config.train.before_after.samples_per_prompt * 2  # the base and the trained Speaker
    work += [_work("stage1", f"before/after judge ({judge.label})", judge.backend, compared, 1, "judge", rates)
             for judge in s1.judges if judge.backend is not None]
    if config.stage2 is not None:
        work += _stage2(config, c, rates)
    if config.eval is not None:
        work += [_work("eval", ask.step, ask.backend, ask.requests, ask.n, ask.kind, rates)
                 for ask in evaluation_asks(config, c.evaluated)]
    return work


def _stage2(config: RunConfig, c: Counts, rates: dict[str, float]) -> list[Work]:
    s2, e = config.stage2, config.stage2.episodes
    blocks = e.trajectory_blocks if e.mode == "trajectory" else 1
    user_turn = 1 if e.user_turns and e.mode == "trajectory" else 0
    main_blocks = e.prefix_blocks + e.states - 1
    # one director request per turn at least (up to max_directive_attempts), one speaker request per turn
    turns = c.contexts * (main_blocks * e.block_turns + e.states * e.branches * blocks * e.block_turns)
    users = c.contexts * (main_blocks + e.states * e.branches * blocks * user_turn) if e.user_turns else 0
    trajectories = c.contexts * e.states * e.branches
    speaker = s2.speaker or config.generation
    work = [_work("stage2", "episodes: directives (at least)", s2.director, turns, 1, "director", rates),
            _work("stage2", "episodes: replies", speaker, turns, 1, "speaker", rates),
            _work("stage2", "episodes: user turns", s2.user, users, 1, "user", rates)]
    work += [_work("stage2", f"group judge ({judge.label})", judge.backend, trajectories, 1, "group_judge", rates)
             for judge in s2.judges if judge.backend is not None]
    director = config.train.director
    if director is not None:  # every completion of every step is rolled out `rollouts` times to the episode's end
        rolled = director.max_steps * director.batch_size * director.gradient_accumulation_steps * director.rollouts \
            * training_seeds(config)  # once per training run; the before/after compares the first run's Director
        evaluated = c.held_out * e.states * config.train.director_eval.samples_per_prompt * 2 \
            * config.train.director_eval.rollouts
        for step, count in (("director GRPO rollouts", rolled), ("director before/after rollouts", evaluated)):
            later = count * (blocks * e.block_turns - 1)  # the sampled directive opens it; the policy makes the rest
            # On the base Director's server where it loads the policy's snapshots (served_policy), else in-process.
            policy = served_policy(director, s2.director) or BackendConfig(
                kind="transformers", model=director.model,
                params=SamplingParams(max_new_tokens=director.max_completion_length))
            work += [_work("stage2", f"{step}: directives", policy, later, 1, "director", rates),
                     _work("stage2", f"{step}: replies", speaker, count * blocks * e.block_turns, 1, "speaker",
                           rates)]
            if user_turn:
                work.append(_work("stage2", f"{step}: user turns", s2.user, count * blocks, 1, "user", rates))
    return work


def _processes(trainer: TrainerConfig) -> int:
    if trainer.accelerate_config is None or not trainer.accelerate_config.is_file():
        return 1
    return int((yaml.safe_load(trainer.accelerate_config.read_text()) or {}).get("num_processes", 1))


def training_seeds(config: RunConfig) -> int:
    """Training runs of the group's GRPO policies (eval.training_seeds; 1 without an evaluation)."""
    return config.eval.training_seeds if config.eval is not None else 1


def training(config: RunConfig, c: Counts) -> list[Training]:
    """Optimisation steps per trainer: GRPO's are its max_steps; a reward model's an upper bound, every pair of
    every training query kept (K(K-1)/2 of them in Stage 1, M(M-1)/2 per state in Stage 2). The GRPO Speaker and
    Director train once per training seed (`runs`); the reward models and the SFT baseline once."""
    t, found, runs = config.train, [], training_seeds(config)
    k = config.stage1.k
    stage1_pairs = c.train * c.personas * k * (k - 1) // 2
    found.append(_epochs("stage1", "persona_rm", t.persona_rm, stage1_pairs))
    found.append(Training("stage1", "speaker", t.speaker.max_steps, False, _processes(t.speaker), runs))
    if config.stage2 is not None:
        e = config.stage2.episodes
        group_pairs = c.train * e.states * e.branches * (e.branches - 1) // 2
        found.append(_epochs("stage2", "group_rm", t.group_rm, group_pairs))
        found.append(Training("stage2", "director", t.director.max_steps, False, _processes(t.director), runs))
    if config.eval is not None and "sft" in config.eval.systems:
        # one example per training context, its best-judged candidate over all personas: at most, since a context
        # none of whose candidates was judged ok gives none (mascot.evaluation.baselines.best_candidates)
        found.append(_epochs("eval", "sft", t.sft, c.train))
    return found


def _epochs(stage: str, name: str, trainer, examples: int, bound: bool = True) -> Training:
    processes = _processes(trainer)
    per_step = trainer.batch_size * trainer.gradient_accumulation_steps * processes
    return Training(stage, name, math.ceil(math.ceil(examples / per_step) * trainer.epochs), bound, processes)


def api_costs_by_stage(work: list[Work], prices: dict) -> dict[str, dict[str, float | None]]:
    """`api_costs` of each stage's requests, by stage."""
    stages = dict.fromkeys(item.stage for item in work)
    return {stage: costs for stage in stages if (costs := api_costs([w for w in work if w.stage == stage], prices))}


def api_costs(work: list[Work], prices: dict) -> dict[str, float | None]:
    """Dollars per API model at list price: estimated prompt tokens and every completion at its max_new_tokens
    (so an upper bound on the completions); None where the config names no price."""
    costs: dict[str, float | None] = {}
    for item in work:
        if not item.api:
            continue
        model = item.backend.removesuffix(" (API)")
        price = prices.get(model)
        if price is None:
            costs[model] = None
            continue
        cost = (item.prompt_tokens * price.input + item.max_output_tokens * price.output) / 1e6
        costs[model] = (costs.get(model) or 0.0) + cost
    return costs


def _rate(backend: str, rates: dict[str, float]) -> float:
    model = backend.split(" ")[0]
    return rates.get(f"tokens_per_s/{model}", rates["tokens_per_s/default"])


def served_hours(work: list[Work], rates: dict[str, float]) -> dict[str, dict[str, float]]:
    """Hours of each server's work per stage (stage -> backend -> hours): its output tokens at its model's rate; an
    in-process model's work is on the training GPU. A server's requests share its GPUs, so a stage cannot end before
    its busiest server has done its work, whatever the other GPUs do (a server of N data-parallel replicas is N times
    one's rate)."""
    hours: dict[str, dict[str, float]] = {}
    for item in work:
        if not item.api:
            by_backend = hours.setdefault(item.stage, {})
            hours_of = item.max_output_tokens / _rate(item.backend, rates) / 3600
            by_backend[item.backend] = by_backend.get(item.backend, 0.0) + hours_of
    return hours


def _step_hours(step: Training, rates: dict[str, float]) -> float:
    kind = "reward_model" if step.name in ("persona_rm", "group_rm") else step.name
    return step.steps * step.runs * rates[f"s_per_step/{kind}"] / 3600


def training_hours(steps: list[Training], rates: dict[str, float]) -> dict[str, float]:
    """Wall-clock hours of each stage's training, its steps one after another (processes train a step together)."""
    hours: dict[str, float] = {}
    for step in steps:
        hours[step.stage] = hours.get(step.stage, 0.0) + _step_hours(step, rates)
    return hours


def gpu_hours(work: list[Work], steps: list[Training], rates: dict[str, float]) -> dict[str, float]:
    """GPU-hours per stage: served tokens at each model's rate (in-process ones too, on the training GPU), and
    steps times seconds per step times the processes that run them."""
    hours = {stage: sum(by_backend.values()) for stage, by_backend in served_hours(work, rates).items()}
    for step in steps:
        hours[step.stage] = hours.get(step.stage, 0.0) + _step_hours(step, rates) * step.processes
    return hours


@dataclass(frozen=True)
class Shape:
    """A causal LM's parameters, counted on the meta device."""

    total: int  # every parameter once (a tied head shares the embedding's)
    linears: dict[str, tuple[int, int]]  # linear module name: (in_features, out_features)
    tied: bool

    @property
    def classifier(self) -> int:
        """Parameters of the sequence classifier on this base (a reward model): the language-model head replaced
        by a one-output score."""
        n_in, n_out = self.linears["lm_head"]
        return self.total - (0 if self.tied else n_in * n_out) + n_in

    def lora(self, r: int, targets: list[str]) -> int:
        return sum(r * (n_in + n_out) for module, (n_in, n_out) in self.linears.items()
                   if module.rsplit(".", 1)[-1] in targets)


def model_shape(model: str) -> Shape | None:
    """The model built on the meta device: no weights are read or allocated. None for a model whose shape is neither
    in MODEL_SHAPES nor in a local folder's config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    from mascot.torch_runtime import quiet_transformers, require_torch

    torch = require_torch()
    if model in MODEL_SHAPES:
        config = Qwen3Config(**MODEL_SHAPES[model])
    elif (Path(model) / "config.json").is_file():
        config = AutoConfig.from_pretrained(model)
    else:
        return None
    with torch.device("meta"), quiet_transformers():
        network = AutoModelForCausalLM.from_config(config)
    linears = {name: (m.in_features, m.out_features) for name, m in network.named_modules()
               if isinstance(m, torch.nn.Linear)}
    return Shape(sum(p.numel() for p in network.parameters()), linears, bool(config.tie_word_embeddings))


def memory(config: RunConfig, gpu_bytes: float = GPU_BYTES) -> list[Memory]:
    """Peak memory per GPU of each training step, counted: a reward model trains in full, in float32 with Adam
    (16 bytes a parameter: weights, gradients, two moments); a LoRA policy keeps its base frozen in bf16 (2 bytes,
    4 without bf16) and trains its adapter at 16; beside it sit TRL's colocated vLLM (its share of the GPU) and the
    step's scorers (the reward model in float32, and in the Director's trajectory mode an in-process copy of the
    policy, unless its snapshots are loaded into the base Director's server). Left out: activations, which
    gradient checkpointing keeps to about a layer's, the logits of a batch (batch x length x vocabulary in
    float32), the CUDA context (about 0.5 GB) and the allocator's fragmentation."""
    rows, t = [], config.train
    scorers = {name: model_shape(rm.model) for name, rm in (("persona_rm", t.persona_rm), ("group_rm", t.group_rm))
               if rm is not None}

    def scorer(name: str) -> int:  # the reward model in float32, as it was trained and saved
        found = scorers.get(name)
        return 0 if found is None else 4 * found.classifier

    for name, trainer in t.trainers.items():
        shape = model_shape(trainer.model)
        if shape is None:
            continue
        if isinstance(trainer, RewardModelConfig):
            rows.append(Memory(name, 16 * shape.classifier, 0, 0, 0))
            continue
        adapter = shape.lora(trainer.lora.r, trainer.lora.target_modules)
        engine = int(trainer.vllm_gpu_memory_utilization * gpu_bytes) if isinstance(trainer, GRPOPolicyConfig) \
            and trainer.use_vllm and trainer.vllm_mode == "colocate" else 0
        extra = scorer("persona_rm") if name == "speaker" else 0
        if name == "director":
            extra = scorer("group_rm")
            if config.stage2 is not None and config.stage2.episodes.mode == "trajectory" \
                    and not loads_adapters(config.stage2.director):  # else the snapshots are the server's
                extra += 2 * shape.total  # the policy snapshot, merged, in the checkpoint's bf16
        rows.append(Memory(name, 16 * adapter, (2 if trainer.bf16 else 4) * shape.total, engine, extra))
    return rows


def load_rates(path: Path | None) -> dict[str, float]:
    rates = dict(GUESSED_RATES)
    if path is not None:
        rates |= {key: float(value) for key, value in json.loads(path.read_text()).items()}
    return rates
