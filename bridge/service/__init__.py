"""The running bridge: settings, the wiring of components from settings, the app
that runs one pipeline per resource with health, metrics and leadership, and the
process tuning applied by ``k8s-bridge run``."""
