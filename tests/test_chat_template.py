"""Chat-template switches (thinking mode, reasoning effort): parsed, checked against the template, applied to the
prompt ids and stored with every run."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from engine import GenerationError, generate
from engine.tokenizer import (
    check_template,
    default_template,
    encode_prompt,
    parse_template,
    template_label,
    template_switches,
)

# A Qwen3-style template reduced to its switch: thinking off adds an empty think block to the generation prompt.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def test_switches_parse_and_print_canonically():
    assert parse_template(" enable_thinking = false, reasoning_effort=low ") == {"enable_thinking": False,
                                                                                 "reasoning_effort": "low"}
    assert parse_template("") == {} and template_label({}) == ""
    assert template_label({"reasoning_effort": "low", "enable_thinking": False}) == \
        "enable_thinking=false,reasoning_effort=low"
    with pytest.raises(ValueError, match="name=value"):
        parse_template("enable_thinking")


def test_a_template_with_a_thinking_switch_reads_it_and_defaults_to_off(target):
    tok = copy.deepcopy(target.tokenizer)
    tok.chat_template = THINKING_TEMPLATE
    assert template_switches(tok) == {"enable_thinking": (False, True)}
    assert default_template(tok) == {"enable_thinking": False}
    off = encode_prompt(tok, "Hi", template={"enable_thinking": False})
    on = encode_prompt(tok, "Hi", template={"enable_thinking": True})
    assert "<think>" in tok.decode(off) and "<think>" not in tok.decode(on) and len(off) > len(on)
    assert check_template(tok, {"enable_thinking": False}) is None
    assert "takes false, true" in check_template(tok, {"enable_thinking": "maybe"})
    result = generate(replace(target, tokenizer=tok), "Hi", max_new_tokens=2, template={"enable_thinking": False})
    assert result.settings["template"] == "enable_thinking=false" and result.prompt_ids == off.tolist()


def test_the_embedded_template_has_no_switches_and_refuses_one(target):
    assert template_switches(target.tokenizer) == {} and default_template(target.tokenizer) == {}
    with pytest.raises(GenerationError, match="does not read the switch 'enable_thinking'.*it reads: none"):
        generate(target, "Hi", max_new_tokens=2, template={"enable_thinking": False})
    result = generate(target, "Hi", max_new_tokens=2)
    assert result.settings["template"] == ""
