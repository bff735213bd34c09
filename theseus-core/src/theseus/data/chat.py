"""Chat templates: render ``messages`` to text, and split a conversation into learned and
unlearned pieces (only assistant turns are learned).

A template is a Jinja2 program in the Hugging Face convention (``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``raise_exception``), read from a tokenizer's ``tokenizer_config.json``
(``chat_template``), from a ``.jinja`` file, or one of the built-in templates (``chatml``, ``plain``, ``phi3``,
``gemma``) that suit byte-level and BPE tokenizers without one.

This is the template itself, used by both sides of a chat run: the ``dataset/chat`` source of
theseus-data (``theseus.data.datasets.chat``) renders conversations with it, and theseus-models keeps
the template of a fine-tuned run in its folder (``theseus.model.loading.chat``) to render prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.data.bounded_jinja import RenderBoundError, bounded_environment, compile_bounded, render_bounded
from theseus.data.tokenizers.spec import parse_spec
from theseus.errors import DataError

ROLES = ("system", "user", "assistant", "tool")

#: Built-in templates, by name.
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "plain": (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}Assistant: {{ m['content'] }}{{ eos_token }}\n"
        "{% else %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}Assistant: {% endif %}"
    ),
    # Phi-3's turns (<|system|> / <|user|> / <|assistant|>, each closed by <|end|>); Phi-3's own template also
    # writes eos_token after a conversation, which the data pipeline's end-of-text already adds.
    "phi3": (
        "{% for m in messages %}{% if m['role'] in ('system', 'user', 'assistant') %}"
        "<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    # Gemma's turns (<start_of_turn>user / <start_of_turn>model, each closed by <end_of_turn>), a system
    # message written at the start of the first user turn, as Gemma 3's template does; Gemma's own template
    # also starts with bos_token, which its tokenizer adds itself.
    "gemma": (
        "{% for m in messages %}{% if m['role'] != 'system' %}"
        "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        "{% if loop.index0 == 1 and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
        "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
}

Message = Mapping[str, Any]


def special_token_text(value: Any) -> str:
    """A special token as ``tokenizer_config.json`` writes it (a string or ``{"content": ...}``) as text;
    "" for anything else."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else ""


#: Where transformers 5 saves a chat template, beside ``tokenizer_config.json``.
CHAT_TEMPLATE_JINJA = "chat_template.jinja"


def has_chat_template(config: Path) -> bool:
    """Whether the checkpoint of ``config`` (its ``tokenizer_config.json``, or a run's
    ``chat_template.json``) has a chat template (:func:`declared_template`)."""
    return declared_template(config, read_json_object(config) if config.is_file() else {}) is not None


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja2 chat template with the special-token strings it may use."""

    source: str
    name: str = "custom"
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def load(cls, choice: str, tokenizer_path: str | None = None) -> ChatTemplate:
        """The template named by ``choice``.

        ``choice``: a built-in name (``chatml``, ``plain``, ``phi3``, ``gemma``), a path to ``tokenizer_config.json`` or
        to a ``.jinja`` file, or ``auto``: the ``chat_template`` of the ``tokenizer_config.json``
        beside ``tokenizer_path`` when there is one, else ``chatml``.
        """
        if choice in BUILTIN_TEMPLATES:
            return cls(BUILTIN_TEMPLATES[choice], name=choice)
        if choice == "auto":
            if tokenizer_path:
                config = Path(tokenizer_path).expanduser().parent / "tokenizer_config.json"
                if has_chat_template(config):
                    return cls.from_tokenizer_config(config)
            return cls(BUILTIN_TEMPLATES["chatml"], name="chatml")
        path = Path(choice).expanduser()
        if path.is_dir():
            path = path / "tokenizer_config.json"
        if not path.is_file():
            names = ", ".join(BUILTIN_TEMPLATES)
            raise DataError(
                f"chat template {choice!r} is neither a built-in ({names}, auto) nor an existing file; "
                "give a tokenizer_config.json or a .jinja file"
            )
        if path.suffix == ".json":
            return cls.from_tokenizer_config(path)
        return cls(path.read_text(encoding="utf-8"), name=str(path))

    @classmethod
    def for_tokenizer(cls, choice: str, tokenizer: str | Mapping[str, Any] | None) -> ChatTemplate:
        """The template named by ``choice`` for data tokenized by ``tokenizer`` (a spec): ``auto``
        looks beside the file of an ``hf`` tokenizer, see :meth:`load`."""
        spec = parse_spec(tokenizer) if tokenizer else {}
        path = spec.get("path") if spec.get("kind") == "hf" else None
        return cls.load(choice or "auto", path)

    @classmethod
    def from_tokenizer_config(cls, path: str | Path) -> ChatTemplate:
        """The chat template of a Hugging Face ``tokenizer_config.json``: the ``chat_template.jinja`` beside
        it, else its ``chat_template`` (the default one of a list)."""
        path = Path(path)
        data = read_json_object(path) if path.is_file() else {}
        template = declared_template(path, data)
        if template is None:
            raise DataError(f"{path} has no chat_template; choose a built-in template with data/chat/template=chatml")
        return cls(
            template,
            name=str(path),
            bos_token=special_token_text(data.get("bos_token")),
            eos_token=special_token_text(data.get("eos_token")),
        )

    def record(self) -> dict[str, Any]:
        """What prepared data records of its template (``chat_template`` and ``chat_tokens``), which a
        fine-tuned run keeps in the ``tokenizer_config.json`` layout."""
        return {"chat_template": self.source, "chat_tokens": {"bos_token": self.bos_token, "eos_token": self.eos_token}}

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """The conversation as text; DataError when the template fails."""
        try:
            return render_bounded(
                _compiled(self.source),
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except DataError:
            raise
        except RenderBoundError as exc:
            raise DataError(
                f"chat template {self.name} was stopped while rendering a conversation: {exc}; "
                "choose another template with data/chat/template"
            ) from exc
        except Exception as exc:  # jinja2 errors and raise_exception() from the template itself
            raise DataError(
                f"chat template {self.name} failed to render ({type(exc).__name__}: {exc}); "
                "fix the conversation or choose another template with data/chat/template"
            ) from exc

    def prompt(self, user: str, system: str | None = None) -> str:
        """The text that asks the model for an answer to ``user`` (generation prompt included)."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.render(messages, add_generation_prompt=True)

    def conversation(self, messages: Sequence[Message]) -> str:
        """The conversation as training text: :meth:`render` without the ``eos_token`` that a template
        writes after the last turn only (Phi-3's, where no generation prompt follows), since the data
        closes every conversation with end-of-text itself."""
        return self._opened(self.render(messages), self._closing(messages[:1]))

    def segments(self, messages: Sequence[Message]) -> tuple[tuple[str, bool], ...]:
        """``(text, learned)`` pieces whose concatenation is the :meth:`conversation` text.

        Each assistant turn (its content and end marker, not the header the generation prompt
        adds) is learned; everything else is not. Found by rendering the conversation one message
        at a time, so the template must render each conversation as an extension of its prefixes
        (once the ``eos_token`` it closes a conversation with is left out, see :meth:`conversation`).
        """
        check_messages(messages)
        closing = self._closing(messages[:1])
        pieces: list[tuple[str, bool]] = []
        done = ""
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                head = self.render(messages[:i], add_generation_prompt=True) if i else self._empty_prompt()
                done = self._extend(pieces, done, head, False)
            ended = self._opened(self.render(messages[: i + 1]), closing)
            done = self._extend(pieces, done, ended, message["role"] == "assistant")
        return tuple(pieces)

    @staticmethod
    def _opened(rendered: str, closing: str) -> str:
        return rendered[: -len(closing)] if closing and rendered.endswith(closing) else rendered

    def _closing(self, first: Sequence[Message]) -> str:
        """``eos_token`` when the template writes it after a conversation's last turn but not before a
        generation prompt there (a conversation of the ``first`` message tells), else ``""``."""
        eos = self.eos_token
        if not eos or not first:
            return ""
        try:
            ended, prompted = self.render(first), self.render(first, add_generation_prompt=True)
        except DataError:  # the first message alone is no conversation to this template
            return ""
        if not ended.endswith(eos) or prompted.startswith(ended):
            return ""
        return eos if prompted.startswith(ended[: -len(eos)]) else ""

    def _empty_prompt(self) -> str:
        try:
            return self.render([], add_generation_prompt=True)
        except DataError:
            return ""

    def _extend(self, pieces: list[tuple[str, bool]], done: str, rendered: str, learned: bool) -> str:
        if not rendered.startswith(done):
            raise DataError(
                f"chat template {self.name} does not render a conversation as an extension of its first "
                "messages, so assistant turns cannot be told apart; choose another template with data/chat/template"
            )
        if len(rendered) > len(done):
            pieces.append((rendered[len(done) :], learned))
        return rendered


def check_messages(messages: Any, where: str = "a conversation") -> None:
    """DataError unless ``messages`` is a non-empty list of ``{"role", "content"}`` with known roles."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f'{where} has no \'messages\' list; each chat row needs "messages": [{{"role", "content"}}]')
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise DataError(f"{where} has a message without string 'content': {message!r}")
        role = message.get("role")
        if role not in ROLES:
            raise DataError(f"{where} has a message with unknown role {role!r}; use one of {', '.join(ROLES)}")


def declared_template(config: Path, data: Mapping[str, Any]) -> str | None:
    """The chat template a Hugging Face tokenizer declares: the ``chat_template.jinja`` beside its
    ``config`` file (``tokenizer_config.json``, whose contents are ``data``), else the config's
    ``chat_template`` (of a list, the one named ``default``, else the first); None when it has none.
    A DataError names a ``chat_template.jinja`` that is not readable text."""
    jinja = config.parent / CHAT_TEMPLATE_JINJA
    template = data.get("chat_template")
    if jinja.is_file():
        try:
            template = jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{jinja} is not readable UTF-8 text ({exc}); download it again") from exc
    if isinstance(template, list):
        named = {str(t.get("name")): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object of a checkpoint's or a run's file; a DataError naming it when it is unreadable
    or holds anything but an object."""
    try:
        return jsonfile.read_object(path, check_numbers=False)  # model_max_length may be int(1e30)
    except jsonfile.UnreadableJSON as exc:
        raise DataError(str(exc)) from exc


_CACHE: dict[str, Any] = {}


def _compiled(source: str) -> Any:
    template = _CACHE.get(source)
    if template is None:
        try:
            from jinja2 import TemplateError
        except ImportError as exc:  # pragma: no cover - jinja2 is a dependency
            raise DataError("chat templates need jinja2; pip install jinja2") from exc

        def raise_exception(message: str) -> None:
            raise DataError(f"chat template refused the conversation: {message}")

        env = bounded_environment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            template = compile_bounded(env, source)
        except TemplateError as exc:
            raise DataError(f"chat template does not parse ({exc}); fix it or choose another") from exc
        _CACHE[source] = template
    return template


__all__ = [
    "BUILTIN_TEMPLATES",
    "CHAT_TEMPLATE_JINJA",
    "ROLES",
    "ChatTemplate",
    "check_messages",
    "declared_template",
    "has_chat_template",
    "read_json_object",
    "special_token_text",
]
