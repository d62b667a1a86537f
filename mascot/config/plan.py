"""What `mascot plan` needs beyond the run itself: the list prices of the API models, and the rates it turns
work into GPU-hours (`mascot.plan`)."""

from __future__ import annotations

from pydantic import Field

from mascot.config.base import ConfigPath, Section


class ModelPrice(Section):
    """A model's list price, in US dollars per million tokens."""

    input: float = Field(ge=0, description="Dollars per million prompt tokens.")
    output: float = Field(ge=0, description="Dollars per million completion tokens.")


class PlanConfig(Section):
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict, description="List prices of the API models, by the model name the backends send "
        "(gpt-4o: {input: 2.5, output: 10.0}); a model of an API backend without one is priced as unknown.")
    rates: ConfigPath | None = Field(
        default=None, description="A JSON file of measured rates (benchmarks/gpu_smoke.py's), over the guessed "
        "defaults of mascot.plan.GUESSED_RATES, key by key.")
