"""Every shell block of the pages users follow says whether the docs test runs it (tests/doc_blocks.py)."""

from __future__ import annotations

import pytest
from doc_blocks import DOCUMENTS, shell_blocks


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_shell_block_is_run_or_skipped_by_name(document):
    blocks = shell_blocks(document)
    assert blocks, f"{document} has no shell blocks: is DOCUMENTS out of date?"
    unmarked = [block.where for block in blocks if block.mode is None]
    assert not unmarked, f"shell blocks without a valid <!-- docs-test: run|background|skip, why --> mark: {unmarked}"
    unexplained = [block.where for block in blocks if block.mode == "skip" and not block.reason]
    assert not unexplained, f"skipped shell blocks must say why: {unexplained}"


def test_a_block_is_read_with_its_mark(tmp_path, monkeypatch):
    import doc_blocks

    (tmp_path / "page.md").write_text("text\n<!-- docs-test: skip, needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
                                      "```sh\necho unmarked\n```\n<!-- docs-test: walk -->\n```bash\nls\n```\n")
    monkeypatch.setattr(doc_blocks, "REPO", tmp_path)
    first, second, third = shell_blocks("page.md")
    assert (first.mode, first.reason, first.text, first.line) == ("skip", "needs a GPU", "nvidia-smi\n", 3)
    assert second.mode is None and second.text == "echo unmarked\n"
    assert third.mode is None, "a misspelt mark is no mark"
