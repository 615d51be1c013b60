"""One module per workbench tab; each has `build(wb[, tab])` called inside its gr.Tab."""
