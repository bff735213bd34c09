"""An example third-party theseus plugin: a trainer with its variations, custom modules inside a GPT,
an optimizer and a schedule, an evaluation, an analysis, and hook implementations.

Everything is registered by the entry points in this distribution's ``pyproject.toml``; nothing here
is imported until a job or component is used (this module deliberately imports nothing).
"""
