"""Reinforcement learning on language models: the GRPO family of policy losses, group-relative
advantages and the distillation losses (generalized JSD, forward KL) in ``theseus.model.rl.loss``."""
