"""draftscope experiments: prompt suites, the interleaved drafter benchmark, engine-vs-transformers floor,
K-Flat sweeps and the Markdown/Plotly report.

    python -m experiments.bench --suite gsm8k,humaneval,mtbench --drafters ar,ngram --k 4,8 --limit 10
    python -m experiments.bench_engine --max-new-tokens 128
    python -m experiments.kflat --ks 1,2,4,8,16,32,64,128 --contexts 256
    python -m experiments.report --out report/
"""
