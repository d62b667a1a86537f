"""Stage 2, collaborative dialogue: branching, group judging and pairs, the Director's rewards and training,
its before/after comparison and its report. Conversations themselves are stage-neutral (`mascot.dialogue`)."""
