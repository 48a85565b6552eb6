"""Test and demo helpers: a tiny random-init causal LM with a locally trained tokenizer, and
``free_port`` (a free loopback TCP port) for tests' own listeners.

The model is saved with ``save_pretrained`` so every engine loads it through the same
``model_name=<path>`` code path used for Hugging Face ids. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

from arctic_platform.rl.network import free_port  # tests' listeners: a free loopback port

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '</s>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]


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


def build_tokenizer(path: str | Path, vocab_size: int = 512, seed: int = 0) -> Path:
    """Train a byte-level BPE tokenizer on a synthetic corpus and save it under ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
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
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
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
) -> Path:
    """Write a random-init causal LM plus tokenizer to ``path`` and return ``path``.

    Defaults give a ~0.5 M-parameter model with head_dim 64, small enough for CPU tests.
    Reuses an existing model at ``path`` when it was built with the same arguments.
    """
    import torch
    import transformers

    path = Path(path)
    spec = {
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
    stamp = path / "arctic_rl_tiny_model.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return path
    build_tokenizer(path, vocab_size=vocab_size, seed=seed)
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


__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "build_tiny_model", "build_tokenizer", "free_port"]
