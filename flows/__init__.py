"""Prefect flows: stage1, stage2, evaluate and pipeline. Each reads like the paper's pipeline figure."""
