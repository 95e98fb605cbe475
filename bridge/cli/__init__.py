"""The ``k8s-bridge`` command: one module per subcommand, ``main`` parses and dispatches."""
