"""GPU smoke test: a few LoRA GRPO steps on a Qwen3-8B-shaped model with random weights, then vLLM with the adapter.

    python benchmarks/gpu_smoke.py [--layers 36 --steps 3 --generations 4 --prompts-per-step 2 --tokens 128 \
                                    --vllm-prompts 32 --vllm-memory 0.5 --vllm-eager --no-vllm]

Needs a CUDA GPU (an H100 or H200) and nothing from the hub: the model is built from Qwen3-8B's shape
(`transformers.Qwen3Config`) with random bf16 weights directly on the GPU, and the tokenizer is the tiny
profile's, built offline (`mascot.train.tiny`; its ids all index the big embedding). It puts the
project's default LoRA (r=16 on q/k/v/o_proj) on it with PEFT, runs `--steps` GRPO steps with TRL's
GRPOTrainer as `mascot.train.grpo` calls it, and prints the trainable fraction, the peak GPU memory,
the time per optimisation step and the completion tokens generated per second of step time. If vLLM
is installed, it then serves the same shape with the trained adapter (`LoRARequest`) and prints its
tokens per second; and starts `vllm serve` with VLLM_ALLOW_RUNTIME_LORA_UPDATING, loads the adapter into it as
the flows do (`mascot.llm.served_adapters.serve_adapter`) and sends it one request. The last block is a summary
to paste into benchmarks/README.md.

Random weights sample near-uniformly over 151,936 ids, so completions run to `--tokens` and most of
their ids decode to nothing with the tiny tokenizer: the figures are about speed and memory only.
Without a GPU it prints what it would run and exits with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = [
    "I failed my driving test this morning and I feel stupid.",
    "My best friend is moving to another country next month.",
    "Can you help me plan a calm evening after a long week?",
    "I got the job! I start on Monday and I am nervous.",
    "My dog has been sick for three days and the vet is closed.",
    "We keep arguing about chores at home. How do we stop?",
    "I can't sleep before my exam tomorrow.",
    "Our team meeting ran two hours over again. What should I say to my manager?",
]


def qwen3_8b_config(layers: int, tokenizer):
    """Qwen3-8B's published shape (config.json of Qwen/Qwen3-8B), with `layers` decoder layers."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3ForCausalLM"],
    )


def random_model(config):
    """Random bf16 weights allocated on the GPU itself: 16 GB never passes through host memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def reply_length(completions, **kwargs) -> list[float]:
    """Characters of each reply: any reward that differs within a group gives GRPO something to learn."""
    return [float(len(c if isinstance(c, str) else c[-1]["content"])) for c in completions]


def step_timer():
    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall seconds of each optimisation step: generation, scoring, forward, backward and optimizer."""

        def __init__(self):
            self.seconds: list[float] = []
            self._began = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()  # the optimizer's kernels are only queued when the step returns
            self.seconds.append(time.perf_counter() - self._began)

    return StepTimer()


def grpo_steps(model, tokenizer, args, workdir: Path):
    """`args.steps` GRPO steps with LoRA, configured as `mascot.train.grpo.train_grpo_policy` does."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from mascot.config import GRPOPolicyConfig
    from mascot.train.lora import peft_lora_config
    from mascot.train.runtime import device_args, metrics_on_progress_bar

    policy = GRPOPolicyConfig(model="random Qwen3-8B shape", bf16=True, batch_size=args.prompts_per_step * args.generations,
                              num_generations=args.generations, max_completion_length=args.tokens, max_steps=args.steps,
                              seed=0)
    config = GRPOConfig(
        output_dir=str(workdir / "checkpoints"), learning_rate=policy.learning_rate, max_steps=policy.max_steps,
        per_device_train_batch_size=policy.batch_size, gradient_accumulation_steps=policy.gradient_accumulation_steps,
        num_generations=policy.num_generations, max_completion_length=policy.max_completion_length,
        temperature=policy.temperature, top_p=policy.top_p, beta=policy.beta, save_strategy="no", logging_steps=1,
        report_to="none", seed=policy.seed, gradient_checkpointing=policy.gradient_checkpointing, **device_args(policy),
    )
    timer = step_timer()
    # The model object, not a path: TRL wraps it with the peft_config, and no 16 GB checkpoint is written.
    trainer = GRPOTrainer(
        model=model, args=config, train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": p}]}
                                                                    for p in PROMPTS]),
        reward_funcs=[reply_length], processing_class=tokenizer, peft_config=peft_lora_config(policy.lora),
        callbacks=[timer],
    )
    metrics_on_progress_bar(trainer, ["reward", "completions/mean_length", "step_time"])
    return trainer, timer


def training_figures(trainer, timer) -> dict:
    """Step time and completion tokens a second over the steps after the first, which also warms up kernels."""
    lengths = {entry["step"]: entry["completions/mean_length"] for entry in trainer.state.log_history
               if "completions/mean_length" in entry}
    tokens = [lengths.get(step, 0.0) * trainer.args.generation_batch_size for step in range(1, len(timer.seconds) + 1)]
    timed = slice(1, None) if len(timer.seconds) > 1 else slice(None)
    seconds = sum(timer.seconds[timed])
    return {"step_s": seconds / len(timer.seconds[timed]), "first_step_s": timer.seconds[0],
            "tokens_per_s": sum(tokens[timed]) / seconds, "steps_timed": len(timer.seconds[timed]),
            "beta": trainer.args.beta}


def vllm_generate(folder: Path, adapter: Path, args) -> str:
    """vLLM tokens a second with the trained adapter, or why this part was skipped."""
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        return f"skipped: vLLM is not installed ({exc}); pip install 'mascot[serve]'"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                             tokenize=False, add_generation_prompt=True)
               for i in range(args.vllm_prompts)]
    # load_format="dummy": vLLM draws its own random weights for the shape in config.json, as good as ours for
    # timing, instead of reading 16 GB back from disk. Only the adapter is read.
    llm = LLM(model=str(folder), dtype="bfloat16", load_format="dummy", enable_lora=True, max_lora_rank=16,
              max_model_len=2048, gpu_memory_utilization=args.vllm_memory, enforce_eager=args.vllm_eager, seed=0)
    # Random weights sample ids the tiny tokenizer lacks, so the ids are counted and never detokenized.
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, detokenize=False, seed=0)
    lora = LoRARequest("smoke", 1, str(adapter))
    llm.generate(prompts[:2], params, lora_request=lora, use_tqdm=False)  # warm-up: loads the adapter
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
    seconds = time.perf_counter() - began
    tokens = sum(len(completion.token_ids) for output in outputs for completion in output.outputs)
    return (f"{tokens / seconds:,.0f} tokens/s ({len(prompts)} prompts x {args.tokens} tokens in {seconds:.2f} s, "
            f"LoRA r=16, vllm {vllm.__version__}{', eager' if args.vllm_eager else ', CUDA graphs'})")


def vllm_runtime_load(folder: Path, adapter: Path, args) -> str:
    """The flow's adapter step against a real vLLM server: `vllm serve` the same shape with runtime LoRA loading,
    load the trained adapter through `mascot.llm.served_adapters` (the `serve_adapter` task's library call) and
    send it one chat request; or why this part was skipped."""
    import shutil
    import subprocess
    import urllib.request

    from mascot.artifacts import Artifact, path_sha256
    from mascot.config import BackendConfig, SamplingParams
    from mascot.llm import OpenAIBackend
    from mascot.llm.served_adapters import serve_adapter

    if shutil.which("vllm") is None:
        return "skipped: the vllm command is not installed"
    port = 8765
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    command = ["vllm", "serve", str(folder), "--port", str(port), "--load-format", "dummy", "--enable-lora",
               "--max-lora-rank", "16", "--max-model-len", "2048", "--gpu-memory-utilization", str(args.vllm_memory),
               "--enforce-eager"]
    with (folder.parent / "vllm-serve.log").open("wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        began = time.perf_counter()
        while True:
            if server.poll() is not None or time.perf_counter() - began > 600:
                return f"failed: vllm serve did not start; {(folder.parent / 'vllm-serve.log').read_text()[-1500:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(2)
        started = time.perf_counter() - began
        config = BackendConfig(kind="openai", model=str(folder), base_url=f"http://127.0.0.1:{port}/v1",
                               load_adapter=True, max_retries=0)
        began = time.perf_counter()
        served = serve_adapter(config, "speaker", Artifact(path=adapter, sha256=path_sha256(adapter)), folder.parent)
        loaded = time.perf_counter() - began
        backend = OpenAIBackend(served.model, base_url=served.base_url, max_retries=0)
        began = time.perf_counter()
        asyncio.run(backend.generate([{"role": "user", "content": PROMPTS[0]}], 1,
                                     SamplingParams(max_new_tokens=16), seed=0))
        answered = time.perf_counter() - began
        return (f"server up in {started:.0f} s; runtime load of {served.model} in {loaded:.2f} s (listed by /v1/models); "
                f"one chat request to it answered in {answered:.2f} s")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=36, help="Decoder layers (Qwen3-8B has 36; fewer for a quick try).")
    parser.add_argument("--steps", type=int, default=3, help="GRPO optimisation steps.")
    parser.add_argument("--generations", type=int, default=4, help="Completions per prompt (the GRPO group).")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="Prompts per step; each gets --generations.")
    parser.add_argument("--tokens", type=int, default=128, help="Longest completion, in tokens (GRPO and vLLM).")
    parser.add_argument("--vllm-prompts", type=int, default=32, help="Prompts in vLLM's timed batch.")
    parser.add_argument("--vllm-memory", type=float, default=0.5,
                        help="vLLM's gpu_memory_utilization; what training left allocated must fit beside it.")
    parser.add_argument("--vllm-eager", action="store_true", help="Skip vLLM's compilation and CUDA graphs "
                        "(starts faster, decodes slower).")
    parser.add_argument("--no-vllm", action="store_true", help="Skip the vLLM part even if vLLM is installed.")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print(f"gpu_smoke.py needs a CUDA GPU and torch sees none: it would build a Qwen3-8B-shaped model "
              f"({args.layers} layers, random bf16 weights) on the GPU, run {args.steps} LoRA GRPO steps with TRL "
              f"and then generate with vLLM if installed.", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machines have no network: fail fast, never wait
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import peft
    import transformers
    import trl
    from transformers import AutoTokenizer

    from mascot.config import CacheConfig, TinyModelSpec
    from mascot.train.lora import count_trainable_parameters
    from mascot.train.tiny import build_tiny_models

    # Only the tokenizer is wanted, and it does not depend on the warm start: skip its 300 CPU steps.
    tiny = build_tiny_models(TinyModelSpec(warm_start_steps=0), CacheConfig().root, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny.lm)
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        workdir = Path(tmp)
        began = time.perf_counter()
        model = random_model(qwen3_8b_config(args.layers, tokenizer))
        parameters = sum(p.numel() for p in model.parameters())
        print(f"built {parameters:,} random bf16 parameters on the GPU in {time.perf_counter() - began:.1f} s")
        # What vLLM needs to build the same shape: config, generation config and tokenizer, no weights.
        model.config.save_pretrained(workdir / "model")
        model.generation_config.save_pretrained(workdir / "model")
        tokenizer.save_pretrained(workdir / "model")

        torch.cuda.reset_peak_memory_stats()
        trainer, timer = grpo_steps(model, tokenizer, args, workdir)
        trainable = count_trainable_parameters(trainer.model)
        print(f"LoRA r=16 on q/k/v/o_proj: {trainable}")
        trainer.train()
        peak = torch.cuda.max_memory_allocated() / 2**30
        figures = training_figures(trainer, timer)
        trainer.model.save_pretrained(str(workdir / "adapter"))  # the PEFT adapter alone
        del trainer, model
        gc.collect()  # vLLM allocates its share of the GPU next: hand back what training held
        torch.cuda.empty_cache()
        vllm_line = "skipped: --no-vllm" if args.no_vllm else vllm_generate(workdir / "model", workdir / "adapter", args)
        gc.collect()  # the offline engine's share of the GPU goes back before a server takes its own
        torch.cuda.empty_cache()
        serve_line = "skipped: --no-vllm" if args.no_vllm else vllm_runtime_load(workdir / "model",
                                                                                  workdir / "adapter", args)

    completions = args.prompts_per_step * args.generations
    print("\n--- gpu_smoke summary ---")
    print(f"device: {torch.cuda.get_device_name()}")
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"peft {peft.__version__}")
    print(f"model: Qwen3-8B shape, {args.layers} decoder layers, {parameters:,} random bf16 parameters, tiny tokenizer")
    print(f"trainable: {trainable}")
    print(f"GRPO: {args.steps} steps of {completions} completions ({args.prompts_per_step} prompts x "
          f"{args.generations}), up to {args.tokens} tokens, gradient checkpointing, beta {figures['beta']}")
    print(f"peak GPU memory: {peak:.1f} GiB (torch.cuda.max_memory_allocated, training)")
    print(f"step time: {figures['step_s']:.2f} s (mean of the last {figures['steps_timed']} steps; first step "
          f"{figures['first_step_s']:.2f} s)")
    print(f"training tokens/s: {figures['tokens_per_s']:,.0f} (completion tokens per second of step time)")
    print(f"vLLM: {vllm_line}")
    print(f"vLLM server, adapter loaded at runtime: {serve_line}")


if __name__ == "__main__":
    main()
