"""The ground floor: the vocabulary every room shares (the event envelope, the
checkpoint row and its packed form, the bus connections, the config sections,
the HTTP server and the metric types of the health endpoint). It imports nothing
of the bridge above it but the errors and the logging (docs/architecture.md)."""
