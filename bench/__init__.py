"""pycollective's microbenchmarks (installed as ``pycollective.bench``; ``python -m bench`` from
a checkout, ``pycollective bench`` from an install). Benchmarks are not tests: they measure,
check results, and report ratios measured side by side in one run."""
