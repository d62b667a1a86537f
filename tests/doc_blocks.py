"""The shell blocks of the docs, each marked with how the docs test treats it.

An HTML comment on the line above a shell block says what the test does with it:

    <!-- docs-test: run -->                        run as written, after the blocks above it
    <!-- docs-test: background -->                 started as written and left running ("in another terminal")
    <!-- docs-test: skip, needs a GPU machine -->  not run, for the reason given

A shell block without a mark fails the test, so no block is skipped by accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The pages whose commands a user runs as written.
DOCUMENTS = ("README.md", "deployments/README.md", "docs/cli.md", "docs/chat.md")
SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell|console)\s*$")
MARK = re.compile(r"^<!-- docs-test: (?P<mode>run|background|skip)(?:, (?P<reason>.+?))? -->$")


@dataclass(frozen=True)
class ShellBlock:
    document: str
    line: int  # of the opening fence, 1-based
    mode: str | None  # run, background, skip; None when unmarked
    reason: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"


def shell_blocks(document: str) -> list[ShellBlock]:
    lines = (REPO / document).read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        if not SHELL_FENCE.match(lines[index]):
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        mark = MARK.match(lines[index - 1]) if index else None
        blocks.append(ShellBlock(document, index + 1, mark and mark["mode"], mark and mark["reason"],
                                 "\n".join(lines[index + 1:end]) + "\n"))
        index = end + 1
    return blocks
