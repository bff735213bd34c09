"""The offline demo: ``theseus run demo/gpt`` trains a small byte-level GPT-style model on the Python standard
library and prints what it writes."""

from theseus.model.demo.trainer import DemoConfig, DemoGPT, last_validation

__all__ = ["DemoConfig", "DemoGPT", "last_validation"]
