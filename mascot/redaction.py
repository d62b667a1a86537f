"""Keeping secrets out of what the project writes: the manifest, the wandb config, error messages.

Configs hold no secrets by design: `api_key_env` names an environment variable, and a server URL
carries no credentials. Validation rejects both mistakes, and everything that writes a config or an
error message out passes it through here as well, so a value that got through anyway (a config
built in code, a URL in a library's exception) is still masked.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "<redacted>"
# Prefixes of the API keys and tokens people paste by mistake: OpenAI, Anthropic, Hugging Face,
# Google, GitHub, Slack, xAI, Groq, Perplexity, Replicate, AWS access keys.
SECRET_PREFIX = re.compile(
    r"^(?:sk-|sk_|hf_|AIza|ghp_|gho_|ghu_|github_pat_|xox[abpr]-|xai-|gsk_|pplx-|r8_|AKIA)[A-Za-z0-9_\-]{8,}$"
)
SECRET_IN_TEXT = re.compile(
    r"\b(?:sk-|sk_|hf_|AIza|ghp_|gho_|ghu_|github_pat_|xox[abpr]-|xai-|gsk_|pplx-|r8_|AKIA)[A-Za-z0-9_\-]{8,}"
)
URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]+@")
ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RANDOM_TOKEN = re.compile(r"^[A-Za-z0-9+=\-]{24,}$")
SECRET_QUERY_KEYS = {"key", "api_key", "apikey", "api-key", "token", "access_token", "secret", "password", "sig"}


def looks_like_secret(value: str) -> bool:
    """True for strings shaped like an API key rather than a name.

    A known key prefix is enough. Without one, a long run of token characters with several digits
    and no underscore is treated as random: environment variable names are words joined by
    underscores, and paths, URLs and model names have separators that keys lack.
    """
    text = value.strip()
    if SECRET_PREFIX.match(text):
        return True
    return bool(RANDOM_TOKEN.match(text)) and sum(c.isdigit() for c in text) >= 4


def is_env_var_name(value: str) -> bool:
    return bool(ENV_VAR_NAME.match(value)) and not looks_like_secret(value)


def url_has_credentials(url: str) -> bool:
    parts = urlsplit(url)
    secret_query = any(key.lower() in SECRET_QUERY_KEYS for key, _ in parse_qsl(parts.query))
    return bool(parts.username or parts.password) or secret_query


def redact_url(url: str) -> str:
    """The URL without its user, password and secret query parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    if "@" in parts.netloc:
        netloc = f"{REDACTED}@{netloc}"
    query = urlencode([(key, REDACTED if key.lower() in SECRET_QUERY_KEYS else value)
                       for key, value in parse_qsl(parts.query, keep_blank_values=True)], safe="<>")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_scalar(value: Any) -> Any:
    """A scalar as it may be shown: secrets masked, URL credentials removed."""
    if not isinstance(value, str):
        return value
    if looks_like_secret(value):
        return REDACTED
    if "://" in value and url_has_credentials(value):
        return redact_url(value)
    return value


def redact(data: Any, key: str | None = None) -> Any:
    """A copy of JSON-like data (a config dump) with every secret-shaped value masked.

    `api_key_env` must hold a variable name; anything else there is masked, whatever it looks like.
    """
    if isinstance(data, dict):
        return {k: redact(v, str(k)) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact(v) for v in data]
    if key == "api_key_env" and isinstance(data, str) and not is_env_var_name(data):
        return REDACTED
    return _redact_scalar(data)


def redact_text(text: str) -> str:
    """Free text (an exception message) with URL credentials and key-shaped tokens masked."""
    text = URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    return SECRET_IN_TEXT.sub(REDACTED, text)
