"""Talking to Kubernetes: the asyncio equivalents of client-go's ``tools/cache``."""
