"""``python -m bridge.contract [DIR]``: write the contract files (default docs/contract)."""

from __future__ import annotations

import sys
from pathlib import Path

from bridge.contract import write


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else Path("docs/contract")
    for path in write(directory):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
