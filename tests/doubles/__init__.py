"""Test doubles of the bridge's Protocols, shared by the tests and the benchmarks."""
