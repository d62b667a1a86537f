"""What every config section shares, and the field types that more than one section uses.

Sections are strict: unknown keys are errors, a quoted number is a string and not a number, and
infinities and NaN are refused, so that nothing in a config is defaulted, coerced or ignored
silently. Relative paths are relative to the config file's folder; `samples:NAME` points at the
sample corpora shipped inside the package.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, StringConstraints, ValidationInfo

from mascot.redaction import is_env_var_name, looks_like_secret, url_has_credentials

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "data" / "samples"
TINY_MODELS = ("tiny:lm", "tiny:rm")
# torch's device types; an index is allowed where torch takes one.
DEVICE = re.compile(r"^(?:auto|cpu|mps|meta|(?:cuda|xpu|npu|hpu|mlu|xla|privateuseone)(?::\d+)?)$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def resolve_path(value: Any, info: ValidationInfo) -> Path | None:
    """Resolve `samples:` references and paths relative to the config file's folder."""
    if value is None:
        return None
    if not isinstance(value, str | Path):
        # pydantic reports a ValueError as a validation error; a TypeError would escape as a crash.
        raise ValueError(f"expected a path (a string); got {type(value).__name__}")  # noqa: TRY004
    text = str(value)
    if not text.strip():
        raise ValueError("expected a path; got an empty string")
    if text.startswith("samples:"):
        return SAMPLES_DIR / text.removeprefix("samples:")
    path = Path(text).expanduser()
    base = (info.context or {}).get("base_dir")
    return path if path.is_absolute() or base is None else Path(os.path.normpath(Path(base) / path))


def _model_ref(value: str) -> str:
    if value.startswith("tiny:") and value not in TINY_MODELS:
        raise ValueError(f"unknown tiny model; expected one of {', '.join(TINY_MODELS)}")
    return value


def _env_var_name(value: str) -> str:
    if looks_like_secret(value):
        raise ValueError("expected the name of the environment variable that holds the key (such as "
                         "OPENAI_API_KEY), not the key itself; export the key and name its variable here")
    if not is_env_var_name(value):
        raise ValueError("expected an environment variable name: letters, digits and underscores, "
                         "not starting with a digit")
    return value


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL such as http://127.0.0.1:8000/v1")
    if url_has_credentials(value):
        raise ValueError("a URL must not carry credentials (user:password@ or a key in the query); keep the "
                         "key in the environment variable that api_key_env names")
    return value


def _device(value: str) -> str:
    if not DEVICE.match(value):
        raise ValueError("expected a torch device: auto, cpu, cuda, cuda:N, mps or xpu")
    return value


ModelRef = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1), AfterValidator(_model_ref)]
EnvVarName = Annotated[str, AfterValidator(_env_var_name)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
Device = Annotated[str, AfterValidator(_device)]
ConfigPath = Annotated[Path, BeforeValidator(resolve_path)]
RunName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]
