"""The llama.cpp peer without llama.cpp: its output parsing (on real printouts captured from llama.cpp's tools), the
message when the tools are not built, and the HF directory of a target written from our own params (it loads in
transformers and gives our engine's logits). No test here needs the llama.cpp build."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from engine.cache import init_cache
from engine.config import ModelConfig
from engine.model import forward
from engine.target import Target
from engine.weights import build_params
from experiments.bench import llama_cpp, peers
from experiments.bench.llama_cpp import generated_text, parse_completion, parse_speculative
from experiments.bench.peers import PeerError

FIXTURES = Path(__file__).parent / "fixtures" / "llama_cpp"
VOCAB, HIDDEN = 128, 32


# ---------------------------------------------------------------- parsing real printouts

def test_parse_speculative_dflash_printout():
    run = parse_speculative((FIXTURES / "speculative_dflash.txt").read_text())
    expected = json.loads((FIXTURES / "expected.json").read_text())["speculative_dflash"]
    assert (run.n_prompt, run.n_generated, run.n_drafted, run.n_accept) == tuple(
        expected[k] for k in ("n_prompt", "n_generated", "n_drafted", "n_accept"))
    assert run.decode_s == pytest.approx(expected["decode_s"])
    # every verify step emits its accepted drafts plus one target token
    assert run.tau == pytest.approx(expected["n_generated"] / (expected["n_generated"] - expected["n_accept"]))
    assert run.tok_per_s == pytest.approx(expected["n_generated"] / expected["decode_s"])


def test_parse_completion_printout():
    run = parse_completion((FIXTURES / "completion_plain.txt").read_text())
    expected = json.loads((FIXTURES / "expected.json").read_text())["completion_plain"]
    assert (run.n_prompt, run.n_generated) == (expected["n_prompt"], expected["n_generated"])
    assert run.decode_s == pytest.approx(expected["decode_s"])
    assert run.n_accept is None and run.tau == 1.0


def test_parse_refuses_output_without_stats():
    log = (FIXTURES / "speculative_dflash.txt").read_text()
    cut = log[:log.index("decoded")]  # a run killed before its summary
    with pytest.raises(PeerError, match="decode time"):
        parse_speculative(cut)
    with pytest.raises(PeerError, match="eval line"):
        parse_completion("llama_perf_context_print: prompt eval time = 1.0 ms / 3 tokens")


def test_generated_text_after_echoed_prompt():
    assert generated_text("\n\n<|im_start|>user\nhi<|im_end|>\nHello!\n\n", "<|im_start|>user\nhi<|im_end|>\n") \
        == "Hello!"
    assert generated_text(" Hello!\n", "a prompt not echoed") == "Hello!"


# ---------------------------------------------------------------- the build is optional

def test_absent_build_names_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv(llama_cpp.LLAMA_CPP_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(PeerError, match=r"scripts/build_llama_cpp\.sh") as e:
        llama_cpp.llama_cpp_tools()
    assert "llama-speculative-simple" in str(e.value) and str(tmp_path / "nowhere") in str(e.value)


def test_cli_without_build_says_so_and_exits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(llama_cpp.LLAMA_CPP_ENV, str(tmp_path))
    assert llama_cpp.llama_cpp_main(["--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the llama.cpp peer needs llama.cpp's tools") and "build_llama_cpp.sh" in err


@pytest.mark.parametrize("config, refused", [
    ({"architectures": ["DFlashDraftModel"], "dflash_config": {"mask_token_id": 16}}, None),
    ({"architectures": ["DFlashDraftModel"], "dflash_config": {"lookup_hints": 3}}, "lookup hints"),
    ({"architectures": ["DominoDraftModel"], "dflash_config": {}}, "Domino"),
    ({"architectures": ["DFlashDraftModel"], "dflash_config": {"projector_type": "domino"}}, "Domino"),
])
def test_dflash_drafters_llama_cpp_would_draft_otherwise_are_refused(tmp_path, config, refused):
    """llama.cpp's draft-dflash starts blocks from MASK tokens without a Domino head: a drafter that needs either
    is named as a problem, not run there as another drafter."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    why = llama_cpp.llama_cpp_refusal(tmp_path)
    assert why is None if refused is None else refused in why


# ---------------------------------------------------------------- the HF directory writer

def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def tiny_target(arch: str, tied: bool) -> Target:
    cfg = ModelConfig(arch=arch, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-5, rope_theta=10000.0, max_position=256,
                      qk_norm=arch == "qwen3", tie_embeddings=tied)
    rng = np.random.default_rng(0)
    shapes = {"q_proj": (32, HIDDEN), "k_proj": (16, HIDDEN), "v_proj": (16, HIDDEN), "o_proj": (HIDDEN, 32),
              "gate_proj": (64, HIDDEN), "up_proj": (64, HIDDEN), "down_proj": (HIDDEN, 64)}

    def get(name: str) -> np.ndarray:
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return rng.normal(0, 1, (VOCAB, HIDDEN)).astype(np.float32)
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            return (1 + 0.1 * rng.normal(size=8)).astype(np.float32)
        if name.endswith("norm.weight"):
            return (1 + 0.1 * rng.normal(size=HIDDEN)).astype(np.float32)
        return rng.normal(0, 0.2, shapes[name.split(".")[-2]]).astype(np.float32)

    tok = tiny_tokenizer()
    return Target(cfg, build_params(cfg, get, "float32"), tok, Path("tiny"), "float32", (tok.eos_token_id,), "tiny")


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen3", True)])
def test_hf_dir_loads_in_transformers_with_our_logits(tmp_path, arch, tied):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tiny_target(arch, tied)
    out = peers.write_hf_dir(target, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True, dtype=torch.float32).eval()
    assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    text = "w5 w17 w3 w99 w42 w7 w7 w120"
    ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.int32)
    assert ids.tolist() == target.tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        theirs = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].numpy()
    ours, _, _ = forward(target.params, init_cache(target.cfg, 1, 16), jnp.asarray(ids[None]),
                         jnp.asarray([0], jnp.int32), cfg=target.cfg)
    np.testing.assert_allclose(np.asarray(ours[0, :len(ids)]), theirs, atol=1e-4, rtol=1e-4)
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied and config["eos_token_id"] == tok.eos_token_id


def test_hf_dir_refuses_what_it_cannot_write(tmp_path):
    from dataclasses import replace

    target = tiny_target("llama", True)
    moe = replace(target, cfg=replace(target.cfg, arch="qwen3_moe", num_experts=4, num_experts_per_tok=2))
    with pytest.raises(PeerError, match="dense full-attention"):
        peers.write_hf_dir(moe, tmp_path / "x")
    extra = replace(target, params={**target.params, "layers": [{**target.params["layers"][0], "w_extra": 1},
                                                                *target.params["layers"][1:]]})
    with pytest.raises(PeerError, match="w_extra"):
        peers.write_hf_dir(extra, tmp_path / "y")


def test_same_prefix_compares_over_the_shorter_output():
    assert llama_cpp.same_prefix([1, 2, 3], [1, 2, 3, 4]) and llama_cpp.same_prefix([1, 2, 3, 4], [1, 2, 3])
    assert not llama_cpp.same_prefix([1, 2, 3], [1, 5, 3, 4])
