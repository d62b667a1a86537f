"""The policy being trained, as the GRPO Director's rollouts sample it: one adapter folder per optimisation
step, holding that step's weights, the previous one removed and its loaded copy released."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from mascot.config import SamplingParams
from mascot.llm import TransformersBackend
from mascot.llm import transformers_backend as backend_module
from mascot.train.grpo import PolicySnapshots


def lora_policy(base):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def sample(base, adapter) -> list[str]:
    messages = [{"role": "user", "content": "Who speaks next?"}]
    return asyncio.run(TransformersBackend(base, adapter=adapter, device="cpu").generate(
        messages, n=1, params=SamplingParams(temperature=0.0, max_new_tokens=8), seed=0))


def test_each_step_gets_a_snapshot_of_the_weights_as_they_stand_and_the_last_one_is_released(tmp_path, tiny_models):
    policy = lora_policy(tiny_models.lm)
    trainer = SimpleNamespace(model=policy, state=SimpleNamespace(global_step=0), args=SimpleNamespace(process_index=0))
    snapshots = PolicySnapshots(tmp_path / "policy")
    snapshots.trainer = trainer

    first = snapshots.current()
    assert first.name == "step-000000" and snapshots.current() == first  # once per step
    before = sample(tiny_models.lm, first)
    assert any(key[1] == str(first) for key in backend_module._LOADED)

    # A step of training moves the adapter: the next snapshot holds the new weights, and samples differ.
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    trainer.state.global_step = 1
    second = snapshots.current()
    assert second.name == "step-000001" and not first.exists()
    assert not any(key[1] == str(first) for key in backend_module._LOADED)  # its loaded copy was released
    saved = load_file(second / "adapter_model.safetensors")
    trained = {name: p for name, p in policy.named_parameters() if "lora_B" in name}
    assert len(trained) == len([key for key in saved if "lora_B" in key])
    for name, parameter in trained.items():
        key = name.replace(".default", "")
        assert torch.equal(saved[key], parameter.detach()), key
    assert sample(tiny_models.lm, second) != before
