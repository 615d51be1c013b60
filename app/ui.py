"""The workbench page: a header and one tab per view; launched on loopback, never shared."""

from __future__ import annotations

import gradio as gr
import jax

from .render import CSS
from .state import Workbench
from .tabs import acceptance, annotate, common, compare, diagnose, generate, history, kflat


def header(wb: Workbench) -> str:
    """Markdown line naming the target, the JAX backend and the history file."""
    t = wb.target
    weights = (f"its {t.name.rsplit('.', 1)[-1]} GGUF weights expanded to {t.dtype}" if t.path.suffix == ".gguf"
               else t.dtype)
    return (f"## draftscope — speculative decoding workbench\n"
            f"target **{t.name}** ({weights}, {t.cfg.num_layers} layers) · JAX backend **{jax.default_backend()}** "
            f"({wb.hardware}) · drafters: {', '.join(wb.drafter_labels)} · history `{wb.history.path}`")


def build(wb: Workbench) -> gr.Blocks:
    """The gr.Blocks app for a loaded workbench."""
    with gr.Blocks(title="draftscope") as demo:
        gr.Markdown(header(wb), elem_id="ds-header")
        common.device_banner(wb)
        with gr.Tabs():
            with gr.Tab("Generate", id="generate"):
                prompt = generate.build(wb)
            with gr.Tab("Compare", id="compare") as tab:
                compare.build(wb, tab, prompt)
            for name, module in (("K-Flat", kflat), ("Acceptance", acceptance), ("History", history),
                                 ("Annotate", annotate), ("Diagnose", diagnose)):
                with gr.Tab(name, id=name.lower()) as tab:
                    module.build(wb, tab)
    return demo


def launch(wb: Workbench, host: str = "127.0.0.1", port: int = 7860, **kw) -> None:
    """Serve the app (blocking); theme and css go to launch() in Gradio 6. Unexpected errors show their message."""
    wb.export_root.mkdir(parents=True, exist_ok=True)
    build(wb).queue(default_concurrency_limit=4).launch(
        server_name=host, server_port=port, share=False, show_error=True, theme=gr.themes.Soft(), css=CSS,
        allowed_paths=[str(wb.export_root)], footer_links=["api", "gradio"], **kw)
