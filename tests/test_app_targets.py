"""The app on the new target families: a local Qwen3-MoE, gpt-oss or Qwen3.5 hybrid checkpoint directory (tiny,
random weights, the embedded model's tokenizer) is served, generates lossless through the API, and takes a DFlash
drafter of its own shape from a checkpoint directory."""

from __future__ import annotations

import pytest

from engine.drafters.dflash_checkpoint import init_dflash, save_dflash
from engine.target import load_target
from engine.tokenizer import load_tokenizer
from engine.weights import embedded_model_path
from storage import open_history
from tests.conftest import serve_app

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
client_module = pytest.importorskip("gradio_client")

pytestmark = pytest.mark.slow
VOCAB = 49152  # the embedded tokenizer's


def tiny_checkpoint(kind: str, path) -> None:
    """A tiny random `kind` model saved with the embedded model's tokenizer: a local checkpoint directory."""
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    if kind == "qwen3_5":  # as published: Qwen3_5ForConditionalGeneration, a (tiny) vision tower beside the decoder
        text = common | dict(intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8, full_attention_interval=2)
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
        model = transformers.Qwen3_5ForConditionalGeneration(
            transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)).eval()
    elif kind == "qwen3_moe":
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(
            **common, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2)).eval()
    else:
        model = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(
            **common, intermediate_size=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=8)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "sinks" in name or name.endswith("bias"):
                torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(path)
    load_tokenizer(embedded_model_path()).save_pretrained(path)


@pytest.fixture(scope="module", params=["qwen3_moe", "gpt_oss", "qwen3_5"])
def served(request, tmp_path_factory):
    """(kind, checkpoint dir, drafter dir, app url, history path) of the app serving a tiny checkpoint."""
    root = tmp_path_factory.mktemp(request.param)
    tiny_checkpoint(request.param, root / "target")
    cfg, params = init_dflash(load_target(root / "target"), num_layers=1, block_size=4)
    save_dflash(root / "dflash", cfg, params)
    with serve_app(root, "--target", str(root / "target"), "--model-root", str(root)) as (url, db):
        yield request.param, root, url, db


def test_a_new_family_serves_generates_lossless_and_loads_its_drafter(served):
    kind, root, url, db = served
    client = client_module.Client(url, verbose=False)
    status, run_id = client.predict("one two three one two three", "ngram", 4, 0.0, 16, False,
                                    api_name="/generate")[2:4]
    assert "stored as run" in status
    history = open_history(db)
    run = history.get_run(run_id)
    assert run["settings"]["target"] == "target" and run["lossless"] is True, (kind, run["settings"])
    label = client.predict(str(root / "dflash"), api_name="/load_drafter")[0]["value"]
    status, run_id = client.predict("one two three one two three", label, 3, 0.0, 16, False,
                                    api_name="/generate")[2:4]
    assert "stored as run" in status and history.get_run(run_id)["lossless"] is True, kind
