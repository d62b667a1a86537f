"""One sampling distribution: top-k and min-p reach TRL's GRPO rollouts and the in-process decoder as the config
sets them, so the Speaker's rollouts are drawn as the candidates its reward model learned from were."""

from __future__ import annotations

import pytest

from mascot.config import SamplingParams


def draws(probabilities: list[float], params: SamplingParams, count: int = 400) -> set[int]:
    """The tokens the in-process decoder's sampler draws from one row of `probabilities`, with `count` seeds."""
    import torch

    from mascot.llm.batched_decoding import _sample

    logits = torch.tensor([probabilities]).log().expand(count, -1)
    generators = [torch.Generator().manual_seed(seed) for seed in range(count)]
    return set(_sample(logits, [params] * count, generators))


FLAT = [0.3, 0.25, 0.2, 0.1, 0.08, 0.07]  # token 0 likeliest, token 5 least likely


def test_the_in_process_sampler_keeps_the_top_k_and_the_tokens_above_min_p():
    whole = SamplingParams(temperature=1.0, top_p=1.0)
    assert draws(FLAT, whole) == set(range(6))  # every token is drawn in 400 tries without a filter
    assert draws(FLAT, whole.model_copy(update={"top_k": 2})) == {0, 1}
    assert draws(FLAT, whole.model_copy(update={"top_k": 1})) == {0}
    # min_p 0.5 keeps the tokens at least half as likely as token 0 (0.3): 0.25 and 0.2, not 0.1
    assert draws(FLAT, whole.model_copy(update={"min_p": 0.5})) == {0, 1, 2}
    # top-p is taken of the mass the filters leave: of {0, 1, 2} (0.75), 0.7 of it needs tokens 0 and 1 and part of 2
    assert draws(FLAT, whole.model_copy(update={"min_p": 0.5, "top_p": 0.5})) == {0, 1}


def test_a_row_samples_the_same_whatever_the_filters_of_the_rows_beside_it():
    """Generation is reproducible by request: a row without filters draws what it drew alone."""
    import torch

    from mascot.llm.batched_decoding import _sample

    logits = torch.tensor([FLAT, FLAT]).log()
    plain, filtered = SamplingParams(temperature=1.0, top_p=1.0), SamplingParams(temperature=1.0, top_p=1.0, top_k=1)
    for seed in range(50):
        alone = _sample(logits[:1], [plain], [torch.Generator().manual_seed(seed)])
        beside = _sample(logits, [plain, filtered], [torch.Generator().manual_seed(seed), torch.Generator()])
        assert beside[0] == alone[0] and beside[1] == 0


@pytest.fixture(scope="module")
def untrained_lm(tiny_config, tmp_path_factory):
    """The tiny language model without its warm start: this checks arguments, not what the model says."""
    from mascot.train.tiny import build_tiny_models

    spec = tiny_config.tiny.model_copy(update={"warm_start_steps": 0})
    return build_tiny_models(spec, tmp_path_factory.mktemp("tiny"), progress=False).lm


@pytest.mark.parametrize("top_k, min_p, trl_top_k", [(20, 0.05, 20), (None, None, 0)])
def test_grpo_rollouts_sample_as_the_config_says(untrained_lm, tiny_config, tmp_path, top_k, min_p, trl_top_k):
    """TRL's generation arguments, as the project builds its GRPOTrainer, carry the policy's sampling parameters;
    unset, TRL samples the whole vocabulary (its top_k 0), as the in-process backend and `vllm serve
    --generation-config vllm` do."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from mascot.train.grpo import grpo_args, policy_backend

    policy = tiny_config.train.speaker.model_copy(update={
        "model": str(untrained_lm), "temperature": 0.7, "top_p": 0.9, "top_k": top_k, "min_p": min_p,
        "batch_size": 2, "num_generations": 2, "max_steps": 1})
    trainer = GRPOTrainer(
        model=policy.model, args=grpo_args(policy, tmp_path / "checkpoints", [1.0]),
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "I feel stuck."}]}] * 2),
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        processing_class=AutoTokenizer.from_pretrained(policy.model))
    built = {name: trainer.generation_kwargs[name] for name in ("temperature", "top_p", "top_k", "min_p")}
    assert built == {"temperature": 0.7, "top_p": 0.9, "top_k": trl_top_k, "min_p": min_p}
    # The same policy sampled in this process (Stage 2's later directives, the before/after comparison)
    params = policy_backend(policy).params
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, top_k, min_p)
