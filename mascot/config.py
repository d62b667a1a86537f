"""Run configuration: one `RunConfig` validates a whole run from `configs/*.yaml`.

Relative paths in a config are relative to the config file's folder. `samples:NAME` points at the
sample corpora shipped inside the package (`mascot/data/samples/NAME`). Model references are
either a Hugging Face model id or local directory (`Qwen/Qwen3-8B`, `/models/speaker`), or one of
the tiny offline models built by `mascot.train.tiny` (`tiny:lm`, `tiny:rm`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mascot.judges.rubrics import load_rubric
from mascot.roster import Roster, UserProfiles, load_roster, load_user_profiles
from mascot.yamlio import ConfigError, Problem, load_validated, read_yaml

SAMPLES_DIR = Path(__file__).parent / "data" / "samples"
TINY_MODELS = ("tiny:lm", "tiny:rm")
CORPUS_DOMAIN = {"empathetic_dialogues": "emotional_support", "esconv": "emotional_support", "qmsum": "meetings"}

RunName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def resolve_path(value: str | Path | None, info: ValidationInfo) -> Path | None:
    """Resolve `samples:` references and paths relative to the config file's folder."""
    if value is None:
        return None
    text = str(value)
    if text.startswith("samples:"):
        return SAMPLES_DIR / text.removeprefix("samples:")
    path = Path(text).expanduser()
    base = (info.context or {}).get("base_dir")
    return path if path.is_absolute() or base is None else Path(os.path.normpath(Path(base) / path))


class RunSection(Section):
    name: RunName = Field(description="Run name; artifacts go to `<output_dir>/<name>/`.")
    seed: int = Field(default=0, ge=0, description="Seed for sampling, subsampling and training.")
    output_dir: Path = Field(default=Path("runs"), description="Parent folder of run directories.")

    _resolve = field_validator("output_dir", mode="before")(resolve_path)


class CorpusConfig(Section):
    source: Literal["empathetic_dialogues", "qmsum", "esconv"] = Field(description="Which corpus loader to use.")
    path: Path | None = Field(default=None, description="Local file or folder in the corpus's release format.")
    hub_name: str | None = Field(default=None, description="Hugging Face dataset name (needs network access).")
    split: Literal["train", "validation", "test"] = Field(default="train", description="Corpus split to read.")
    limit: int | None = Field(default=None, ge=1, description="Keep at most this many contexts (seeded subsample).")
    window_turns: int = Field(default=16, ge=2, description="QMSum: turns per meeting window.")
    window_stride: int | None = Field(default=None, ge=1, description="QMSum: window stride (default: no overlap).")

    _resolve = field_validator("path", mode="before")(resolve_path)

    @model_validator(mode="after")
    def _one_location(self) -> CorpusConfig:
        if (self.path is None) == (self.hub_name is None):
            raise ValueError("set exactly one of 'path' (local files) or 'hub_name' (Hugging Face dataset)")
        return self


class DataConfig(Section):
    domain: Literal["emotional_support", "meetings"] = Field(description="Which companion domain this run trains.")
    roster: Path = Field(description="Roster YAML with the personas.")
    users: Path | None = Field(default=None, description="Simulated-user profiles YAML (Stage 2).")
    corpus: CorpusConfig = Field(description="Training contexts.")
    held_out: list[CorpusConfig] = Field(default_factory=list, description="Evaluation-only corpora.")

    _resolve = field_validator("roster", "users", mode="before")(resolve_path)


class SamplingParams(Section):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="Sampling temperature.")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(default=256, ge=1, le=32768, description="Longest reply, in tokens.")
    stop: list[str] = Field(default_factory=list, description="Extra stop strings.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Chat-template variables, e.g. `{enable_thinking: false}` for Qwen3."
    )


class BackendConfig(Section):
    kind: Literal["transformers", "openai", "anthropic", "google"] = Field(
        description="In-process transformers, an OpenAI-compatible server, or the Anthropic or Google API."
    )
    model: str = Field(min_length=1, description="Model id or path; for servers, the served model name.")
    adapter: Path | None = Field(default=None, description="PEFT adapter folder (transformers backend).")
    base_url: str | None = Field(default=None, description="Server URL; for openai it ends in /v1 (default: the vendor's API).")
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the API key (default: OPENAI_API_KEY, "
        "ANTHROPIC_API_KEY, or GOOGLE_API_KEY then GEMINI_API_KEY, by kind)."
    )
    max_concurrency: int = Field(default=16, ge=1, description="Requests in flight at once.")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request timeout in seconds.")
    max_retries: int = Field(default=4, ge=0, description="Retries with exponential backoff per request.")
    device: str = Field(default="auto", description="transformers backend: 'auto', 'cpu', 'cuda', 'cuda:1'...")
    params: SamplingParams = Field(default_factory=SamplingParams, description="Default sampling parameters.")

    _resolve = field_validator("adapter", mode="before")(resolve_path)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL such as http://127.0.0.1:8000/v1")
        return value

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> BackendConfig:
        if self.kind == "transformers" and self.base_url is not None:
            raise ValueError("'base_url' is for servers; kind: transformers runs the model in this process")
        if self.kind != "transformers" and self.adapter is not None:
            raise ValueError("'adapter' is only used with kind: transformers; serve adapters with vLLM --lora-modules")
        return self


class JudgeConfig(Section):
    kind: Literal["heuristic", "llm"] = Field(description="The offline heuristic judge, or an LLM judge.")
    name: str | None = Field(default=None, description="Label in artifacts (default: the backend model or 'heuristic').")
    backend: BackendConfig | None = Field(default=None, description="LLM judges: the model that judges.")
    max_attempts: int = Field(default=3, ge=1, description="LLM judges: tries per candidate before recording a failure.")

    @model_validator(mode="after")
    def _backend_for_llm_judges(self) -> JudgeConfig:
        if self.kind == "llm" and self.backend is None:
            raise ValueError("an 'llm' judge needs 'backend' (kind, model and, for servers, base_url)")
        if self.kind == "heuristic" and self.backend is not None:
            raise ValueError("the heuristic judge takes no 'backend'")
        return self

    @property
    def label(self) -> str:
        return self.name or (self.backend.model if self.backend else self.kind)


class Stage1Config(Section):
    k: int = Field(default=8, ge=2, description="Candidates sampled per (context, persona) query.")
    margin: float = Field(default=0.5, ge=0.0, description="Minimum overall-score gap for a preference pair.")
    shard_size: int = Field(default=32, ge=1, description="Queries per cached sampling/judging shard.")
    max_pairs_per_query: int | None = Field(default=None, ge=1, description="Optional cap on pairs per query.")
    judges: list[JudgeConfig] = Field(min_length=1, description="Judge panel scoring every candidate.")
    rubric: Path = Field(description="Rubric YAML with the criteria and their 1-5 anchors.")
    aggregation: Literal["mean", "zscore"] = Field(
        default="mean", description="How a panel's overall scores combine: mean, or mean of per-judge z-scores."
    )
    max_judge_failure_rate: float = Field(
        default=0.1, ge=0.0, le=1.0, description="Fail the run when more judgments than this share fail."
    )

    _resolve = field_validator("rubric", mode="before")(resolve_path)

    @model_validator(mode="after")
    def _judge_names_unique(self) -> Stage1Config:
        labels = [j.label for j in self.judges]
        if len(set(labels)) != len(labels):
            raise ValueError(f"judge names must be unique, got {labels}; set 'name' to tell them apart")
        return self


class LoraConfig(Section):
    r: int = Field(default=16, ge=1, description="LoRA rank.")
    alpha: int = Field(default=32, ge=1, description="LoRA scaling numerator.")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="Module names that get adapters.",
    )


class RewardModelTrainConfig(Section):
    """TRL RewardTrainer settings for a scalar reward model trained on preference pairs."""

    learning_rate: float = Field(default=1e-5, gt=0, description="Peak learning rate.")
    epochs: float = Field(default=1.0, gt=0, description="Passes over the training pairs.")
    batch_size: int = Field(default=8, ge=1, description="Pairs per device per step.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Steps accumulated per update.")
    max_length: int = Field(default=1024, ge=16, description="Longest prompt + reply in tokens; longer pairs are dropped.")
    save_steps: int = Field(default=100, ge=1, description="Checkpoint every this many steps (resume point).")


class RewardWeights(Section):
    persona_rm: float = Field(default=1.0, description="Weight of the persona reward model's score.")
    format: float = Field(default=0.5, description="Weight of the format reward (0 to 1).")
    conciseness: float = Field(default=0.5, description="Weight of the conciseness reward (0 to 1).")


class SpeakerTrainConfig(Section):
    """TRL GRPOTrainer settings for the Speaker (one LoRA adapter shared by every persona)."""

    learning_rate: float = Field(default=1e-5, gt=0, description="Peak learning rate.")
    max_steps: int = Field(default=200, ge=1, description="GRPO optimisation steps.")
    batch_size: int = Field(default=8, ge=1, description="Completions per device per step.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Steps accumulated per update.")
    num_generations: int = Field(default=8, ge=2, description="Completions sampled per prompt (the GRPO group).")
    max_completion_length: int = Field(default=256, ge=1, description="Longest completion, in tokens.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of the rollouts.")
    beta: float = Field(default=0.04, ge=0, description="KL penalty towards the base policy (0 turns it off).")
    reward_weights: RewardWeights = Field(default_factory=RewardWeights, description="Weights of the reward terms.")
    min_words: int = Field(default=8, ge=0, description="Conciseness band: fewest words with full reward.")
    max_words: int = Field(default=80, ge=1, description="Conciseness band: most words with full reward.")
    save_steps: int = Field(default=50, ge=1, description="Checkpoint every this many steps (resume point).")

    @model_validator(mode="after")
    def _groups_fit_batches(self) -> SpeakerTrainConfig:
        generation_batch = self.batch_size * self.gradient_accumulation_steps
        if generation_batch % self.num_generations:
            raise ValueError(f"batch_size x gradient_accumulation_steps ({generation_batch}) must be divisible by "
                             f"num_generations ({self.num_generations}): GRPO scores whole groups of completions")
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})")
        return self


class BeforeAfterConfig(Section):
    """The held-out comparison of the base policy and the trained Speaker."""

    samples_per_prompt: int = Field(default=1, ge=1, description="Replies sampled per held-out prompt and policy.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Level of the bootstrap intervals.")
    bootstrap_resamples: int = Field(default=10000, ge=100, description="Resamples for the paired bootstrap.")


class TrainConfig(Section):
    held_out_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="Share of contexts kept out of RM and Speaker training, for evaluating them.",
    )
    persona_rm: RewardModelTrainConfig = Field(default_factory=RewardModelTrainConfig, description="Persona RM.")
    speaker: SpeakerTrainConfig = Field(default_factory=SpeakerTrainConfig, description="GRPO Speaker.")
    before_after: BeforeAfterConfig = Field(default_factory=BeforeAfterConfig, description="Evidence of learning.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="Adapter for the Speaker and Director.")
    bf16: bool = Field(default=False, description="Train in bfloat16 (GPU).")
    gradient_checkpointing: bool = Field(default=True, description="Recompute activations to save memory.")
    use_vllm: bool = Field(default=False, description="GRPO generation through vLLM (GPU, `serve` extra).")
    vllm_mode: Literal["colocate", "server"] = Field(default="colocate", description="TRL vLLM mode.")


class TinyModelSpec(Section):
    """Shape of the locally built tiny Qwen3 models (offline profile and tests)."""

    vocab_size: int = Field(default=2048, ge=300, le=65536, description="BPE vocabulary size to train.")
    hidden_size: int = Field(default=64, ge=8, description="Hidden width.")
    intermediate_size: int = Field(default=192, ge=8, description="MLP width.")
    num_hidden_layers: int = Field(default=2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(default=2, ge=1, description="Key/value heads (grouped-query attention).")
    max_position_embeddings: int = Field(default=2048, ge=64, description="Longest sequence.")
    warm_start_steps: int = Field(default=300, ge=0, description="Language-model steps on the sample dialogues.")
    seed: int = Field(default=0, ge=0, description="Seed for weight initialisation and the warm-start batch order.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")
        return self


class ModelsConfig(Section):
    speaker: str = Field(description="Speaker policy base model.")
    director: str = Field(description="Director policy base model.")
    persona_rm: str = Field(description="Base of the persona reward model.")
    group_rm: str = Field(description="Base of the group reward model.")


class TrackingConfig(Section):
    wandb_project: str = Field(default="mascot", description="wandb project name.")
    wandb_mode: Literal["online", "offline", "disabled"] = Field(default="offline", description="wandb mode.")


class CacheConfig(Section):
    dir: Path | None = Field(default=None, description="Request and model cache (default $MASCOT_CACHE_DIR or ~/.cache/mascot).")

    _resolve = field_validator("dir", mode="before")(resolve_path)

    @property
    def root(self) -> Path:
        return self.dir or Path(os.environ.get("MASCOT_CACHE_DIR", "~/.cache/mascot")).expanduser()


class RunConfig(Section):
    run: RunSection
    data: DataConfig
    models: ModelsConfig
    generation: BackendConfig = Field(description="Backend that samples Speaker candidates.")
    stage1: Stage1Config
    train: TrainConfig = Field(default_factory=TrainConfig)
    tiny: TinyModelSpec | None = Field(default=None, description="Needed when any model is 'tiny:lm' or 'tiny:rm'.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        judge_models = [j.backend.model for j in self.stage1.judges if j.backend is not None]
        refs = [*self.models.model_dump().values(), self.generation.model, *judge_models]
        unknown = [r for r in refs if r.startswith("tiny:") and r not in TINY_MODELS]
        if unknown:
            raise ValueError(f"unknown tiny model {unknown[0]!r}; expected one of {', '.join(TINY_MODELS)}")
        if self.tiny is None and any(r in TINY_MODELS for r in refs):
            raise ValueError("models refer to tiny:lm/tiny:rm, so a 'tiny' section is required")
        for corpus in [self.data.corpus, *self.data.held_out]:
            if CORPUS_DOMAIN[corpus.source] != self.data.domain:
                raise ValueError(f"corpus '{corpus.source}' belongs to domain '{CORPUS_DOMAIN[corpus.source]}', "
                                 f"but data.domain is '{self.data.domain}'")
        return self

    @property
    def run_dir(self) -> Path:
        return self.run.output_dir / self.run.name


def load_config(path: str | Path) -> RunConfig:
    """Validate a run config and the files it points at; raise ConfigError listing every problem."""
    path = Path(path)
    config = load_validated(path, RunConfig, context={"base_dir": path.resolve().parent})
    problems: list[Problem] = []
    roster = _collect(problems, load_roster, config.data.roster)
    if roster is not None and roster.domain != config.data.domain:
        problems.append(Problem(str(config.data.roster), None, "domain",
                                f"roster is for '{roster.domain}' but the config's data.domain is '{config.data.domain}'"))
    if config.data.users is not None:
        _collect(problems, load_user_profiles, config.data.users)
    rubric = _collect(problems, load_rubric, config.stage1.rubric)
    if rubric is not None and rubric.domain != config.data.domain:
        problems.append(Problem(str(config.stage1.rubric), None, "domain",
                                f"rubric is for '{rubric.domain}' but the config's data.domain is '{config.data.domain}'"))
    for where, corpus in [("data.corpus", config.data.corpus),
                          *((f"data.held_out[{i}]", c) for i, c in enumerate(config.data.held_out))]:
        if corpus.path is not None and not corpus.path.exists():
            problems.append(Problem(str(path), None, f"{where}.path", f"no such file or folder: {corpus.path}"))
    if problems:
        raise ConfigError(problems)
    return config


def _collect(problems: list[Problem], loader, target: Path):
    try:
        return loader(target)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None


def load_any(path: str | Path) -> RunConfig | Roster | UserProfiles:
    """Validate a run config, roster or user-profile file, telling which by its top-level keys."""
    data, _ = read_yaml(path)
    if isinstance(data, dict) and "personas" in data:
        return load_roster(path)
    if isinstance(data, dict) and "profiles" in data:
        return load_user_profiles(path)
    return load_config(path)
