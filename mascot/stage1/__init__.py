"""Stage 1, persona alignment: everything that only Stage 1 does.

`candidates` samples K replies per (context, persona) query; `steps` turns shards of queries into
candidates, judgments and preference pairs (`pairs`); `rewards` and `speaker` assemble the GRPO
Speaker's rewards and train it with the generic trainer; `before_after` compares the trained
Speaker with its base policy on held-out prompts; `report` summarises a run. What other stages
share (contexts, queries, judges, trainers, statistics) lives outside this package.
"""
