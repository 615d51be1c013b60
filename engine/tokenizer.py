"""Tokenizer and chat template through transformers, from a HF directory or from GGUF metadata (torch-free)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .config import CheckpointError

# GGUF tokenizer keys -> names transformers' converter expects (transformers 5.24, pinned).
_GGUF_TOKENIZER_KEYS = {
    "ggml.model": "tokenizer_type", "ggml.pre": "pre_tokenizer_type", "ggml.tokens": "tokens",
    "ggml.scores": "scores", "ggml.token_type": "token_type", "ggml.merges": "merges",
    "ggml.bos_token_id": "bos_token_id", "ggml.eos_token_id": "eos_token_id",
    "ggml.unknown_token_id": "unk_token_id", "ggml.padding_token_id": "pad_token_id",
    "ggml.add_space_prefix": "add_prefix_space",
}
_SPECIAL = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
            "unk_token": "unk_token_id", "pad_token": "pad_token_id"}


def _gguf_value(field):
    """A GGUF metadata field as a Python value (string, number or list)."""
    kinds = [t.name for t in field.types]
    if kinds[0] == "ARRAY":
        if kinds[-1] == "STRING":
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].item() for i in field.data]
    value = field.parts[field.data[0]]
    return bytes(value).decode() if kinds[0] == "STRING" else value.item()


def tokenizer_from_gguf(path: Path) -> PreTrainedTokenizerFast:
    """Build the fast tokenizer (with chat template) that a GGUF file describes, without torch."""
    import gguf
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    reader = gguf.GGUFReader(str(path))
    meta = {k: _gguf_value(f) for k, f in reader.fields.items() if k.startswith(("tokenizer.", "general.arch"))}
    tok_dict = {name: meta[f"tokenizer.{key}"] for key, name in _GGUF_TOKENIZER_KEYS.items()
                if f"tokenizer.{key}" in meta}
    backend, _ = convert_gguf_tokenizer(meta["general.architecture"], tok_dict)
    kwargs = {name: tok_dict["tokens"][tok_dict[key]] for name, key in _SPECIAL.items() if key in tok_dict}
    if "tokenizer.chat_template" in meta:
        kwargs["chat_template"] = meta["tokenizer.chat_template"]
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """Tokenizer for a checkpoint path (a HF directory or a .gguf file)."""
    try:
        if path.suffix == ".gguf":
            return tokenizer_from_gguf(path)
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad tokenizer dir
        raise CheckpointError(f"cannot load a tokenizer from {path}: {e}") from None


# Chat-template switches that change what a target reads (and so what a drafter trained on one setting accepts),
# with the values they take: Qwen3's thinking mode, gpt-oss Harmony's reasoning effort.
TEMPLATE_SWITCHES: dict[str, tuple] = {"enable_thinking": (False, True), "reasoning_effort": ("low", "medium", "high")}


def template_switches(tokenizer: PreTrainedTokenizerBase) -> dict[str, tuple]:
    """The switches (of TEMPLATE_SWITCHES) this tokenizer's chat template reads, with their values."""
    text = tokenizer.chat_template if isinstance(getattr(tokenizer, "chat_template", None), str) else ""
    return {name: values for name, values in TEMPLATE_SWITCHES.items() if name in text}


def default_template(tokenizer: PreTrainedTokenizerBase) -> dict:
    """Switches runs default to: thinking off where the template has it (the published Qwen3 DFlash and EAGLE-3
    drafters were trained non-thinking), else none."""
    return {"enable_thinking": False} if "enable_thinking" in template_switches(tokenizer) else {}


def parse_template(text: str | None) -> dict:
    """'enable_thinking=false, reasoning_effort=low' -> {"enable_thinking": False, "reasoning_effort": "low"}."""
    out = {}
    for part in (text or "").replace(";", ",").split(","):
        if not part.strip():
            continue
        name, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not name or not value:
            raise ValueError(f"chat-template switches are name=value pairs separated by commas, got {part!r}")
        out[name] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def _value_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def template_label(template: dict | None) -> str:
    """A canonical text of switches ('' for none), stored with every run and compared like any setting."""
    return ",".join(f"{k}={_value_text(v)}" for k, v in sorted((template or {}).items()))


def check_template(tokenizer: PreTrainedTokenizerBase, template: dict | None) -> str | None:
    """Why these switches cannot apply to this tokenizer's template, or None when they can."""
    known = template_switches(tokenizer)
    for name, value in (template or {}).items():
        if name not in known:
            has = ", ".join(known) or "none"
            return f"the chat template does not read the switch {name!r} (it reads: {has})"
        if value not in known[name]:
            return f"chat-template switch {name} takes {', '.join(map(_value_text, known[name]))}, got {value!r}"
    return None


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, raw: bool = False,
                  template: dict | None = None) -> np.ndarray:
    """Token ids for a prompt: chat-formatted with a generation prompt (and the template's switches) unless `raw` or
    no template exists."""
    if not raw and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                            add_generation_prompt=True, return_dict=False, **(template or {}))
    else:
        ids = tokenizer(prompt)["input_ids"]
    return np.asarray(ids, dtype=np.int32)
