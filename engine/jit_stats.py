"""A process-wide counter of XLA backend compilations, to prove no recompilation after warm-up."""

from __future__ import annotations

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_count = 0
_seconds = 0.0


def _on_event(event: str, duration_secs: float, **_: object) -> None:
    global _count, _seconds
    if event == _BACKEND_COMPILE_EVENT:
        _count += 1
        _seconds += duration_secs


jax.monitoring.register_event_duration_secs_listener(_on_event)


def compile_count() -> int:
    """Number of XLA compilations so far in this process."""
    return _count


def compile_seconds() -> float:
    """Seconds spent in XLA compilations so far in this process."""
    return _seconds
