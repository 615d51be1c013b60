"""Training data: the self-distilled datasets (distill) and the prompt generators they answer, with their tables."""
