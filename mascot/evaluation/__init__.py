"""Evaluation beyond Stage 1's own evidence: baselines and metrics land here; figures for reports today."""
