"""One process of a two-process JAX run on loopback (4 CPU devices each, one 2x4 mesh over all 8).

    python tests/multihost_worker.py PROCESS_ID PORT
Prints the generation as JSON. Started twice by tests/test_sharding.py.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402

from engine.decode import generate  # noqa: E402
from engine.drafters import load_drafter  # noqa: E402
from engine.sharding import describe  # noqa: E402
from engine.target import load_target  # noqa: E402

PROMPT = "What is 12 plus 7? Explain step by step."


def main() -> None:
    process_id, port = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=120)
    target = load_target(mesh=sys.argv[3] if len(sys.argv) > 3 else "2x4")
    result = generate(target, PROMPT, load_drafter("ngram", target, k=4), max_new_tokens=24)
    json.dump({"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
               "local_devices": jax.local_device_count(), "tokens": result.token_ids,
               "layout": describe(target.mesh, target.params, target.cfg.num_heads, target.cfg.num_kv_heads)},
              sys.stdout)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
