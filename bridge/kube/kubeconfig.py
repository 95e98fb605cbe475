"""Where the API server is and how to authenticate to it: a kubeconfig or the pod's account.

Read here rather than through kubernetes-asyncio's loaders because importing
any part of that package imports all of it: its generated API models, ~860
modules and ~70 MiB of an idle bridge's memory, none of which the bridge
uses. What kubectl's kubeconfigs commonly hold is read here: a context's
cluster (server, certificate authority as a file or inline, client
certificate and key as files or inline, ``insecure-skip-tls-verify``,
``tls-server-name``, ``proxy-url``) and user (``token``, ``tokenFile``,
``username``/``password``, an ``exec`` credential plugin). A user with an
``auth-provider`` (the legacy oidc, gcp and azure plugins) is handed to
kubernetes-asyncio's loader, imported only then.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bridge.errors import ConfigError

# Where a pod's service account is mounted (client-go's rest.InClusterConfig).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A token file (in-cluster, tokenFile) is re-read this often, as client-go does,
# so a rotated projected token is picked up without a restart.
_TOKEN_FILE_REREAD_SECONDS = 60.0
# An exec plugin's token is renewed this long before its stated expiry.
_EXEC_EARLY_SECONDS = 10.0


class Credentials(Protocol):
    """What a request carries to prove who the bridge is."""

    async def authorization(self) -> str | None:
        """The ``Authorization`` header's value, None for none (a client certificate)."""
        ...

    async def renew(self) -> bool:
        """After a 401: get fresh credentials; False when there is nothing to renew."""
        ...


@dataclass(frozen=True)
class Endpoint:
    """One API server and how to reach it: ``host`` and the TLS and proxy settings."""

    host: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    verify: bool = True
    server_name: str | None = None
    proxy: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(
            cafile=self.ca_file,
            cadata=self.ca_data.decode("ascii") if self.ca_data else None,
        )
        if self.cert_data is not None and self.key_data is not None:
            _load_chain_from_memory(ctx, self.cert_data, self.key_data)
        elif self.cert_file:
            ctx.load_cert_chain(self.cert_file, keyfile=self.key_file)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def _load_chain_from_memory(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl loads a chain only from files: one private (0600) file, removed at once.
    fd, name = tempfile.mkstemp(prefix="k8s-bridge-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cert.rstrip(b"\n") + b"\n" + key)
        ctx.load_cert_chain(name)
    finally:
        os.unlink(name)


class NoCredentials:
    async def authorization(self) -> str | None:
        return None

    async def renew(self) -> bool:
        return False


@dataclass(frozen=True)
class StaticCredentials:
    """A bearer token or a basic-auth pair written in the kubeconfig."""

    header: str

    async def authorization(self) -> str | None:
        return self.header

    async def renew(self) -> bool:
        return False


class TokenFileCredentials:
    """A bearer token read from a file, re-read as it rotates (in-cluster, ``tokenFile``)."""

    def __init__(self, path: Path, key: str) -> None:
        self._path = path
        self._key = key
        self._token = ""
        self._read_at = -1e18
        self._read()

    def _read(self) -> None:
        try:
            token = self._path.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(
                f"config error: {self._key}: cannot read {self._path}: {e.strerror or e}"
            ) from None
        if not token:
            raise ConfigError(f"config error: {self._key}: {self._path} is empty")
        self._token = token
        self._read_at = time.monotonic()

    async def authorization(self) -> str | None:
        if time.monotonic() - self._read_at >= _TOKEN_FILE_REREAD_SECONDS:
            try:
                self._read()
            except ConfigError:
                pass  # keep the last token; a 401 will say if it went stale
        return f"Bearer {self._token}"

    async def renew(self) -> bool:
        before = self._token
        self._read()
        return self._token != before


class ExecCredentials:
    """A token from an ``exec`` credential plugin, run again when it expires or is refused.

    The plugin speaks ``client.authentication.k8s.io`` ExecCredential on stdout;
    like kubernetes-asyncio, only its ``token`` is used (no client certificate).
    """

    def __init__(self, spec: Mapping[str, Any], key: str) -> None:
        command = spec.get("command")
        api_version = spec.get("apiVersion")
        if not command or not api_version:
            raise ConfigError(f"config error: {key}.exec: needs command and apiVersion")
        args = spec.get("args") or []
        if not isinstance(args, list):
            raise ConfigError(f"config error: {key}.exec.args: expected a list")
        env = dict(os.environ)
        for item in spec.get("env") or []:
            if not isinstance(item, dict) or "name" not in item:
                raise ConfigError(f"config error: {key}.exec.env: expected name/value pairs")
            env[str(item["name"])] = str(item.get("value", ""))
        self._argv = [str(command), *(str(a) for a in args)]
        self._env = env
        self._api_version = str(api_version)
        self._key = key
        self._token: str | None = None
        self._expiry: datetime.datetime | None = None
        self._lock = asyncio.Lock()

    async def authorization(self) -> str | None:
        if self._token is None or self._expired():
            async with self._lock:
                if self._token is None or self._expired():
                    await self._run()
        return f"Bearer {self._token}"

    async def renew(self) -> bool:
        async with self._lock:
            await self._run()
        return True

    def _expired(self) -> bool:
        if self._expiry is None:
            return False
        left = (self._expiry - datetime.datetime.now(datetime.UTC)).total_seconds()
        return left <= _EXEC_EARLY_SECONDS

    async def _run(self) -> None:
        info = {
            "apiVersion": self._api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        env = {**self._env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        what = f"config error: {self._key}.exec: {self._argv[0]}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise ConfigError(f"{what}: cannot run: {e.strerror or e}") from None
        out, err = await proc.communicate()
        if proc.returncode != 0:
            text = err.decode("utf-8", "replace").strip().splitlines()
            raise ConfigError(
                f"{what}: exited {proc.returncode}" + (f": {text[-1][:200]}" if text else "")
            )
        try:
            status = json.loads(out)["status"]
            token = status["token"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{what}: did not print an ExecCredential with status.token"
            ) from None
        expiry = status.get("expirationTimestamp")
        self._token = str(token)
        self._expiry = _parse_time(expiry, what) if expiry else None


def _parse_time(value: str, what: str) -> datetime.datetime:
    try:
        parsed = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{what}: bad status.expirationTimestamp {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def in_cluster(
    environ: Mapping[str, str] = os.environ, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> tuple[Endpoint, Credentials]:
    """The pod's service account, as client-go's ``rest.InClusterConfig`` reads it."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "cluster: in-cluster config unavailable: "
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set"
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca = account_dir / "ca.crt"
    if not ca.is_file():
        raise ConfigError(f"cluster: in-cluster config unavailable: {ca}: no such file")
    creds = TokenFileCredentials(account_dir / "token", "cluster (in-cluster token)")
    return Endpoint(host=f"https://{host}:{port}", ca_file=str(ca)), creds


def from_document(
    doc: Mapping[str, Any], path: str, context: str | None, key: str
) -> tuple[Endpoint, Credentials] | None:
    """The endpoint and credentials of ``context`` (default: current-context) in a
    parsed kubeconfig; None when its user names an ``auth-provider`` (not read here)."""
    base = Path(path).parent

    def fail(what: str) -> ConfigError:
        return ConfigError(f"config error: {key}: cannot load {path}: {what}")

    name = context or doc.get("current-context")
    if not name:
        raise fail("no context given and no current-context")
    ctx = _named(doc, "contexts", "context", name, fail)
    cluster = _named(doc, "clusters", "cluster", ctx.get("cluster"), fail)
    user_name = ctx.get("user")
    user = _named(doc, "users", "user", user_name, fail) if user_name else {}
    if "auth-provider" in user:
        return None
    server = cluster.get("server")
    if not server:
        raise fail(f"cluster {ctx.get('cluster')!r} has no server")

    def file(value: Any) -> str | None:
        return str(base / os.path.expanduser(str(value))) if value else None

    def data(field: str, value: Any) -> bytes | None:
        if not value:
            return None
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError:
            raise fail(f"{field} is not base64") from None

    endpoint = Endpoint(
        host=str(server).rstrip("/"),
        ca_file=file(cluster.get("certificate-authority")),
        ca_data=data("certificate-authority-data", cluster.get("certificate-authority-data")),
        cert_file=file(user.get("client-certificate")),
        key_file=file(user.get("client-key")),
        cert_data=data("client-certificate-data", user.get("client-certificate-data")),
        key_data=data("client-key-data", user.get("client-key-data")),
        verify=not cluster.get("insecure-skip-tls-verify", False),
        server_name=cluster.get("tls-server-name") or None,
        proxy=cluster.get("proxy-url") or None,
    )
    user_key = f"{key} user {user_name!r}"
    creds: Credentials
    if user.get("token"):
        creds = StaticCredentials(f"Bearer {user['token']}")
    elif user.get("tokenFile"):
        creds = TokenFileCredentials(Path(file(user["tokenFile"]) or ""), user_key)
    elif user.get("exec"):
        creds = ExecCredentials(user["exec"], user_key)
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password') or ''}".encode()
        creds = StaticCredentials("Basic " + base64.b64encode(pair).decode("ascii"))
    else:
        creds = NoCredentials()
    return endpoint, creds


def _named(doc: Mapping[str, Any], section: str, field: str, name: Any, fail: Any) -> Any:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(field) or {}
            if not isinstance(value, dict):
                raise fail(f"{section} entry {name!r}: {field} is not a mapping")
            return value
    raise fail(f"no {field} named {name!r} in {section}")


async def from_library(path: str, context: str | None, key: str) -> tuple[Endpoint, Credentials]:
    """kubernetes-asyncio's loader, for the users this module does not read (``auth-provider``)."""
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import ConfigException, load_kube_config

    cfg = Configuration()
    try:
        loader = await load_kube_config(
            config_file=path, context=context, client_configuration=cfg, persist_config=False
        )
    except (ConfigException, KeyError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"config error: {key}: cannot load {path}: {e}") from e
    endpoint = Endpoint(
        host=str(cfg.host).rstrip("/"),
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
        server_name=getattr(cfg, "tls_server_name", None),
        proxy=cfg.proxy or None,
    )
    return endpoint, _LibraryCredentials(cfg, loader)


class _LibraryCredentials:
    def __init__(self, cfg: Any, loader: Any) -> None:
        self._cfg = cfg
        self._loader = loader

    async def authorization(self) -> str | None:
        # auth_settings() runs the loader's refresh hook (an expired oidc token).
        bearer = (await self._cfg.auth_settings()).get("BearerToken")
        return str(bearer["value"]) if bearer and bearer.get("value") else None

    async def renew(self) -> bool:
        return False
