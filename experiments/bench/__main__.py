"""`python -m experiments.bench`: the drafter benchmark (experiments.bench.drafters)."""

import sys

from .drafters import main

sys.exit(main())
