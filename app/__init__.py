"""draftscope workbench app: Gradio views over the engine and the history (`python app.py`)."""
