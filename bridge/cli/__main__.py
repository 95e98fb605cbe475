"""``python -m bridge.cli``: the same as the ``k8s-bridge`` command."""

import sys

from bridge.cli.main import main

sys.exit(main())
