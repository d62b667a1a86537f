"""Run configuration: pydantic models for `configs/*.yaml`, one module per concept.

    config = load_config("configs/tiny.yaml")   # RunConfig, or ConfigError listing every problem

`base` holds what every section shares; `backends`, `data`, `training`, `stage1` and `stage2` the sections;
`run` the whole run; `loading` the checks of the files a config points at. Nothing here imports
the judges, the trainers or any stage: configs sit at the bottom of the package.
"""

from mascot.config.backends import BackendConfig, JudgeConfig, SamplingParams
from mascot.config.base import SAMPLES_DIR, TINY_MODELS, Section
from mascot.config.chat import ChatConfig, CrisisClassifierConfig, ModerationConfig, SafetyConfig
from mascot.config.data import CORPUS_DOMAIN, CorpusConfig, DataConfig
from mascot.config.gpus import GpuMap
from mascot.config.loading import load_any, load_config
from mascot.config.run import (
    CacheConfig,
    RunConfig,
    RunnerConfig,
    RunSection,
    TinyModelSpec,
    TrackingConfig,
    TrainConfig,
)
from mascot.config.stage1 import BeforeAfterConfig, SpeakerConfig, SpeakerRewardWeights, Stage1Config
from mascot.config.stage2 import (
    DirectorConfig,
    DirectorDPOConfig,
    DirectorEvalConfig,
    DirectorRewardWeights,
    EpisodeConfig,
    Stage2Config,
)
from mascot.config.training import GRPOPolicyConfig, LoraConfig, RewardModelConfig, TrainerConfig

__all__ = [
    "CORPUS_DOMAIN",
    "SAMPLES_DIR",
    "TINY_MODELS",
    "BackendConfig",
    "BeforeAfterConfig",
    "CacheConfig",
    "ChatConfig",
    "CorpusConfig",
    "CrisisClassifierConfig",
    "DataConfig",
    "DirectorConfig",
    "DirectorDPOConfig",
    "DirectorEvalConfig",
    "DirectorRewardWeights",
    "EpisodeConfig",
    "GRPOPolicyConfig",
    "GpuMap",
    "JudgeConfig",
    "LoraConfig",
    "ModerationConfig",
    "RewardModelConfig",
    "RunConfig",
    "RunSection",
    "RunnerConfig",
    "SafetyConfig",
    "SamplingParams",
    "Section",
    "SpeakerConfig",
    "SpeakerRewardWeights",
    "Stage1Config",
    "Stage2Config",
    "TinyModelSpec",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
    "load_any",
    "load_config",
]
