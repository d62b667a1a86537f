"""Models that leave memory: a model loaded during a step is released when the step ends (the registry of loaded
models is empty again, the model object is freed, the CUDA cache emptied), and TRL's vLLM memory settings reach
the GRPOConfig the trainer is built with. The models are the real tiny ones, loaded and decoding."""

from __future__ import annotations

import asyncio
import weakref

import pytest

from mascot.config import SamplingParams
from mascot.llm import TransformersBackend
from mascot.llm import transformers_backend as registry
from mascot.train.grpo import grpo_args
from mascot.train.launch import launched

MESSAGES = [{"role": "user", "content": "How are you?"}]


@pytest.fixture(scope="module")
def tiny_models(tiny_config, tmp_path_factory):
    """The tiny models of configs/tiny.yaml without their warm start (seconds, not minutes, to build): what is
    loaded and released here is real weights and a real tokenizer, whatever they say."""
    from mascot.train.tiny import build_tiny_models

    spec = tiny_config.tiny.model_copy(update={"warm_start_steps": 0})
    return build_tiny_models(spec, tmp_path_factory.mktemp("unwarmed"), progress=False)


def _generate(model: str) -> list[str]:
    backend = TransformersBackend(model, device="cpu")
    return asyncio.run(backend.generate(MESSAGES, n=1, params=SamplingParams(temperature=0.0, max_new_tokens=4),
                                        seed=0))


def test_the_registry_is_empty_after_each_training_step(tiny_models, tiny_config):
    registry.release_models()
    inside, freed = [], []

    def step(model: str) -> str:  # a training step that loads a model for its rewards, as the scorers do
        texts = _generate(model)
        inside.append(registry.loaded_models())
        freed.append(weakref.ref(registry.load_model(str(model), None, "cpu").model))
        return texts[0]

    for _ in range(2):  # each step loads the model afresh and leaves with it
        launched(tiny_config.train.speaker, step, tiny_models.lm)
        assert registry.loaded_models() == []
        assert freed[-1]() is None, "the model's weights are still referenced after the step"
    assert inside == [[(str(tiny_models.lm), None, "cpu")]] * 2


def test_a_model_loaded_before_the_step_stays_and_the_cuda_cache_is_emptied(tiny_models, monkeypatch):
    import torch

    registry.release_models()
    _generate(tiny_models.lm)  # loaded by something that outlives the step (shards of another step)
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    with registry.models_released():
        registry.load_model(str(tiny_models.rm), None, "cpu")
        assert len(registry.loaded_models()) == 2
    assert registry.loaded_models() == [(str(tiny_models.lm), None, "cpu")] and emptied == [True]
    registry.release_models()
    assert registry.loaded_models() == [] and emptied == [True, True]


def test_trls_vllm_memory_settings_reach_the_grpo_config(tmp_path, tiny_config):
    speaker = tiny_config.train.speaker.model_copy(update={
        "vllm_gpu_memory_utilization": 0.45, "vllm_enable_sleep_mode": True, "vllm_max_model_length": 3072})
    args = grpo_args(speaker, tmp_path / "checkpoints", [1.0, 0.5, 0.5])
    assert args.vllm_gpu_memory_utilization == 0.45
    assert args.vllm_enable_sleep_mode is True
    assert args.vllm_max_model_length == 3072
    default = grpo_args(tiny_config.train.speaker, tmp_path / "checkpoints", [1.0, 0.5, 0.5])
    assert (default.vllm_gpu_memory_utilization, default.vllm_enable_sleep_mode, default.vllm_max_model_length) == (
        0.3, False, None)
