"""Benchmarks of dra-ledger against the DESIGN §10 targets (``python -m bench.run``); never run by the tests."""
