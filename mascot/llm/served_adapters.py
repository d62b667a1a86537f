"""Trained adapters on an OpenAI-compatible server (vLLM): registered at runtime under names that carry their
content hash, or checked where a person serves them, and in every request's cache key either way.

A served role (Stage 2's Speaker, the evaluation's trained roles, the chat's) talks to a LoRA module of the
server. `serve_adapter` turns the role's configured backend into the one its requests use:

- `load_adapter: true`: the run's adapter is loaded into the server through vLLM's dynamic LoRA endpoint
  (`POST /v1/load_lora_adapter`, which vLLM has only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set) as
  `<role>-<first 8 hex digits of its SHA-256>`, `/v1/models` must then list it, and the role's other names
  loaded from this run's folder (an adapter retrained since) are unloaded. A retrained adapter is a new name, so
  no request can reach the old one, and no person restarts a server between stages.
- otherwise `model` names a module served by hand (`vllm serve ... --lora-modules speaker=<folder>`), and
  `/v1/models` must list it before any request is made.

Either way the returned backend carries the adapter's SHA-256 (`adapter_sha256`), which the request cache keys
every request by: a retrained adapter served under an old name is never answered from the old one's records.

A policy in training (the GRPO Director's snapshots, one per step) is served the same way where its base model's
server loads adapters (`loads_adapters`): `ServedSnapshots` loads each snapshot under its content's name and
unloads the one before it.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import tenacity

from mascot.artifacts import Artifact, dir_artifact
from mascot.config import BackendConfig, RunConfig
from mascot.config.loading import backends
from mascot.yamlio import Problem, YamlDocument

RUNTIME_VARIABLE = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# The config's roles that play a trained adapter, by YAML path.
TRAINED_ROLES = {("stage2", "speaker"), ("eval", "speaker"), ("eval", "director"), ("eval", "director_dpo"),
                 ("eval", "sft"), ("chat", "speaker"), ("chat", "director")}
RETRYABLE = {408, 409, 429}


class AdapterServingError(RuntimeError):
    """A server cannot serve a role's adapter as the config asks."""


def served_name(role: str, adapter: Artifact) -> str:
    """The role's name on the server: `speaker-3f9c1a2b`, from the adapter's content hash."""
    return f"{role}-{adapter.sha256[:8]}"


def serve_adapter(config: BackendConfig, role: str, adapter: Artifact | None, run_root: Path) -> BackendConfig:
    """The backend that `role`'s requests use: `config` pointing at `adapter` on its server, loaded there first
    where the config asks for it (see the module docstring). In-process backends are returned as they are:
    they read the adapter's folder, and their cache key fingerprints it. `adapter` may be None only for a module
    served by hand in a run that trained none (a Stage 2 on a Stage 1 stopped at its pairs, say): the server
    must still list it, and its requests are keyed by its name alone."""
    if config.kind != "openai" or config.adapter_sha256 is not None:
        return config
    server = ServerModels(config)
    if not config.load_adapter:
        if config.model not in server.names():
            raise AdapterNotServed.by_hand(config, role, adapter, server)
        return config.model_copy(update={"adapter_sha256": adapter.sha256}) if adapter is not None else config
    if adapter is None:
        raise AdapterServingError(f"{role} says load_adapter: true, but the run has no trained {role} adapter to load; "
                                  "run the stage that trains it first")
    adapter.verified()
    served = served_adapter(config, role, adapter, server)
    for stale in server.retired(role, served.model, run_root.resolve()):
        server.unload(stale)
    return served


def loads_adapters(config: BackendConfig | None) -> bool:
    """Whether the flow loads adapters into `config`'s server at runtime (an OpenAI-compatible server, with
    `load_adapter`): the condition under which a trained role, or a policy in training, is sampled there."""
    return config is not None and config.kind == "openai" and config.load_adapter


def served_adapter(config: BackendConfig, role: str, adapter: Artifact,
                   server: ServerModels | None = None) -> BackendConfig:
    """`config` (a server that loads adapters at runtime) answering as `adapter`, named `<role>-<its hash>`: loaded
    into the server unless it lists that name already (a resumed run's, or an earlier step's of this one)."""
    name, server = served_name(role, adapter), server or ServerModels(config)
    server.ensure(name, adapter.path.resolve(), config, role)
    return config.model_copy(update={"model": name, "adapter_sha256": adapter.sha256, "load_adapter": False})


class ServedSnapshots:
    """A policy in training, sampled on the server that serves its base model rather than in this process.

    `backend(folder)` is the policy as a snapshot folder holds it (`mascot.train.grpo.PolicySnapshots`, one per
    optimisation step): loaded into the server as `<role>-<first 8 hex digits of its content hash>` the first time
    it is asked for, and the snapshot before it unloaded (vLLM's `/v1/unload_lora_adapter`), so that a run of
    many steps holds one of the server's LoRA slots, never a name whose folder training has removed. The name and
    the requests' cache key carry the snapshot's content: two steps' weights never share a name or a record, and
    a resumed run asks for a step it had reached under the same name, answered from the request cache.
    `close()` unloads the last one when training ends.
    """

    def __init__(self, config: BackendConfig, role: str):
        if not loads_adapters(config):
            raise ValueError(f"ServedSnapshots needs a server that loads adapters (kind: openai, load_adapter: true), "
                             f"not {config.kind} {config.model}")
        self.config, self.role, self.server = config, role, ServerModels(config)
        self._current: tuple[Path, BackendConfig] | None = None

    def backend(self, folder: Path) -> BackendConfig:
        if self._current is not None and self._current[0] == folder:
            return self._current[1]
        try:
            served = served_adapter(self.config, self.role, dir_artifact(folder), self.server)
        except NoRuntimeLoading as exc:  # a snapshot changes every step: serving it by hand is no way out
            raise NoRuntimeLoading(
                f"the server at {self.server.url} does not load LoRA adapters at runtime, so the {self.role}'s policy "
                f"snapshots cannot be sampled there. Restart it so that it does: `{RUNTIME_VARIABLE}=True vllm serve "
                f"{self.config.model} --enable-lora`; or set stage2.director's load_adapter: false, so that the "
                "snapshots are sampled in the trainer's process (a second copy of the base model there)") from exc
        previous, self._current = self._current, (folder, served)
        if previous is not None and previous[1].model != served.model:
            self.server.unload(previous[1].model)
        return served

    def close(self) -> None:
        if self._current is not None:
            self.server.unload(self._current[1].model)
            self._current = None


class NoRuntimeLoading(AdapterServingError):
    """The server has no dynamic LoRA endpoints (vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""


class AdapterNotServed(AdapterServingError):
    @classmethod
    def by_hand(cls, config: BackendConfig, role: str, adapter: Artifact | None,
                server: ServerModels) -> AdapterNotServed:
        folder = adapter.path if adapter is not None else f"runs/<run>/<the {role} adapter>"
        return cls(f"the server at {server.url} does not serve {config.model!r}, the {role} adapter this config "
                   f"names (it serves: {', '.join(server.names()) or 'nothing'}). Serve the run's adapter as it: "
                   f"`vllm serve <base model> --enable-lora --lora-modules {config.model}={folder}`, or set "
                   f"load_adapter: true and start the server with {RUNTIME_VARIABLE}=True, so that the flow loads it")


def served_module_problems(document: YamlDocument, config: RunConfig) -> tuple[list[Problem], list[str]]:
    """Every trained role served by hand (`model` names a LoRA module, no `load_adapter`) whose server answers
    but does not list that module: `mascot config validate` asks each server before any run does. Also the
    roles whose server did not answer, as notes: they are checked again before their first request."""
    problems, unchecked = [], []
    for loc, backend in backends(config).items():
        if loc not in TRAINED_ROLES or backend.kind != "openai" or backend.load_adapter:
            continue
        try:
            names = ServerModels(backend.model_copy(update={"max_retries": 0})).names()
        except AdapterServingError:
            unchecked.append(f"{'.'.join(loc)}: the server at {backend.base_url} did not answer, so whether it serves "
                             f"{backend.model!r} is checked when the run needs it")
            continue
        if backend.model not in names:
            problems.append(document.problem((*loc, "model"), (
                f"the server at {backend.base_url} does not serve {backend.model!r} (it serves: "
                f"{', '.join(names) or 'nothing'}); serve the trained adapter under that name (vllm serve <base "
                f"model> --enable-lora --lora-modules {backend.model}=runs/<run>/<stage>/<adapter>), or set "
                "load_adapter: true and model to the base model, so that the flow loads it")))
    return problems, unchecked


class ServerModels:
    """The models an OpenAI-compatible server lists, and vLLM's endpoints that load and unload LoRA adapters."""

    def __init__(self, config: BackendConfig):
        from mascot.llm.openai_backend import OpenAIBackend  # its key and URL rules, not its SDK's client

        backend = OpenAIBackend(config.model, base_url=config.base_url, api_key_env=config.api_key_env)
        self.root, self.url = backend.endpoint.rstrip("/"), backend.url
        self.headers = {"Authorization": f"Bearer {backend._api_key()}"}
        self.timeout_s, self.max_retries = config.timeout_s, config.max_retries

    def _request(self, method: str, path: str, **body) -> httpx.Response:
        """One call, retried as the role's requests are (its max_retries, backing off 0.5 s doubling up to 8 s) on
        what retrying can fix: no connection, a timeout, a broken answer, 408, 409, 429 and 5xx."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(httpx.TransportError)
            | tenacity.retry_if_result(lambda answer: answer.status_code in RETRYABLE or answer.status_code >= 500),
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=tenacity.wait_exponential(multiplier=0.5, max=8), reraise=True,
            retry_error_callback=lambda state: state.outcome.result())
        try:
            return retrying(httpx.request, method, f"{self.root}{path}", headers=self.headers,
                            timeout=self.timeout_s, **body)
        except httpx.HTTPError as exc:
            raise AdapterServingError(f"the server at {self.url} is unavailable ({type(exc).__name__}: {exc}); start "
                                      "it before the run, or check base_url") from exc

    def cards(self) -> list[dict]:
        response = self._request("GET", "/models")
        if response.status_code != 200:
            raise AdapterServingError(f"{self.url}/models answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            return list(response.json().get("data") or [])
        except (ValueError, AttributeError) as exc:
            raise AdapterServingError(f"{self.url}/models answered with no list of models: {response.text[:300]}") \
                from exc

    def names(self) -> list[str]:
        return [str(card.get("id")) for card in self.cards()]

    def load(self, name: str, folder: Path, config: BackendConfig, role: str) -> None:
        response = self._request("POST", "/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)})
        if response.status_code == 404 and response.text.startswith('{"detail":"Not Found"'):  # no such route
            raise NoRuntimeLoading(
                f"the server at {self.url} does not load LoRA adapters at runtime, so the flow cannot give it the "
                f"{role} adapter {folder}. Restart it so that it does: `{RUNTIME_VARIABLE}=True vllm serve "
                f"{config.model} --enable-lora`; or serve the adapter yourself: `vllm serve {config.model} "
                f"--enable-lora --lora-modules {name}={folder}`, and set this role's model to {name} without "
                "load_adapter")
        if response.status_code != 200 and "already been loaded" not in response.text:  # a resume, or another run
            raise AdapterServingError(f"the server at {self.url} could not load the {role} adapter {folder} as "
                                      f"{name}: HTTP {response.status_code}: {response.text[:500]}")

    def ensure(self, name: str, folder: Path, config: BackendConfig, role: str) -> None:
        """`folder` served as `name`: loaded unless the server lists that name already (a resumed run's)."""
        if name in self.names():
            return
        self.load(name, folder, config, role)
        if name not in self.names():
            raise AdapterServingError(f"{self.url} answered that it loaded {name} from {folder}, but /v1/models "
                                      "does not list it; is base_url a load balancer over several servers?")

    def retired(self, role: str, keep: str, run_root: Path) -> list[str]:
        """The role's other names that this run loaded (their folders lie in its run directory): adapters it no
        longer uses. Other runs' adapters on a shared server are left alone."""
        pattern = re.compile(rf"{re.escape(role)}-[0-9a-f]{{8}}")
        return [str(card["id"]) for card in self.cards()
                if card.get("id") != keep and pattern.fullmatch(str(card.get("id")))
                and Path(str(card.get("root") or "/")).is_relative_to(run_root)]

    def unload(self, name: str) -> None:
        response = self._request("POST", "/unload_lora_adapter", json={"lora_name": name})
        if response.status_code not in (200, 404):  # 404: gone already
            raise AdapterServingError(f"the server at {self.url} could not unload {name}: HTTP "
                                      f"{response.status_code}: {response.text[:500]}")
