"""Gradio components whose choices change while a page is open, typed for API clients as what they accept."""

from __future__ import annotations

import functools
from typing import Any

import gradio as gr


class OpenDropdown(gr.Dropdown):
    """A dropdown whose choices change while a page is open (stored runs, sweeps, drafters loaded by path): any
    value passes to the handler, which refuses one it does not know. API clients see a string (a list of strings
    when multiselect), not the choices frozen when the page was built."""

    is_template = True  # rendered as the Dropdown it is

    @functools.wraps(gr.Dropdown.__init__)  # Gradio reads a component's props from its __init__ signature
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs | {"allow_custom_value": True})

    def api_info(self) -> dict[str, Any]:
        return {"type": "array", "items": {"type": "string"}} if self.multiselect else {"type": "string"}


class DrafterChecks(gr.CheckboxGroup):
    """The drafters to compare, as checkboxes. Labels pass through unchecked and compare() refuses one that is not
    loaded, so a drafter loaded by path after the page was built (absent from the choices here) compares too."""

    is_template = True  # rendered as the CheckboxGroup it is

    def preprocess(self, payload: list[str] | None) -> list[str]:
        return list(payload or [])

    def api_info(self) -> dict[str, Any]:
        return {"type": "array", "items": {"type": "string"}}
