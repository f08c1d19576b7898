"""Benchmarks. Run each one from the project root as a module,
``python -m bench.NAME``; each ends by printing one JSON line with its
figures."""
