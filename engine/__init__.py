"""draftscope engine: JAX target models, drafters and the lossless speculative decoding loop."""

from .config import CheckpointError, ModelConfig
from .decode import GenerationError, generate, generate_batch, stream, warm_up
from .drafters import DRAFTER_NAMES, Drafter, DrafterError, load_drafter
from .jit_stats import compile_count
from .sharding import MeshError, make_mesh
from .target import Target, load_target, shard_target
from .trace import GenerationResult, StepTrace

__all__ = ["CheckpointError", "ModelConfig", "GenerationError", "generate", "generate_batch", "stream", "warm_up",
           "DRAFTER_NAMES", "Drafter", "DrafterError", "load_drafter", "compile_count", "MeshError", "make_mesh",
           "Target", "load_target", "shard_target", "GenerationResult", "StepTrace"]
