"""Benchmark helpers shared by ``scripts/bench_*.py`` (report writing, no timing logic)."""
