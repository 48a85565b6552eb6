"""Test and demo helpers: a tiny random-init causal LM with a locally trained tokenizer, and
``free_port`` (a free loopback TCP port) for tests' own listeners.

The model is saved with ``save_pretrained`` so every engine loads it through the same
``model_name=<path>`` code path used for Hugging Face ids. Nothing is downloaded.

Two tokenizer flavours exist, chosen by ``chat_format``: ``"plain"`` (the original
``<|user|>...</s>`` template) and ``"chatml"`` (Qwen3/Hermes-style ChatML with tool calls).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

from arctic_platform.rl.network import free_port  # tests' listeners: a free loopback port

ChatFormat = Literal["plain", "chatml"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '</s>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]

# --- ChatML flavour -------------------------------------------------------------------------
# Control tokens (special: dropped by ``skip_special_tokens``). There is no BOS; EOS is
# ``<|im_end|>`` (the end of every turn, so engines stop after one assistant turn); padding
# uses a dedicated ``<|pad|>`` that never occurs in rendered text; ``<|endoftext|>`` is only
# a document separator.
CHATML_PAD = "<|pad|>"
END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Tags that stay in decoded text (single added tokens, but not special), as in Qwen's
# tokenizer, so tool-call parsers still see them when special tokens are skipped.
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
THINK_START = "<think>"
THINK_END = "</think>"
CHATML_CONTROL_TOKENS = [CHATML_PAD, END_OF_TEXT, IM_START, IM_END]
CHATML_TEXT_TAGS = [
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
    THINK_START,
    THINK_END,
]
# All ChatML added tokens, in id order: ids 0..9 of every chatml tokenizer.
CHATML_SPECIAL_TOKENS = CHATML_CONTROL_TOKENS + CHATML_TEXT_TAGS

# Renders each turn as ``<|im_start|>{role}\n{content}<|im_end|>\n``; ``tools`` go into a
# leading system turn (merged with a first system message); consecutive tool results share
# one user turn of ``<tool_response>`` blocks. Earlier turns are never rewritten (content is
# verbatim, think blocks kept), so rendering k messages with the generation prompt plus the
# sampled assistant turn is a token prefix of rendering the longer conversation.
CHATML_TEMPLATE = r"""
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages and messages[0].role == 'system' and messages[0].content is string -%}
    {{- messages[0].content ~ '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nYou can call these functions; each JSON signature is one line in'
      ~ ' <tools></tools>:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' ~ (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nTo call one, answer with its name and a JSON object of arguments:\n'
      ~ '<tool_call>\n{"name": <function-name>, "arguments": <args-json>}\n</tool_call>'
      ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if loop.first and tools and message.role == 'system' -%}
  {%- elif message.role == 'tool' -%}
    {%- if loop.previtem is not defined or loop.previtem.role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' ~ content ~ '\n</tool_response>' -}}
    {%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' ~ message.role ~ '\n' ~ content -}}
    {%- if message.role == 'assistant' and message.tool_calls -%}
      {%- for tool_call in message.tool_calls -%}
        {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
        {%- if call.arguments is string -%}{%- set args = call.arguments -%}
        {%- elif call.arguments is mapping -%}{%- set args = call.arguments | tojson -%}
        {%- else -%}{%- set args = '{}' -%}{%- endif -%}
        {%- set name = call.name if call.name is string else '' -%}
        {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
        {{- '<tool_call>\n{"name": ' ~ (name | tojson) ~ ', "arguments": ' ~ args
            ~ '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    """A small synthetic corpus: digit strings, arithmetic and common words."""
    rng = random.Random(seed)
    words = (
        "the a of and to in is it that for on with as was are be this by answer sum digits "
        "number write give me a string whose equals target question reply yes no one two "
        "three four five six seven eight nine zero plus minus times result"
    ).split()
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.4:
            out.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12))))
        elif kind < 0.7:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            out.append(f"{a} + {b} = {a + b}")
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
    return out


def _chat_corpus(seed: int, lines: int = 1500) -> list[str]:
    """Extra ChatML training text: role words, tool signatures and JSON-ish tool calls."""
    rng = random.Random(f"chatml-{seed}")
    names = ["lookup", "search", "get", "add"]
    keys = ["key", "value", "query", "name", "id"]
    words = "system user assistant tool function call result value key lookup found".split()
    out = []
    for _ in range(lines):
        kind = rng.random()
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6)))
        key = rng.choice(keys)
        if kind < 0.35:
            args = json.dumps({key: digits})
            out.append(f'{{"name": "{rng.choice(names)}", "arguments": {args}}}')
        elif kind < 0.55:
            out.append(json.dumps({rng.choice(keys): digits, rng.choice(keys): digits}))
        elif kind < 0.7:
            name = rng.choice(names)
            out.append(
                json.dumps(
                    {
                        "type": "function",
                        "function": {
                            "name": name,
                            "description": f"{name} the value of a key",
                            "parameters": {
                                "type": "object",
                                "properties": {key: {"type": "string"}},
                                "required": [key],
                            },
                        },
                    }
                )
            )
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))))
    return out


def build_tokenizer(
    path: str | Path,
    vocab_size: int = 512,
    seed: int = 0,
    *,
    chat_format: ChatFormat = "plain",
) -> Path:
    """Train a byte-level BPE tokenizer on a synthetic corpus and save it under ``path``.

    ``chat_format="chatml"`` gives the ChatML/tool-calling flavour (``CHATML_TEMPLATE``).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if chat_format not in ("plain", "chatml"):
        raise ValueError(f"chat_format {chat_format!r} is not one of ['plain', 'chatml']")
    chatml = chat_format == "chatml"
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE() if chatml else models.BPE(unk_token="<unk>"))
    # Digits are split one by one so a digit string is one token per digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=CHATML_SPECIAL_TOKENS if chatml else SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _corpus(seed) + _chat_corpus(seed) if chatml else _corpus(seed)
    tok.train_from_iterator(corpus, trainer=trainer)
    if not chatml:
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
        )
        fast.chat_template = CHAT_TEMPLATE
        fast.save_pretrained(str(path))
        return path
    # The trainer adds every token as special; the tags become plain added tokens (kept in
    # decoded text). A JSON round trip rebuilds the special set from the updated flags.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHATML_TEXT_TAGS])
    tok = Tokenizer.from_str(tok.to_str())
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=CHATML_PAD,
        extra_special_tokens=[END_OF_TEXT, IM_START],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(path))
    return path


def build_tiny_model(
    path: str | Path,
    arch: Literal["llama", "qwen2"] = "llama",
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    vocab_size: int = 512,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    chat_format: ChatFormat = "plain",
) -> Path:
    """Write a random-init causal LM plus tokenizer to ``path`` and return ``path``.

    Defaults give a ~0.5 M-parameter model with head_dim 64, small enough for CPU tests.
    Reuses an existing model at ``path`` when it was built with the same arguments.
    ``chat_format="chatml"`` uses the ChatML tokenizer; eos is then ``<|im_end|>``.
    """
    import torch
    import transformers

    path = Path(path)
    spec: dict[str, object] = {
        "arch": arch,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "seed": seed,
    }
    if chat_format != "plain":  # absent for "plain" so models cached before it still match
        spec["chat_format"] = chat_format
    stamp = path / "arctic_rl_tiny_model.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return path
    build_tokenizer(path, vocab_size=vocab_size, seed=seed, chat_format=chat_format)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    if arch == "llama":
        config: transformers.PretrainedConfig = transformers.LlamaConfig(**common)
        model_cls: type = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        model_cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(f"arch {arch!r} is not one of ['llama', 'qwen2']")
    torch.manual_seed(seed)
    model = model_cls(config)
    model.save_pretrained(str(path), safe_serialization=True)
    transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(str(path))
    stamp.write_text(json.dumps(spec))
    return path


__all__ = [
    "CHATML_CONTROL_TOKENS",
    "CHATML_PAD",
    "CHATML_SPECIAL_TOKENS",
    "CHATML_TEMPLATE",
    "CHATML_TEXT_TAGS",
    "CHAT_TEMPLATE",
    "END_OF_TEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "THINK_END",
    "THINK_START",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "TOOL_RESPONSE_END",
    "TOOL_RESPONSE_START",
    "ChatFormat",
    "build_tiny_model",
    "build_tokenizer",
    "free_port",
]
