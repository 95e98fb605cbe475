"""Lint and render the chart with real Helm (the Go SDK inside helm-python-sdk).

Run as a subprocess so the Go runtime never shares a process with the test
runner. Reads a JSON request on stdin:

    {"chart": "charts/k8s-bridge", "cases": {"name": {"values": {...}, "namespace": "ns"}}}

and prints, per case, the lint report (``helm lint --strict`` with those values)
and either the rendered manifests (``helm template``) or the render error.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    import helm_python as helm

    request = json.load(sys.stdin)
    chart_path = request["chart"]
    out: dict[str, Any] = {"helm": helm.helm_sdk_version(), "cases": {}}
    with helm.Chart.load(chart_path) as chart:
        for name, case in request["cases"].items():
            values = case.get("values") or {}
            namespace = case.get("namespace", "default")
            result: dict[str, Any] = {
                "lint": helm.lint(
                    chart_path,
                    values,
                    strict=True,
                    namespace=namespace,
                    kube_version=request.get("kubeVersion"),
                )
            }
            try:
                result["manifests"] = chart.render(
                    values, name=case.get("release", "bridge"), namespace=namespace, is_install=True
                )
            except helm.HelmError as exc:
                result["renderError"] = str(exc)
            out["cases"][name] = result
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
