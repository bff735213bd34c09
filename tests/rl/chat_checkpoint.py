"""A tiny Hugging Face chat checkpoint for the reinforcement-learning tests: a random one-layer Qwen3
(``tests.huggingface.conftest.save_model``), a byte-level BPE trained with ``tokenizers`` on a few lines
(special tokens first, so its ids are not the byte tokenizer's), a Qwen-form chat template in
``tokenizer_config.json`` and ``generation_config.json`` ending at end of turn and end of text."""

from __future__ import annotations

import json
from pathlib import Path

from tests.huggingface.conftest import VOCAB, save_model

END_OF_TEXT, START, END_OF_TURN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: The Qwen2.5 / Qwen3 form of a chat template (without tools).
QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LINES = [
    "Compute 12 + 7. Write the answer in <answer></answer> tags.",
    "The answer is <answer>19</answer> and 3 * 4 = 12.",
    "<calc>12*7</calc><result>84</result> so the total is 84.",
    "You are a helpful assistant. Reverse the word and think step by step.",
]


def train_tokenizer(folder: Path) -> dict[str, int]:
    """A byte-level BPE of at most ``VOCAB`` ids trained on ``LINES``, saved as ``tokenizer.json``; the
    special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [END_OF_TEXT, START, END_OF_TURN]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(LINES * 4, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return {token: int(tok.token_to_id(token)) for token in specials}


def save_chat_checkpoint(folder: Path, seed: int = 0) -> dict[str, int]:
    """The checkpoint in ``folder`` (one layer of ``hidden_size`` 32); the special tokens' ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = train_tokenizer(folder)
    eos, eot = ids[END_OF_TURN], ids[END_OF_TEXT]
    save_model(folder, "qwen3", seed, tokenizer=False, num_hidden_layers=1, eos_token_id=eos, bos_token_id=eot)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": QWEN_TEMPLATE,
        "eos_token": END_OF_TURN,
        "pad_token": END_OF_TEXT,
        "bos_token": None,
        "model_max_length": 512,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": eot, "eos_token_id": [eos, eot], "do_sample": True}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return ids
