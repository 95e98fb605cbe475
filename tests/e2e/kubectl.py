"""Running the real kubectl (the one `tools/realdeps/build` built) against the emulator.

``kubectl apply`` needs ``--validate=false``: the emulator serves no OpenAPI
documents, and kubectl's client-side validation needs them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.fixtures.realdeps import binary


def kubectl_env(home: Path, kubeconfig: Path) -> dict[str, str]:
    # A private HOME keeps kubectl's discovery cache out of the user's.
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}


async def kubectl(home: Path, kubeconfig: Path, *args: str) -> str:
    """Run kubectl to completion; its stdout, or an AssertionError with its stderr."""
    proc = await asyncio.create_subprocess_exec(
        binary("kubectl"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=kubectl_env(home, kubeconfig),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()
