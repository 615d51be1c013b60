"""sha256 digests of what the records name: a file (read in blocks, or only its first bytes), bytes or text."""

from __future__ import annotations

import hashlib
from pathlib import Path

SHORT = 16  # hex digits of a short digest (dataset and validation-split ids in cards and manifests)


def sha256(source: Path | bytes | str, *, short: bool = False, head: int | None = None) -> str:
    """Hex sha256 of a file (Path; `head`: only its first bytes), of bytes, or of text (UTF-8); `short`: its first
    SHORT digits."""
    h = hashlib.sha256()
    if isinstance(source, Path):
        with open(source, "rb") as f:
            if head is not None:
                h.update(f.read(head))
            else:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    else:
        h.update(source.encode() if isinstance(source, str) else source)
    return h.hexdigest()[:SHORT] if short else h.hexdigest()
