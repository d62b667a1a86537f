"""Where a run's contexts come from: the training corpus, held-out corpora, roster and users."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mascot.config.base import ConfigPath, Section
from mascot.yamlio import FieldError

CORPUS_DOMAIN = {"empathetic_dialogues": "emotional_support", "esconv": "emotional_support", "qmsum": "meetings"}


class CorpusConfig(Section):
    source: Literal["empathetic_dialogues", "qmsum", "esconv"] = Field(description="Which corpus loader to use.")
    path: ConfigPath | None = Field(default=None, description="Local file or folder in the corpus's release format.")
    hub_name: str | None = Field(default=None, description="Hugging Face dataset name, read from the hub's parquet conversion (network).")
    split: Literal["train", "validation", "test"] = Field(default="train", description="Corpus split to read.")
    limit: int | None = Field(default=None, ge=1, description="Keep at most this many contexts (seeded subsample).")
    window_turns: int = Field(default=16, ge=2, description="QMSum: turns per meeting window.")
    window_stride: int | None = Field(default=None, ge=1, description="QMSum: window stride (default: no overlap).")

    @model_validator(mode="after")
    def _one_location(self) -> CorpusConfig:
        if self.path is not None and self.hub_name is not None:
            raise FieldError("hub_name", "set exactly one of 'path' (local files) or 'hub_name' (Hugging Face "
                                         "dataset), not both")
        if self.path is None and self.hub_name is None:
            raise ValueError("set one of 'path' (local files) or 'hub_name' (Hugging Face dataset)")
        return self

    @property
    def location(self) -> tuple[str, str, str]:
        """What identifies the contexts read: the corpus, where it is, and the split."""
        return self.source, str(self.path or self.hub_name), self.split


class DataConfig(Section):
    domain: Literal["emotional_support", "meetings"] = Field(description="Which companion domain this run trains.")
    roster: ConfigPath = Field(description="Roster YAML with the personas.")
    users: ConfigPath | None = Field(default=None, description="Simulated-user profiles YAML (Stage 2).")
    corpus: CorpusConfig = Field(description="Training contexts.")
    held_out: list[CorpusConfig] = Field(default_factory=list, description="Evaluation-only corpora.")
    held_out_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="Share of the training corpus's clusters (a QMSum meeting, else one "
        "context) kept out of all training with all their contexts, for evaluating the trained models (the "
        "`held_out` and `cluster` columns of contexts.parquet).",
    )

    @model_validator(mode="after")
    def _corpora_fit(self) -> DataConfig:
        for loc, corpus in [(("corpus",), self.corpus), *((("held_out", i), c) for i, c in enumerate(self.held_out))]:
            if CORPUS_DOMAIN[corpus.source] != self.domain:
                raise FieldError((*loc, "source"), f"corpus '{corpus.source}' belongs to domain "
                                                   f"'{CORPUS_DOMAIN[corpus.source]}', but data.domain is '{self.domain}'")
        for index, corpus in enumerate(self.held_out):
            if corpus.location == self.corpus.location:
                raise FieldError(("held_out", index), "this held-out corpus is the training corpus (same source, "
                                 "location and split), so evaluating on it would measure training data")
        return self
