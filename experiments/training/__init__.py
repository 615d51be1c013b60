"""Drafter training: sequences and batches, objectives, validation, the loop and its CLI (train), model cards,
ablations, checkpoint averaging, training curves and the annotate -> retrain loop."""
