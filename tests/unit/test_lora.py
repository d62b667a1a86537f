"""The paper's adapter on the paper's architecture: Qwen3-8B built on the meta device (no weights)."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from mascot.config import RunConfig
from mascot.train.lora import count_trainable_parameters, peft_lora_config
from mascot.yamlio import load_validated

REPO = Path(__file__).resolve().parents[2]

# Published values of Qwen/Qwen3-8B's config.json.
QWEN3_8B = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1_000_000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}


def test_paper_lora_on_qwen3_8b_trains_0_187_percent():
    # The config alone (no corpus files needed): the adapter settings the paper profile trains with.
    paper = load_validated(REPO / "configs" / "paper.yaml", RunConfig, context={"base_dir": REPO / "configs"})
    lora = paper.train.speaker.lora
    with torch.device("meta"):
        model = get_peft_model(Qwen3ForCausalLM(Qwen3Config(**QWEN3_8B)), peft_lora_config(lora))
    counts = count_trainable_parameters(model)
    # r * (in + out) per adapted projection: q and o are 4096x4096, k and v 4096x1024 (8 KV heads).
    per_layer = lora.r * ((4096 + 4096) * 2 + (4096 + 1024) * 2)
    assert counts.trainable == 36 * per_layer == 15_335_424
    assert round(counts.fraction * 100, 3) == 0.187  # the paper reports 0.187%


SAVE_ADAPTER = """
import sys, torch
from peft import get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM
from mascot.config import LoraConfig
from mascot.train.lora import peft_lora_config
torch.manual_seed(0)
config = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8)
get_peft_model(Qwen3ForCausalLM(config), peft_lora_config(LoraConfig(r=2))).save_pretrained(sys.argv[1])
"""


def test_the_same_adapter_saved_by_two_processes_has_the_same_bytes_once_normalized(tmp_path):
    import os
    import subprocess
    import sys

    from mascot.train.lora import normalize_adapter_config

    raw, normalized = set(), set()
    for salt in range(6):  # string hashing is salted per process, so PEFT's set of modules comes out in any order
        folder = tmp_path / f"salt{salt}"
        subprocess.run([sys.executable, "-c", SAVE_ADAPTER, str(folder)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": str(salt)})
        raw.add((folder / "adapter_config.json").read_text())
        normalize_adapter_config(folder)
        normalized.add(b"".join((folder / name).read_bytes() for name in ("adapter_config.json",
                                                                          "adapter_model.safetensors")))
    assert len(raw) > 1  # the problem is real: PEFT alone wrote different configs
    assert len(normalized) == 1
