"""Prompt templates (jinja2) and the functions that turn them into chat messages.

Templates live beside this file as `*.j2`; code never builds prompt text inline.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

from mascot.data.context import Context
from mascot.data.qmsum import meeting_query
from mascot.roster import Persona

TEMPLATES_DIR = Path(__file__).parent


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, not an empty string
        keep_trailing_newline=False,
        autoescape=False,
    )


def render(template: str, **variables) -> str:
    return _environment().get_template(template).render(**variables).strip()


def speaker_messages(persona: Persona, context: Context, directive: object | None = None, *,
                     persona_specific: bool = True) -> list[dict]:
    """Chat messages asking `persona` for its next turn in `context`, following the Director's
    `directive` (its `instruction` and `tone`) when there is one, and helping answer the context's
    query (`meeting_query`) when it has one. Without `persona_specific` (the MASCOT-P ablation) the
    prompt keeps the persona's name and drops its role, description and rules."""
    system = render("speaker.j2", persona=persona, domain=context.domain, directive=directive,
                    query=meeting_query(context), persona_specific=persona_specific)
    return [{"role": "system", "content": system}, *context_messages(context)]


def context_messages(context: Context) -> list[dict]:
    """The context's conversation as chat messages, meeting speakers named."""
    return [
        {"role": m.role, "content": f"{m.name}: {m.content}" if context.domain == "meetings" and m.name else m.content}
        for m in context.history
    ]
