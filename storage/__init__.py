"""draftscope storage: the DuckDB history of runs, steps, K-flatness sweeps and annotations."""

from .export import export_annotations
from .history import DEFAULT_PATH, SCHEMA_VERSION, History, HistoryError, drafter_label, open_history

__all__ = ["DEFAULT_PATH", "SCHEMA_VERSION", "History", "HistoryError", "drafter_label", "export_annotations",
           "open_history"]
