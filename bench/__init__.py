"""Benchmarks. Each module with a ``main(argv: list[str]) -> int`` is one; see ``__main__``."""
