"""The text a reward receives: the policy's completion up to the end of its turn, and whether it was cut.

A chat model ends its turn with the template's end marker (chatml's ``<|im_end|>``, Gemma's
``<end_of_turn>``) before the tokenizer's end of text. Rewards receive the completion without the
marker and anything after it; a completion cut at ``rl/max_new_tokens`` before its turn ended is
*truncated* (``metadata["truncated"]``), and a marker it had begun to write is dropped too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.errors import DataError

if TYPE_CHECKING:
    from theseus.data.chat import ChatTemplate

#: Content written as the assistant's turn to find what the template writes after it.
_PROBE = "Completion0x5EED"


def end_marker(template: ChatTemplate) -> str:
    """What ``template`` writes after an assistant turn's content (``<|im_end|>`` for chatml), surrounding
    whitespace dropped; ``""`` when it writes only whitespace or cannot be probed."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PROBE}]
    try:
        learned = "".join(text for text, is_learned in template.segments(messages) if is_learned)
    except DataError:
        return ""
    at = learned.find(_PROBE)
    return learned[at + len(_PROBE) :].strip() if at >= 0 else ""


def reward_text(text: str, stopped: bool, marker: str = "") -> tuple[str, bool]:
    """``(text, truncated)``: the completion ``text`` up to the end ``marker`` (the marker and what follows
    dropped); without the marker, a completion that did not stop at end of text (``stopped``) was cut at
    the token limit: it is truncated, and a beginning of the marker at its end is dropped."""
    if marker:
        at = text.find(marker)
        if at >= 0:
            return text[:at], False
    if stopped:
        return text, False
    for length in range(len(marker) - 1, 0, -1):
        if text.endswith(marker[:length]):
            return text[:-length], True
    return text, True


__all__ = ["end_marker", "reward_text"]
