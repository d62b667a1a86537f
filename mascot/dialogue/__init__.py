"""Conversations with the companion group: turns, the Director's directives, and episodes.

Stage-neutral: Stage 2 plays and branches episodes with it, and evaluation talks with a trained group.
"""
