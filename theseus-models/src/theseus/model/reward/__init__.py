"""Learned rewards: a Bradley-Terry reward model trained on preference pairs (``train/reward``) and the
``reward/model`` reward that scores completions with one.

See ``docs/reinforcement-learning.md`` (Learned rewards). This package imports no jax at import time.
"""
