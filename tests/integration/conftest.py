"""Fixtures shared by the integration tests of the pipeline (defined with its harness)."""

from tests.integration.test_pipeline import client, harness

__all__ = ["client", "harness"]
