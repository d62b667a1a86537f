"""A failed stage's last word: the step, the reason as one sentence, and the command that resumes the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.failures import StageFailed, stopped_at_step


@pytest.mark.parametrize("reason", ["Too many bins for data range.", "Too many bins for data range"])
def test_the_message_is_one_sentence_per_thought_whether_or_not_the_reason_ends_in_a_full_stop(reason):
    with pytest.raises(StageFailed) as failed, stopped_at_step("stage 1", Path("runs/demo")):
        raise ValueError(reason)
    assert str(failed.value) == ("stage 1 stopped: Too many bins for data range. Everything finished before is kept; "
                                 "resume with `mascot resume runs/demo`.")
    assert isinstance(failed.value.__cause__, ValueError)
