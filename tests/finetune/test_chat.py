"""Chat data: templates, the learned mask (assistant tokens only), and one-line errors for bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.data.chat import ChatTemplate, declared_template, has_chat_template
from theseus.data.datasets import Chat
from theseus.data.prepare import prepare
from theseus.errors import DataError
from theseus.training.flywheel import Flywheel

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def _chat(path: Path, **values: object) -> Chat:
    with configuration({"data/chat/path": str(path), "data/val_fraction": 0.0, **values}):
        return configure(Chat)


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_chatml_rendering_and_segments() -> None:
    template = ChatTemplate.load("chatml")
    text = template.render(CONVERSATION)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )
    segments = template.segments(CONVERSATION)
    assert "".join(t for t, _ in segments) == text
    assert [t for t, learned in segments if learned] == ["Hello!<|im_end|>\n", "4<|im_end|>\n"]
    assert template.prompt("Hi") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


#: microsoft/Phi-3-mini-4k-instruct's tokenizer_config.json chat_template.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def test_phi3_template_renders_as_phi3_s_own_in_transformers(tmp_path: Path) -> None:
    """The built-in phi3 against Phi-3's template rendered by transformers' apply_chat_template: the same
    prompts, and the same conversations but for the eos_token Phi-3's adds after the last turn (the data
    closes every conversation with end-of-text itself)."""
    from transformers import AutoTokenizer

    from tests.huggingface.conftest import make_tokenizer

    make_tokenizer(tmp_path, bos=True)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    hf.chat_template = PHI3_TEMPLATE
    template = ChatTemplate.load("phi3")
    for end in range(1, len(CONVERSATION) + 1):
        messages = CONVERSATION[:end]
        if messages[-1]["role"] != "assistant":
            assert template.render(messages, add_generation_prompt=True) == hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        assert template.render(messages) + hf.eos_token == hf.apply_chat_template(messages, tokenize=False)
    assert (
        template.prompt("Hi", system="Be brief.")
        == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    )
    segments = template.segments(CONVERSATION)
    assert "".join(t for t, _ in segments) == template.render(CONVERSATION)
    assert [t for t, learned in segments if learned] == ["Hello!<|end|>\n", "4<|end|>\n"]


def test_phi3_s_own_template_read_by_auto_prepares_as_the_builtin(tmp_path: Path) -> None:
    """``data/chat/template=auto`` reads Phi-3's template from the tokenizer_config.json of an ``hf:``
    tokenizer. That template writes eos_token after the last turn only (a generation prompt goes there
    instead), so a conversation is no extension of its prefixes as rendered; with the closing eos_token
    left out (the data adds end-of-text itself) the prepared training split is the built-in phi3's:
    the same tokens, one end-of-text, and only the assistant turns learned."""
    from tests.huggingface.conftest import make_tokenizer

    folder = tmp_path / "phi3"
    make_tokenizer(folder, bos=True)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": PHI3_TEMPLATE}))
    tokenizer = f"hf:{folder / 'tokenizer.json'}"
    own = ChatTemplate.for_tokenizer("auto", tokenizer)
    assert own.name == str(config) and own.eos_token == "<|endoftext|>"
    assert own.render(CONVERSATION).endswith("4<|end|>\n<|endoftext|>")  # the template's own closing
    builtin = ChatTemplate.load("phi3")
    assert own.segments(CONVERSATION) == builtin.segments(CONVERSATION)
    assert own.conversation(CONVERSATION) == builtin.render(CONVERSATION)

    data = _write(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}, {"messages": CONVERSATION[1:3]}])
    prepared = {}
    for choice in ("auto", "phi3"):
        chat = _chat(data, **{"data/chat/template": choice, "data/tokenizer": tokenizer})
        prepared[choice] = prepare(chat, tmp_path / choice, tokenizer=tokenizer)
    tokens, learned = prepared["auto"].tokens("train"), prepared["auto"].learned("train")
    assert learned is not None
    np.testing.assert_array_equal(tokens, prepared["phi3"].tokens("train"))
    np.testing.assert_array_equal(learned, prepared["phi3"].learned("train"))
    eot = prepared["auto"].header.eot_id
    assert int((tokens == eot).sum()) == 2 and tokens[-1] == eot  # one end-of-text per conversation
    first = bytes(tokens[: list(tokens).index(eot)].astype(np.uint8)).decode()
    assert first == builtin.render(CONVERSATION)
    picked = bytes(tokens[: len(first)][learned[: len(first)] == 1].astype(np.uint8)).decode()
    assert picked == "Hello!<|end|>\n4<|end|>\n"


#: google/gemma-3-1b-it's tokenizer_config.json chat_template (its text-only branches).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    '{%- else -%}{%- set first_user_prefix = "" -%}{%- set loop_messages = messages -%}{%- endif -%}'
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{%- endif -%}'
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"
)


def test_gemma_template_renders_as_gemma_s_own_in_transformers(tmp_path: Path) -> None:
    """The built-in gemma against Gemma 3's template rendered by transformers' apply_chat_template: every
    prefix of the conversation, with and without its system message, alike but for the bos_token Gemma's
    writes first (its tokenizer adds that itself)."""
    from transformers import AutoTokenizer

    from tests.huggingface.conftest import make_tokenizer

    make_tokenizer(tmp_path, bos=True)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    hf.chat_template = GEMMA3_TEMPLATE
    template = ChatTemplate.load("gemma")
    for conversation in (CONVERSATION, CONVERSATION[1:]):
        for end in range(1, len(conversation) + 1):
            messages = conversation[:end]
            if messages[-1]["role"] == "system":
                continue
            for prompt in (False, True) if messages[-1]["role"] == "user" else (False,):
                theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
                assert hf.bos_token + template.render(messages, add_generation_prompt=prompt) == theirs
    assert template.prompt("Hi ", system="Be brief.") == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    segments = template.segments(CONVERSATION)
    assert "".join(t for t, _ in segments) == template.render(CONVERSATION)
    assert [t for t, learned in segments if learned] == ["Hello!<end_of_turn>\n", "4<end_of_turn>\n"]


def test_mask_covers_exactly_the_assistant_tokens(tmp_path: Path) -> None:
    data = _write(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}])
    prepared = prepare(_chat(data), tmp_path, tokenizer="byte")
    assert prepared.header.masked and prepared.header.style == "packed"
    tokens = prepared.tokens("train")
    learned = prepared.learned("train")
    text = ChatTemplate.load("chatml").render(CONVERSATION).encode()
    assert bytes(tokens[:-1].astype(np.uint8)) == text and tokens[-1] == 256  # end-of-text closes it
    # by hand: the bytes of "Hello!<|im_end|>\n" and "4<|im_end|>\n", and the end-of-text after the last turn
    first = text.index(b"Hello!")
    second = text.rindex(b"4<|im_end|>")
    expected = np.zeros(len(text) + 1, np.uint8)
    expected[first : first + len(b"Hello!<|im_end|>\n")] = 1
    expected[second:] = 1
    np.testing.assert_array_equal(learned, expected)

    with Flywheel("chat", root=tmp_path, block_size=len(text), batch_size=1, prefetch=0) as wheel:
        batch = wheel.batch(0)
    y = batch["y"][0]
    targets = tokens[1:]
    np.testing.assert_array_equal(y[y != -1], targets[expected[1:] == 1])
    assert int((y != -1).sum()) == int(expected[1:].sum())


def test_template_from_tokenizer_config(tmp_path: Path) -> None:
    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps(
            {
                "eos_token": {"content": "</s>"},
                "chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
                "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}",
            }
        )
    )
    (tmp_path / "tokenizer.json").write_text("{}")
    template = ChatTemplate.load("auto", str(tmp_path / "tokenizer.json"))
    learned = [t for t, flag in template.segments(CONVERSATION[1:3]) if flag]
    assert learned == ["Hello!</s>"]  # trim_blocks drops the newline after a tag, as transformers does


def test_the_declared_template_follows_transformers_precedence(tmp_path: Path) -> None:
    """chat_template.jinja beside the config wins; of a list, the one named default; an empty template is none
    (so a policy starting there is refused up front, not when its first prompt renders)."""
    config = tmp_path / "tokenizer_config.json"
    listed = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    config.write_text(json.dumps({"chat_template": listed}))
    assert declared_template(config, json.loads(config.read_text())) == "D"
    assert ChatTemplate.from_tokenizer_config(config).source == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert ChatTemplate.from_tokenizer_config(config).source == "J"
    (tmp_path / "chat_template.jinja").unlink()
    config.write_text(json.dumps({"chat_template": ""}))
    assert declared_template(config, {"chat_template": ""}) is None
    assert not has_chat_template(config)
    with pytest.raises(DataError, match="has no chat_template"):
        ChatTemplate.from_tokenizer_config(config)
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ \xff }}")
    with pytest.raises(DataError, match=r"chat_template\.jinja is not readable UTF-8 text"):
        has_chat_template(config)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"text": "no messages"}], "has no 'messages' field"),
        ([{"messages": [{"role": "bot", "content": "hi"}]}], "unknown role 'bot'"),
        ([{"messages": [{"role": "user", "content": "hi"}]}], "refused the conversation: no system"),
    ],
    ids=["no-messages", "unknown-role", "template-fails"],
)
def test_bad_chat_rows_are_one_line_errors(tmp_path: Path, rows: list[object], message: str) -> None:
    data = _write(tmp_path / "bad.jsonl", rows)
    jinja = tmp_path / "strict.jinja"
    jinja.write_text(
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('no system message') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(DataError) as info:
        prepare(_chat(data, **{"data/chat/template": str(jinja)}), tmp_path, tokenizer="byte")
    text = str(info.value)
    assert message in text and "\n" not in text
    assert "bad.jsonl:1" in text
