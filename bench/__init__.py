"""Benchmarks. Run each one from the project root as a module,
``python -m bench.NAME``; ``--help`` lists its options (``--fault`` lists
failover's faults), bench/README.md says what it measures and how to read
its figures, and it ends by printing one JSON line with them."""
