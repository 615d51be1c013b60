"""A process-wide counter of XLA executables built, to prove no recompilation after warm-up.

An executable read from JAX's persistent compilation cache counts as one built: the program was new to this process
(traced and lowered again), whether or not XLA had to compile it."""

from __future__ import annotations

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_PERSISTENT_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_count = 0
_seconds = 0.0


def _on_event(event: str, duration_secs: float, **_: object) -> None:
    global _count, _seconds
    if event == _BACKEND_COMPILE_EVENT:
        _count += 1
        _seconds += duration_secs


def _on_cache_hit(event: str, **_: object) -> None:
    global _count
    if event == _PERSISTENT_CACHE_HIT_EVENT:
        _count += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)
jax.monitoring.register_event_listener(_on_cache_hit)


def compile_count() -> int:
    """Number of XLA executables built so far in this process (compiled or read from the persistent cache)."""
    return _count


def compile_seconds() -> float:
    """Seconds spent in XLA compilations so far in this process (persistent-cache reads excluded)."""
    return _seconds
