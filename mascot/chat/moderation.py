"""The chat guard's moderation layer: a safety model asked about every message, beside the rule set.

Two kinds, both over HTTP with the `openai` SDK, so a test can put a loopback server that speaks the same
wire format in their place:

- `llama_guard`: a Llama Guard 3 model served by vLLM. It is asked through the completions endpoint with its
  own prompt (the hazard categories S1-S14 and the conversation, as its model card gives them), so the answer
  does not depend on a chat template the server may or may not apply. It answers `safe`, or `unsafe` and a
  line of categories; S11 (Suicide & Self-Harm) flags the message.
- `openai_moderation`: OpenAI's moderation endpoint, whose self-harm categories flag the message.

The layer fails closed: a check that times out, errors or answers in another shape flags the message, and the
failure is logged and kept in the verdict. A needless list of helplines costs little; a crisis let through
because a server was down costs much more.
"""

from __future__ import annotations

import logging

import openai
from pydantic import BaseModel, ConfigDict, Field

from mascot.config import ModerationConfig
from mascot.llm.remote import RemoteBackend

log = logging.getLogger(__name__)

# Llama Guard 3's hazard categories (the MLCommons taxonomy), in the order and words of its model card.
LLAMA_GUARD_CATEGORIES = (
    "S1: Violent Crimes.", "S2: Non-Violent Crimes.", "S3: Sex Crimes.", "S4: Child Exploitation.",
    "S5: Defamation.", "S6: Specialized Advice.", "S7: Privacy.", "S8: Intellectual Property.",
    "S9: Indiscriminate Weapons.", "S10: Hate.", "S11: Suicide & Self-Harm.", "S12: Sexual Content.",
    "S13: Elections.", "S14: Code Interpreter Abuse.",
)
# The server's tokenizer adds <|begin_of_text|>, so the prompt starts at the first header.
LLAMA_GUARD_PROMPT = """<|start_header_id|>user<|end_header_id|>

Task: Check if there is unsafe content in 'User' messages in conversations according our safety policy with the below categories.

<BEGIN UNSAFE CONTENT CATEGORIES>
{categories}
<END UNSAFE CONTENT CATEGORIES>

<BEGIN CONVERSATION>

User: {message}

<END CONVERSATION>

Provide your safety assessment for ONLY THE LAST User message in the above conversation:
 - First line must read 'safe' or 'unsafe'.
 - If unsafe, a second line must include a comma-separated list of violated categories.<|eot_id|><|start_header_id|>assistant<|end_header_id|>

"""


class ModerationVerdict(BaseModel):
    """What the moderation layer said of one message, as the transcript keeps it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    flagged: bool = Field(description="The message is treated as a crisis: a flagging category, or a failed check.")
    categories: list[str] = Field(default_factory=list, description="The categories the model named.")
    error: str | None = Field(default=None, description="Why the check failed, when it did (it then flags).")


class ModerationAnswerError(ValueError):
    """The model answered, but not in its format."""


def llama_guard_prompt(message: str) -> str:
    return LLAMA_GUARD_PROMPT.format(categories="\n".join(LLAMA_GUARD_CATEGORIES), message=message)


def llama_guard_categories(answer: str) -> list[str]:
    """The categories of a Llama Guard answer: none for `safe`, the listed ones for `unsafe`."""
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if lines[:1] == ["safe"]:
        return []
    if lines[:1] == ["unsafe"] and len(lines) > 1:
        return [category.strip() for category in lines[1].split(",") if category.strip()]
    raise ModerationAnswerError(f"expected 'safe', or 'unsafe' and a line of categories, got {answer[:80]!r}")


class Moderation(RemoteBackend):
    """One moderation model on its server; `check` never raises, it fails closed."""

    kind = "openai"  # the wire format, for the process-wide limit and the key's lookup
    default_url = "https://api.openai.com/v1"
    vendor_domain = "openai.com"
    default_key_envs = ("OPENAI_API_KEY",)

    def __init__(self, config: ModerationConfig):
        super().__init__(config.model, base_url=config.base_url, api_key_env=config.api_key_env,
                         timeout_s=config.timeout_s, max_retries=config.max_retries)
        self.config = config

    def _open(self) -> tuple[openai.AsyncOpenAI]:
        return (openai.AsyncOpenAI(api_key=self._api_key(), base_url=self.endpoint, timeout=self.timeout_s,
                                   max_retries=self.max_retries),)

    async def check(self, text: str) -> ModerationVerdict:
        kind = self.config.kind
        try:
            named = await (self._llama_guard(text) if kind == "llama_guard" else self._openai_moderation(text))
        except Exception as exc:  # noqa: BLE001 - any failure flags the message (fail closed), and is logged
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("the %s check of a chat message failed, so the message is treated as a crisis: %s", kind,
                        reason)
            return ModerationVerdict(kind=kind, flagged=True, error=reason)
        flagging = set(self.config.flagging_categories())
        return ModerationVerdict(kind=kind, flagged=bool(flagging & set(named)), categories=named)

    async def _llama_guard(self, text: str) -> list[str]:
        (client,) = self._loop_state()
        async with self._limit().slot():
            response = await client.completions.create(model=self.model, prompt=llama_guard_prompt(text),
                                                       max_tokens=20, temperature=0.0)
        if not response.choices:
            raise ModerationAnswerError("the server answered with no choices")
        return llama_guard_categories(response.choices[0].text or "")

    async def _openai_moderation(self, text: str) -> list[str]:
        (client,) = self._loop_state()
        async with self._limit().slot():
            response = await client.moderations.create(model=self.model, input=text)
        if not response.results:
            raise ModerationAnswerError("the server answered with no results")
        flags = response.results[0].categories.model_dump(by_alias=True)
        return sorted(name for name, flagged in flags.items() if flagged)
