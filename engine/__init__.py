"""draftscope engine: JAX target models, drafters and the lossless speculative decoding loop."""

from .config import CheckpointError, ModelConfig
from .decode import GenerationError, generate, stream
from .drafters import DRAFTER_NAMES, Drafter, DrafterError, load_drafter
from .jit_stats import compile_count
from .target import Target, load_target
from .trace import GenerationResult, StepTrace

__all__ = ["CheckpointError", "ModelConfig", "GenerationError", "generate", "stream", "DRAFTER_NAMES", "Drafter",
           "DrafterError", "load_drafter", "compile_count", "Target", "load_target", "GenerationResult",
           "StepTrace"]
