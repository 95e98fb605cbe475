# k8s-bridge image: the package and its dependencies on python:3.11-slim, run as
# uid 10001 with nothing writable but /var/lib/k8s-bridge (the SQLite checkpoint)
# and /tmp, so it also runs under readOnlyRootFilesystem.

# The dependencies come from the runtime lock, hash-checked, in a layer of their
# own (it changes only with the lock); the project's wheel goes on top.
FROM python:3.11-slim AS build
WORKDIR /src
COPY requirements/runtime.txt ./requirements/
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r requirements/runtime.txt
COPY pyproject.toml README.md ./
COPY bridge ./bridge
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 bridge \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/k8s-bridge --shell /usr/sbin/nologin bridge \
 && mkdir -p /var/lib/k8s-bridge /etc/k8s-bridge \
 && chown 10001:10001 /var/lib/k8s-bridge
COPY --from=build /wheels /wheels
COPY requirements/runtime.txt /wheels/
RUN pip install --no-cache-dir --no-index --find-links /wheels --require-hashes -r /wheels/runtime.txt \
 && pip install --no-cache-dir --no-index --find-links /wheels --no-deps k8s-bridge \
 && rm -rf /wheels
COPY examples/bridge.yaml /etc/k8s-bridge/bridge.yaml
USER 10001:10001
WORKDIR /var/lib/k8s-bridge
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["k8s-bridge"]
CMD ["run", "--config", "/etc/k8s-bridge/bridge.yaml"]
