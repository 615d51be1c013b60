"""draftscope experiments, by job: bench/ (drafters against ar, peers, K-Flat, throughput, the report), data/
(self-distilled datasets and prompt generators), training/ (the drafter trainer, cards, ablations); suites and
the doctor are libraries the app imports too.

    python -m experiments.bench --suite gsm8k,humaneval,mtbench --drafters ar,ngram --k 4,8 --limit 10
    python -m experiments.bench.engine_speed --max-new-tokens 128
    python -m experiments.bench.kflat --ks 1,2,4,8,16,32,64,128 --contexts 256
    python -m experiments.bench.report --out report/
    python -m experiments.data.distill --out data/distill --prompts 12000
    python -m experiments.training.train --drafter dflash --data data/distill
"""
