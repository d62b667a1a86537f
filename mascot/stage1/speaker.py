"""The GRPO Speaker: one LoRA adapter shared by every persona, trained with the generic GRPO trainer.

The persona is in the prompt (its speaker system prompt), and the prompts cover every (training
context, enabled persona) query. The reward is the weighted sum of `mascot.stage1.rewards`.
"""

from __future__ import annotations

from pathlib import Path

from mascot.artifacts import Artifact
from mascot.config import SpeakerConfig
from mascot.data.contexts import held_out_ids
from mascot.prompts import speaker_messages
from mascot.queries import Queries
from mascot.stage1.rewards import speaker_reward_weights, speaker_rewards
from mascot.train.grpo import train_grpo_policy
from mascot.train.runtime import TrainingSetupError, checkpoint_dir


def speaker_prompts(queries: Queries) -> list[dict]:
    """The Speaker's GRPO prompts: one record per query, its persona's speaker prompt over its context."""
    return [{"prompt": speaker_messages(q.persona, q.context), "query_id": q.id, "persona": q.persona.id}
            for q in queries.load()]


def train_speaker(config: SpeakerConfig, queries: Queries, persona_rm: Artifact, out: Path) -> Artifact | None:
    """GRPO on the prompts of the training contexts' queries, resuming from checkpoints; write the adapter."""
    prompts = speaker_prompts(queries.held_out(False))
    if not prompts:
        raise TrainingSetupError(f"{queries.contexts.path} has no training context (every context is held out); "
                                 "add contexts (data.corpus.limit) or lower data.held_out_fraction")
    return train_grpo_policy(
        config, prompts, speaker_rewards(config, queries.roster, persona_rm.verified()),
        speaker_reward_weights(config), out, checkpoint_dir(out, config, queries, persona_rm),
        name="speaker", details={"held_out_contexts": sorted(held_out_ids(queries.contexts))},
    )
