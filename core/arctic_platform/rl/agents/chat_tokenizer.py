"""``ChatTokenizer``: a model's own tokenizer and chat template, used only to render messages
to text and to tokenize text (never to re-encode sampled completions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class ChatTokenizer:
    """A Hugging Face tokenizer with a chat template, seen as text rendering plus encoding.

    Build it with ``from_pretrained(model_dir)`` (``transformers`` is imported then, not
    before) or around an already loaded tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        if tokenizer.eos_token_id is None or tokenizer.eos_token is None:
            raise ValueError("the tokenizer has no eos token")
        self._tok = tokenizer
        self._longest_piece: int | None = None
        self.eos_id: int = int(tokenizer.eos_token_id)
        self.eos_text: str = str(tokenizer.eos_token)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ChatTokenizer:
        """The tokenizer saved in the local model directory ``path`` (nothing is downloaded)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    @property
    def raw(self) -> Any:
        """The wrapped Hugging Face tokenizer."""
        return self._tok

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """``messages`` (and ``tools``) rendered by the chat template, as text."""
        text = self._tok.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the template wrote it (no special tokens added)."""
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``ids``."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_id(self, text: str) -> int | None:
        """The id of ``text`` when it is exactly one token of the vocabulary, else None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))`` found without tokenizing: no token covers
        more characters than the longest piece of the vocabulary spells (halved, for
        normalisers that merge characters). For refusing a huge text cheaply."""
        if self._longest_piece is None:
            vocab = self._tok.get_vocab()
            self._longest_piece = max((len(piece) for piece in vocab), default=1)
        return len(text) // (2 * max(self._longest_piece, 1))
