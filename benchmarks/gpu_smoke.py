"""GPU smoke test: a few LoRA GRPO steps on a Qwen3-8B-shaped model with random weights, then vLLM with the adapter.

    python benchmarks/gpu_smoke.py [--layers 36 --steps 3 --generations 4 --prompts-per-step 2 --tokens 128 \
                                    --vllm-prompts 32 --vllm-memory 0.5 --vllm-eager --no-vllm \
                                    --no-colocate --colocate-memory 0.3 \
                                    --no-director-memory --paper-config configs/paper.yaml --director-prompt-tokens N]

Needs a CUDA GPU (an H100 or H200) and nothing from the hub: the model is built from Qwen3-8B's shape
(`transformers.Qwen3Config`) with random bf16 weights directly on the GPU, and the tokenizer is the tiny
profile's, built offline (`mascot.train.tiny`; its ids all index the big embedding). It puts the
project's default LoRA (r=16 on q/k/v/o_proj) on it with PEFT, runs `--steps` GRPO steps with TRL's
GRPOTrainer as `mascot.train.grpo` calls it, and prints the trainable fraction, the peak GPU memory,
the time per optimisation step and the completion tokens generated per second of step time. If vLLM
is installed, it then serves the same shape with the trained adapter (`LoRARequest`) and prints its
tokens per second; and starts `vllm serve` with VLLM_ALLOW_RUNTIME_LORA_UPDATING, loads the adapter into it as
the flows do (`mascot.llm.served_adapters.serve_adapter`) and sends it one request; and runs `--steps` GRPO steps
with TRL's colocated vLLM (`use_vllm`, `vllm_mode: colocate`, through `mascot.train.grpo.grpo_args`) on a fresh
model of the same shape. Before all that, on the empty GPU, it measures the Director step's peak memory at the
paper profile's shapes (all 36 layers, `train.director`'s batch, completion length and LoRA, prompts as long as
its vLLM window allows) and prints it beside `mascot plan`'s count of the same step. The last block is a summary
to paste into benchmarks/README.md. vLLM does not install beside the project's pins: run it from the environment
of deployments/vllm-requirements.txt with peft, polars and tenacity added, and `PYTHONPATH=.` (benchmarks/README.md).

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
import traceback
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
        return f"skipped: vLLM is not installed ({exc}); see deployments/vllm-requirements.txt"
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


def planned_director(config_path: Path, gpu_bytes: float):
    """The paper profile's Director trainer and `mascot plan`'s count of its step's peak memory on a GPU of
    `gpu_bytes` (the row `mascot plan --config configs/paper.yaml` prints)."""
    from mascot import plan as planning
    from mascot.config import RunConfig
    from mascot.yamlio import YamlDocument, validate_document

    config = validate_document(YamlDocument.read(config_path), RunConfig,
                               context={"base_dir": config_path.resolve().parent})
    [row] = [row for row in planning.memory(config, gpu_bytes) if row.name == "director"]
    return config.train.director, row


def director_step_memory(tokenizer, policy, prompt_tokens: int) -> dict:
    """Peak GPU memory of one Director GRPO micro-step at the paper's shapes, on a randomly initialised Qwen3-8B
    (all 36 layers, bf16) with the profile's LoRA: `batch_size` completions of `prompt_tokens` + the profile's
    `max_completion_length`, the log-probabilities of the completions under the base (adapter off, as TRL's
    reference when beta > 0) and under the policy, GRPO's loss with its KL term, backward and an AdamW step on the
    adapter. Generation and the scorers are not in it: those are TRL's engine and the reward models, which
    `mascot plan` counts apart."""
    import peft
    import torch
    from trl.trainer.utils import selective_log_softmax

    from mascot.train.lora import peft_lora_config

    model = random_model(qwen3_8b_config(36, tokenizer))
    model.config.use_cache = False
    policy_model = peft.get_peft_model(model, peft_lora_config(policy.lora))
    if policy.gradient_checkpointing:
        policy_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy_model.enable_input_require_grads()
    optimizer = torch.optim.AdamW([p for p in policy_model.parameters() if p.requires_grad], lr=policy.learning_rate)
    completion = policy.max_completion_length
    ids = torch.randint(0, model.config.vocab_size, (policy.batch_size, prompt_tokens + completion), device="cuda")
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def completion_logps():  # as GRPOTrainer computes them: the completion's logits only, over the temperature
        logits = policy_model(input_ids=ids, logits_to_keep=completion + 1).logits[:, :-1] / policy.temperature
        return selective_log_softmax(logits, ids[:, -completion:])

    began = time.perf_counter()
    reference = None
    if policy.beta:
        with torch.no_grad(), policy_model.disable_adapter():
            reference = completion_logps()
    logps = completion_logps()
    advantages = torch.randn(policy.batch_size, 1, device="cuda")
    loss = -(torch.exp(logps - logps.detach()) * advantages).mean()
    if reference is not None:
        loss = loss + policy.beta * (torch.exp(reference - logps) - (reference - logps) - 1).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return {"peak": torch.cuda.max_memory_allocated(), "resident": resident, "seconds": time.perf_counter() - began}


def director_memory_lines(tokenizer, args) -> list[str]:
    """The Director step measured at the paper's shapes beside `mascot plan`'s count of it."""
    import torch

    gib = 2**30
    policy, planned = planned_director(args.paper_config, torch.cuda.get_device_properties(0).total_memory)
    prompt = args.director_prompt_tokens or (policy.vllm_max_model_length or 4096) - policy.max_completion_length
    measured = director_step_memory(tokenizer, policy, prompt)
    gc.collect()  # its model went with its frame: hand the memory back before the next part builds its own
    torch.cuda.empty_cache()
    counted = planned.trained_bytes + planned.frozen_bytes
    return [
        (f"shapes: {policy.batch_size} completions of {prompt} prompt + {policy.max_completion_length} completion "
         f"tokens (per_device_train_batch_size of {args.paper_config.name}), LoRA r={policy.lora.r} on "
         f"{'/'.join(policy.lora.target_modules)}, gradient checkpointing {policy.gradient_checkpointing}, "
         f"beta {policy.beta}"),
        (f"measured peak: {measured['peak'] / gib:.1f} GiB (torch.cuda.max_memory_allocated of one forward-backward "
         f"and AdamW step; {measured['resident'] / gib:.1f} GiB resident before it; {measured['seconds']:.1f} s)"),
        (f"mascot plan, the same parts: {counted / gib:.1f} GiB (frozen base {planned.frozen_bytes / gib:.1f} + "
         f"adapter with Adam {planned.trained_bytes / gib:.2f}); measured minus planned, the activations and logits "
         f"the plan leaves out: {(measured['peak'] - counted) / gib:+.1f} GiB"),
        (f"mascot plan, the whole step: {planned.total / gib:.1f} GiB (of which TRL's engine "
         f"{planned.engine_bytes / gib:.1f} at vllm_gpu_memory_utilization {policy.vllm_gpu_memory_utilization} and "
         f"the scorers {planned.scorer_bytes / gib:.1f}); with the measured policy in its place: "
         f"{(measured['peak'] + planned.engine_bytes + planned.scorer_bytes) / gib:.1f} GiB of "
         f"{torch.cuda.get_device_properties(0).total_memory / gib:.1f} GiB"),
    ]


def colocate_steps(model, tokenizer, args, workdir: Path) -> str:
    """`args.steps` GRPO steps with TRL's colocated vLLM (use_vllm, vllm_mode colocate) configured by the project's
    own `grpo_args`, as the paper profile's trainers run; or why this part was skipped."""
    try:
        import vllm
    except ImportError as exc:
        return (f"skipped: vLLM is not installed ({exc}); run this script from the environment of "
                f"deployments/vllm-requirements.txt")
    import functools

    import torch
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl.generation import vllm_generation

    from mascot.config import GRPOPolicyConfig
    from mascot.train.grpo import grpo_args
    from mascot.train.lora import peft_lora_config

    folder = workdir / "model"
    policy = GRPOPolicyConfig(model=str(folder), bf16=True, batch_size=args.prompts_per_step * args.generations,
                              num_generations=args.generations, max_completion_length=args.tokens,
                              max_steps=args.steps, seed=0, save_steps=10_000, use_vllm=True, vllm_mode="colocate",
                              vllm_gpu_memory_utilization=args.colocate_memory, vllm_max_model_length=2048)
    # TRL's engine loads model.name_or_path: the folder holds the config and tokenizer only, so vLLM draws random
    # weights of that shape (load_format dummy) instead of reading 16 GB back; TRL pushes the trainer's weights
    # into the engine before its first generation and after every step, so it samples the model being trained.
    model.config._name_or_path = str(folder)
    vllm_generation.LLM = functools.partial(vllm_generation.LLM, load_format="dummy")
    timer = step_timer()
    trainer = GRPOTrainer(
        model=model, args=grpo_args(policy, workdir / "colocate-checkpoints", [1.0]),
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS]),
        reward_funcs=[reply_length], processing_class=tokenizer, peft_config=peft_lora_config(policy.lora),
        callbacks=[timer],
    )
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30
    figures = training_figures(trainer, timer)
    del trainer
    return (f"{args.steps} steps, {figures['step_s']:.2f} s a step (first {figures['first_step_s']:.2f} s), "
            f"{figures['tokens_per_s']:,.0f} completion tokens/s; peak torch allocation {peak:.1f} GiB beside the "
            f"engine's {args.colocate_memory} of the GPU (vllm {vllm.__version__})")


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
    parser.add_argument("--no-vllm", action="store_true", help="Skip the vLLM parts (offline engine, server, TRL's "
                        "colocate mode) even if vLLM is installed.")
    parser.add_argument("--no-colocate", action="store_true", help="Skip the GRPO steps with TRL's colocated vLLM.")
    parser.add_argument("--colocate-memory", type=float, default=0.3,
                        help="TRL's vllm_gpu_memory_utilization in the colocate part.")
    parser.add_argument("--no-director-memory", action="store_true",
                        help="Skip the Director step's peak memory at the paper profile's shapes (all 36 layers).")
    parser.add_argument("--paper-config", type=Path, default=REPO / "configs" / "paper.yaml",
                        help="The profile whose train.director gives the Director step's shapes.")
    parser.add_argument("--director-prompt-tokens", type=int, default=None,
                        help="The Director's prompt length (default: the profile's vllm_max_model_length less "
                        "max_completion_length, the longest conversation it allows).")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print(f"gpu_smoke.py needs a CUDA GPU and torch sees none: it would build a Qwen3-8B-shaped model "
              f"({args.layers} layers, random bf16 weights) on the GPU, run {args.steps} LoRA GRPO steps with TRL "
              f"(and with TRL's colocated vLLM if installed), generate with vLLM and a hot-loaded adapter if "
              f"installed, and measure the Director step's peak memory at {args.paper_config.name}'s shapes "
              f"against mascot plan.", file=sys.stderr)
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
    # First, on an empty GPU: the Director step at the paper's shapes, its own 36-layer model built and released.
    director_lines = ["skipped: --no-director-memory"] if args.no_director_memory else \
        director_memory_lines(tokenizer, args)
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
        gc.collect()
        torch.cuda.empty_cache()
        # Last, since TRL's engine joins this process's torch.distributed world: a fresh model (the first trainer's
        # LoRA layers are still in the last one), and a failure is reported in the summary, not lost with it.
        if args.no_vllm or args.no_colocate:
            colocate_line = f"skipped: {'--no-vllm' if args.no_vllm else '--no-colocate'}"
        else:
            try:
                colocate_line = colocate_steps(random_model(qwen3_8b_config(args.layers, tokenizer)), tokenizer,
                                               args, workdir)
            except Exception as exc:  # noqa: BLE001 - the summary says what failed; the traceback is above it
                traceback.print_exc()
                colocate_line = f"failed: {type(exc).__name__}: {exc}"

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
    print(f"GRPO with TRL's colocated vLLM: {colocate_line}")
    print("Director step at the paper's shapes:")
    for line in director_lines:
        print(f"  {line}")


if __name__ == "__main__":
    main()
