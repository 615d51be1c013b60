"""The device is used by one run at a time: what holds it now, so the users waiting for it are told.

Every event that runs the target shares Gradio's "device" concurrency group (DEVICE, limit 1); on_device wraps
its handler so that while it runs, the workbench's DeviceUse says what it is, since when and about how long it has
left. The page polls busy_text outside the queue, so a user whose run waits reads why and for how long.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

DEVICE = dict(concurrency_id="device", concurrency_limit=1)  # one run on the accelerator at a time


@dataclass
class DeviceUse:
    """The handler holding the device: what it runs, whose it is (a browser session, or None) and its progress."""

    what: str
    session: str | None
    t0: float = field(default_factory=time.perf_counter)
    doing: Callable[[], str] | None = None  # the current run's progress (app.runner.run_stream sets it)

    def text(self) -> str:
        """'another run holds the device: Generate, running 12 s; ngram K=4: 41/128 tokens, at most about 9 s
        left. A run started now waits for it.'"""
        now = self.doing() if self.doing is not None else ""
        return (f"another run holds the device: {self.what}, running {time.perf_counter() - self.t0:.0f} s"
                f"{'; ' + now if now else ''}. A run started now waits for it.")


def session_key(request: gr.Request | None) -> str:
    """The browser session's key (API calls without a session share one)."""
    return (request.session_hash if request is not None else None) or "api"


def on_device(wb: Any, what: str, fn: Callable) -> Callable:
    """fn (a function or a generator function) as a holder of the device: wb.device_use names it while it runs.
    Its signature is fn's (Gradio reads the API names and the injected gr.Request from it)."""
    def begin(args: tuple, kwargs: dict) -> None:
        request = next((a for a in (*args, *kwargs.values()) if isinstance(a, gr.Request)), None)
        wb.device_use = DeviceUse(what, session_key(request) if request is not None else None)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            begin(args, kwargs)
            try:
                yield from fn(*args, **kwargs)
            finally:
                wb.device_use = None
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        begin(args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            wb.device_use = None
    return call


def busy_text(use: DeviceUse | None, session: str) -> str:
    """What a session is told about the device: '' when it is free or the session's own run holds it."""
    if use is None or (use.session is not None and use.session == session):
        return ""
    return use.text()
