"""The one label of the hardware the engine runs on, as the history stores it with every sweep and run."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import jax


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def hardware_label() -> str:
    """'<backend>: <device kind or CPU model> (<N> host cores)', e.g. 'cpu: AMD EPYC 9654 (2 cores)' or
    'gpu: NVIDIA H200 (16 cores)'."""
    backend, kind = jax.default_backend(), jax.devices()[0].device_kind
    name = cpu_model() if backend == "cpu" or kind.lower() == "cpu" else kind
    return f"{backend}: {name} ({os.cpu_count()} cores)"
