"""Built-in environments that need no download: ``arithmetic``, ``countdown`` and ``jsonl``."""

from theseus.rl.environments.arithmetic import Arithmetic
from theseus.rl.environments.countdown import Countdown, CountdownReward
from theseus.rl.environments.jsonl import JSONL

__all__ = ["JSONL", "Arithmetic", "Countdown", "CountdownReward"]
