"""Benchmarks: drafters on prompt suites against ar (`python -m experiments.bench`), the engine against its peers
(transformers, llama.cpp), K-Flat sweeps, the data engine's and training's
throughput, and the report built from them."""
