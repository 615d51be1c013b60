"""experiments.bench.profile_step on a tiny target: the traced step's op time is found and named."""

from __future__ import annotations

from experiments.bench.profile_step import profile, text_table
from tests.test_sampling import tiny_target


def test_a_traced_verify_step_sums_its_ops_by_what_they_compute():
    row = profile(tiny_target(), k=3, context=8, steps=3)
    assert (row["k"], row["tokens"], row["context"]) == (3, 4, 8)
    assert row["wall_ms"] > 0 and row["op_ms"] > 0
    assert abs(sum(row["ops"].values()) - row["op_ms"]) < 1e-9
    assert any("dot" in label for label in row["ops"])  # the matmuls are found and named
    assert "K=3 (T=4, context 8)" in text_table([row])
