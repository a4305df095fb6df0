"""Benchmarks of graph_durable against stock LangGraph, run with `python -m benchmarks`.

Each benchmark is a module of this package with a `main() -> list[Comparison]`; the
modules run by default are listed in `benchmarks.__main__.MODULES`. Results are printed
as a table and appended as rows to `benchmarks/results.md`.
"""
