"""What the chat server (tests/chat_server.py) serves when it plays vLLM: a base model, LoRA adapters loaded
into it, vLLM's `/v1/models` cards and its dynamic LoRA endpoints.

    served = ServedModels("Qwen/Qwen3-8B", allow_runtime_lora=True)          # simulated replies
    served = ServedModels("tiny-lm", engine=TransformersEngine(tiny_models.lm))  # the tiny models' replies
    app = make_app(served=served)

It does what vLLM's OpenAI-compatible server (0.8 to 0.11) does with the parts the project uses:

- `GET /v1/models` lists the base model (`root`: its path) and every LoRA module (`root`: the adapter's folder,
  `parent`: the base model's name).
- A chat completion's `model` must name the base model or a loaded module; any other name is answered
  404 `The model `x` does not exist.`, as vLLM answers it.
- `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` take `{"lora_name", "lora_path"}`. They exist
  only where runtime updating is allowed (vLLM registers them only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is
  set; elsewhere they are FastAPI's plain 404 `{"detail": "Not Found"}`). A name loaded twice is 400, a folder
  without an adapter 404, an unknown name to unload 404; success is a plain-text 200.

Replies: with an `engine`, the base model or the adapter itself answers (PEFT on the tiny models, through the
project's in-process backend, so an adapter's answer is that backend's answer with it). Without one, the
simulated reply is seeded by the adapter's content as well, so a retrained adapter served under the same name
answers differently, as a real one would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from mascot.artifacts import path_sha256


@dataclass(frozen=True)
class LoraModule:
    name: str
    path: str
    digest: str  # of the adapter's files: what a simulated reply is seeded by


def adapter_digest(folder: Path) -> str | None:
    """SHA-256 of an adapter folder's `adapter_*` files, or None where there is no adapter."""
    if not (folder / "adapter_config.json").is_file():
        return None
    digest = hashlib.sha256()
    for file in sorted(folder.glob("adapter_*")):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


class TransformersEngine:
    """The tiny models in this process, as a server's engine: one in-process backend per adapter (None: the base)."""

    def __init__(self, base: str | Path, device: str = "cpu"):
        self.base, self.device = str(base), device
        self._backends: dict[str | None, object] = {}

    async def complete(self, adapter: str | None, messages: list[dict], n: int, body: dict) -> list[str]:
        from mascot.config import SamplingParams
        from mascot.llm import TransformersBackend

        if adapter not in self._backends:
            self._backends[adapter] = TransformersBackend(self.base, adapter=adapter, device=self.device)
        params = SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                max_new_tokens=body.get("max_tokens") or body.get("max_completion_tokens") or 16,
                                stop=body.get("stop") or [], chat_template_kwargs=body.get("chat_template_kwargs") or {})
        return await self._backends[adapter].generate(messages, n, params, body.get("seed") or 0)

    def forget(self, adapter: str) -> None:
        """Release an unloaded adapter's model, as vLLM frees its slot."""
        from mascot.llm.transformers_backend import unload_adapter

        if self._backends.pop(adapter, None) is not None:
            unload_adapter(adapter)


@dataclass
class ServedModels:
    """The served base model (`name`, from `root`), its LoRA modules, and whether they may change at runtime."""

    name: str
    root: str | None = None
    allow_runtime_lora: bool = False
    engine: TransformersEngine | None = None
    modules: dict[str, LoraModule] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)  # every name loaded at runtime, in order
    unloads: list[str] = field(default_factory=list)
    # The content hash (mascot.artifacts.path_sha256) of each name's folder when it was loaded at runtime.
    contents: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, path: str | Path) -> LoraModule | None:
        """Load an adapter as `name` (vLLM's --lora-modules name=path); None when `path` holds no adapter."""
        digest = adapter_digest(Path(path))
        if digest is None:
            return None
        self.modules[name] = LoraModule(name, str(path), digest)
        return self.modules[name]

    def cards(self) -> list[dict]:
        base = {"id": self.name, "object": "model", "created": 0, "owned_by": "vllm", "root": self.root or self.name,
                "parent": None}
        return [base, *({"id": m.name, "object": "model", "created": 0, "owned_by": "vllm", "root": m.path,
                         "parent": self.name} for m in self.modules.values())]

    def knows(self, model: object) -> bool:
        return model == self.name or model in self.modules

    def adapter(self, model: str) -> LoraModule | None:
        return self.modules.get(model)


def vllm_error(status: int, message: str, kind: str) -> JSONResponse:
    """vLLM's ErrorResponse (0.10 and later)."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


def unknown_model(model: object) -> JSONResponse:
    return vllm_error(404, f"The model `{model}` does not exist.", "NotFoundError")


def add_lora_routes(app: FastAPI, served: ServedModels) -> None:
    """vLLM's dynamic LoRA endpoints, registered only where runtime updating is allowed, as vLLM does."""
    if not served.allow_runtime_lora:
        return

    async def names(request: Request) -> tuple[str, str] | JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return vllm_error(400, "the body is not JSON", "BadRequestError")
        if not isinstance(body, dict):
            return vllm_error(400, "expected a JSON object", "BadRequestError")
        return str(body.get("lora_name") or ""), str(body.get("lora_path") or "")

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request):
        given = await names(request)
        if isinstance(given, JSONResponse):
            return given
        name, path = given
        if not name or not path:
            return vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name in served.modules:
            return vllm_error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        if served.add(name, path) is None:
            return vllm_error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        served.loads.append(name)
        served.contents[name] = path_sha256(Path(path))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request):
        given = await names(request)
        if isinstance(given, JSONResponse):
            return given
        name, _ = given
        if not name:
            return vllm_error(400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput")
        if name not in served.modules:
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        module = served.modules.pop(name)
        served.unloads.append(name)
        if served.engine is not None:
            served.engine.forget(module.path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def random_adapter(base: str | Path, folder: Path, seed: int) -> Path:
    """A LoRA adapter of `base` with weights drawn from `seed` (PEFT's non-zero init), saved to `folder`: an
    adapter that changes the replies, without training one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                        task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(folder)
    return folder
