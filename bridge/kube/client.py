"""The one HTTP door to the Kubernetes API server.

Configuration (kubeconfig contexts, exec plugins, tokens, client certificates,
CA bundles, in-cluster service accounts) is read by ``bridge.kube.kubeconfig``
(kubernetes-asyncio's loader only for an ``auth-provider``); the requests themselves
go through one aiohttp session and return raw bytes or orjson-decoded dicts,
never generated model objects. Every transport failure becomes a
``bridge.errors`` exception here and nowhere else.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bridge.errors import ConfigError, KubeConnectionError, status_error
from bridge.kube import kubeconfig
from bridge.kube.kubeconfig import Credentials, Endpoint

Params = Mapping[str, str | int | bool] | None

# A plain request (not a watch) that takes longer than this is treated as a broken connection.
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120, connect=15)
# Watches run for minutes by design; the reflector's watchdog notices silent ones.
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=15, sock_read=None)
# A large LIST read as it arrives may take longer than a plain request; only a
# connection that stops sending is broken.
_BODY_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=15, sock_read=60)


def _query(params: Params) -> dict[str, str]:
    if not params:
        return {}
    out: dict[str, str] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        else:
            out[key] = str(value)
    return out


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _read_kubeconfig_file(path: str, key: str) -> dict[str, Any]:
    """Refuse, in one line, a file the loader would misreport or choke on.

    kubernetes-asyncio takes a missing file for an empty config ("Expected key
    current-context") and lets YAML and I/O errors out as tracebacks.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config error: {key}: {path}: no such file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config error: {key}: {path}: not a text file") from None
    except OSError as e:
        raise ConfigError(f"config error: {key}: cannot read {path}: {e.strerror or e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config error: {key}: {path}: invalid YAML{where}: {problem}") from None
    if doc is None:
        raise ConfigError(f"config error: {key}: {path}: the file is empty")
    if not isinstance(doc, dict):
        raise ConfigError(
            f"config error: {key}: {path}: not a kubeconfig (expected a mapping with clusters, "
            f"contexts and users, found {type(doc).__name__})"
        )
    return doc


class KubeClient:
    """Raw JSON access to one API server. Create with ``from_kubeconfig`` or ``in_cluster``."""

    def __init__(
        self,
        endpoint: Endpoint,
        credentials: Credentials | None = None,
        *,
        compression: bool = False,
    ) -> None:
        self._credentials: Credentials = credentials or kubeconfig.NoCredentials()
        # Without it, answers come as they are (Accept-Encoding: identity). kube-apiserver
        # gzips watch streams too, one flush per event: inflating each costs the bridge
        # (and deflating costs the API server) more CPU at steady churn than the bytes
        # saved are worth inside a cluster (BENCHMARKS.md, "Peers").
        self._encoding: dict[str, str] = {} if compression else {"Accept-Encoding": "identity"}
        self.host: str = endpoint.host.rstrip("/")
        connector: aiohttp.BaseConnector
        if self.host.startswith("https://"):
            connector = aiohttp.TCPConnector(ssl=endpoint.ssl_context(), limit=0)
        else:
            connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(
            connector=connector, read_bufsize=2**20, trust_env=False
        )
        self._proxy: str | None = endpoint.proxy
        self._server_hostname: str | None = endpoint.server_name

    @classmethod
    async def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, *, compression: bool = False
    ) -> KubeClient:
        """Client from a kubeconfig file.

        With no path: the in-cluster service account when running in a pod,
        else ``$KUBECONFIG`` (its first entry) or ``~/.kube/config``.
        """
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(compression=compression)
        key = "cluster.kubeconfig"
        if path is None:
            env = os.environ.get("KUBECONFIG", "")
            key = "$KUBECONFIG" if env else "cluster.kubeconfig (default ~/.kube/config)"
            path = env.split(os.pathsep)[0] if env else str(Path.home() / ".kube" / "config")
        doc = _read_kubeconfig_file(path, key)
        found = kubeconfig.from_document(doc, path, context, key)
        if found is None:
            found = await kubeconfig.from_library(path, context, key)
        endpoint, credentials = found
        try:
            return cls(endpoint, credentials, compression=compression)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"config error: {key}: {path}: TLS files: {e}") from e

    @classmethod
    def in_cluster(cls, *, compression: bool = False) -> KubeClient:
        """Client from the pod's service account (token re-read as it rotates)."""
        return cls(*kubeconfig.in_cluster(), compression=compression)

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- auth -------------------------------------------------------------

    async def _headers(self, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept, **self._encoding}
        authorization = await self._credentials.authorization()
        if authorization:
            headers["Authorization"] = authorization
        return headers

    async def bearer_token(self) -> str | None:
        """The bearer token this client sends (refreshed as for a request); None when its
        credentials are of another kind (a client certificate, a password)."""
        value = (await self._headers()).get("Authorization", "")
        scheme, _, token = value.partition(" ")
        return (token.strip() or None) if scheme.lower() == "bearer" else None

    # -- requests ---------------------------------------------------------

    async def _raise_for_status(self, resp: aiohttp.ClientResponse) -> None:
        if resp.status < 400:
            return
        body = await resp.read()
        status: dict[str, Any]
        try:
            decoded = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict) and decoded.get("kind") == "Status":
            status = decoded
        else:
            text = body[:300].decode("utf-8", "replace").strip()
            status = {"kind": "Status", "code": resp.status, "message": text or resp.reason or ""}
        raise status_error(status, http_code=resp.status, retry_after=_retry_after(resp.headers))

    async def _send(
        self,
        method: str,
        path: str,
        params: Params,
        body: bytes | None,
        content_type: str | None,
        timeout: aiohttp.ClientTimeout,
        accept: str = "application/json",
    ) -> aiohttp.ClientResponse:
        async def send() -> aiohttp.ClientResponse:
            headers = await self._headers(accept)
            if content_type and body is not None:
                headers["Content-Type"] = content_type
            try:
                return await self._session.request(
                    method,
                    self.host + path,
                    params=_query(params),
                    data=body,
                    headers=headers,
                    timeout=timeout,
                    proxy=self._proxy,
                    server_hostname=self._server_hostname,
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise KubeConnectionError(f"{method} {path}: {_describe(e)}") from e

        resp = await send()
        if resp.status == 401 and await self._credentials.renew():
            # An exec plugin's token may have been revoked before its stated expiry,
            # a token file rotated since it was last read: one retry with the new one.
            resp.release()
            resp = await send()
        return resp

    async def request_json(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer. Errors become ``bridge.errors``."""
        data: bytes | None
        if body is None or isinstance(body, bytes):
            data = body
        else:
            data = orjson.dumps(body)
        resp = await self._send(method, path, params, data, content_type, _REQUEST_TIMEOUT, accept)
        try:
            await self._raise_for_status(resp)
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise KubeConnectionError(f"{method} {path}: {_describe(e)}") from e
        finally:
            resp.release()
        try:
            decoded = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise KubeConnectionError(f"{method} {path}: answer is not JSON: {e}") from e
        if not isinstance(decoded, dict):
            raise KubeConnectionError(f"{method} {path}: answer is not a JSON object")
        return decoded

    def stream(
        self, method: str, path: str, params: Params = None
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Open a streaming request; the context yields its lines (without newline).

        Lines have no length limit (objects of several MiB pass). Opening raises
        ``ApiStatusError``; a stream that breaks raises ``KubeConnectionError``.
        """
        return self.stream_decoded(method, path, params, decode=None)

    def stream_decoded(
        self,
        method: str,
        path: str,
        params: Params = None,
        *,
        decode: Callable[[bytes], Any] | None = orjson.loads,
        accept: str = "application/json",
    ) -> AbstractAsyncContextManager[AsyncIterator[Any]]:
        """Like ``stream`` but each line goes through ``decode`` (orjson.loads by default)."""
        return _open_stream(
            self,
            method,
            path,
            params,
            _STREAM_TIMEOUT,
            lambda resp: _lines(resp, method, path, decode),
            accept,
        )

    def stream_body(
        self, method: str, path: str, params: Params = None, *, accept: str = "application/json"
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Open a request; the context yields its body in pieces as they arrive.

        For answers too large to hold whole (a LIST of a big cluster). Opening
        raises ``ApiStatusError``; a body that breaks raises ``KubeConnectionError``.
        """
        return _open_stream(
            self,
            method,
            path,
            params,
            _BODY_TIMEOUT,
            lambda resp: _chunks(resp, method, path),
            accept,
        )


@asynccontextmanager
async def _open_stream(
    client: KubeClient,
    method: str,
    path: str,
    params: Params,
    timeout: aiohttp.ClientTimeout,
    read: Callable[[aiohttp.ClientResponse], AsyncGenerator[Any, None]],
    accept: str = "application/json",
) -> AsyncIterator[AsyncIterator[Any]]:
    resp = await client._send(method, path, params, None, None, timeout, accept)
    try:
        await client._raise_for_status(resp)
        reader = read(resp)
        try:
            yield reader
        finally:
            await reader.aclose()
    finally:
        # close, not release: an unfinished chunked body cannot go back to the pool.
        resp.close()


async def _chunks(
    resp: aiohttp.ClientResponse, method: str, path: str
) -> AsyncGenerator[bytes, None]:
    content = resp.content
    try:
        while True:
            chunk = await content.readany()
            if not chunk:
                return
            yield chunk
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise KubeConnectionError(f"{method} {path}: body broke: {_describe(e)}") from e


async def _lines(
    resp: aiohttp.ClientResponse,
    method: str,
    path: str,
    decode: Callable[[bytes], Any] | None,
) -> AsyncGenerator[Any, None]:
    # Own line splitting: aiohttp's readline() refuses lines above its buffer limit.
    # A read can be up to twice ``read_bufsize`` (2 MiB) when the stream outpaces the
    # pipeline (a streaming list): its lines are cut one at a time, each handed on
    # before the next is copied, and nothing of it is held across the next read.
    # Split whole, a chunk and its lines would be held together for as long as the
    # pipeline takes its hundreds of objects, and the last chunk for as long as the
    # watch stays quiet.
    pending: list[bytes] = []
    content = resp.content
    try:
        while True:
            chunk = await content.readany()
            if not chunk:
                break
            end = chunk.find(b"\n")
            if end < 0:
                pending.append(chunk)
                continue
            start = 0
            if pending:
                pending.append(chunk[:end])
                line = b"".join(pending)
                pending.clear()
                start = end + 1
                if line:
                    yield line if decode is None else _decoded(line, decode, method, path)
                end = chunk.find(b"\n", start)
            while end >= 0:
                if end > start:
                    line = chunk[start:end]
                    yield line if decode is None else _decoded(line, decode, method, path)
                start = end + 1
                end = chunk.find(b"\n", start)
            if start < len(chunk):
                pending.append(chunk[start:])
            chunk = line = b""
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise KubeConnectionError(f"{method} {path}: stream broke: {_describe(e)}") from e
    if pending:
        # A line without its newline at the end of the body: the connection was cut mid-object.
        raise KubeConnectionError(f"{method} {path}: stream truncated mid-line")


def _decoded(line: bytes, decode: Callable[[bytes], Any], method: str, path: str) -> Any:
    try:
        return decode(line)
    except ValueError as e:
        raise KubeConnectionError(
            f"{method} {path}: undecodable line ({len(line)} bytes): {e}"
        ) from e


def _describe(e: BaseException) -> str:
    # Connection errors can embed request headers in some aiohttp versions; keep the class and a short text.
    text = str(e).split("\n")[0][:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
