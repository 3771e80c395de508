"""The production shape: docker-compose.yml, Dockerfile, .dockerignore, .env.example and the
configuration reference stay consistent with each other and with the Settings class."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
GOOD_KEY = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
_DEFAULT = re.compile(r"\$\{([A-Z0-9_]+)(?::?-([^}]*))?\}")


def _interpolate_defaults(value: Any) -> str:
    """``${VAR:-default}`` → default (what compose gives when VAR is unset)."""
    return _DEFAULT.sub(lambda m: m.group(2) or "", str(value))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _settings_env_names() -> set[str]:
    return {"SKILLJOBS_" + name.upper() for name in Settings.model_fields}


# --- docker-compose.yml -----------------------------------------------------------------


def test_services_and_roles(services: dict[str, Any]) -> None:
    assert set(services) == {"redis", "postgres", "migrate", "worker", "web"}
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["worker"]["command"] == ["worker"]
    assert services["web"]["command"] == ["web", "--host", "0.0.0.0", "--port", "8000"]
    for name in ("migrate", "worker", "web"):
        assert services[name]["image"] == services["migrate"]["image"]  # one image, many roles
        assert services[name]["build"]["context"] == "."
    assert not any("container_name" in s for s in services.values())  # scalable


def test_redis_keeps_an_append_only_file(services: dict[str, Any], compose: dict[str, Any]) -> None:
    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    cmd = " ".join(redis["command"])
    assert "--appendonly yes" in cmd and "--appendfsync everysec" in cmd
    volume = redis["volumes"][0].split(":")
    assert volume[1] == "/data" and volume[0] in compose["volumes"]
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]


def test_redis_requires_a_password(services: dict[str, Any]) -> None:
    redis = services["redis"]
    cmd = redis["command"]
    password = cmd[cmd.index("--requirepass") + 1]
    assert password.startswith("${REDIS_PASSWORD:?")  # no default password
    assert cmd[cmd.index("--protected-mode") + 1] == "yes"
    assert _env(redis)["REDISCLI_AUTH"] == password  # the healthcheck authenticates
    assert "ports" not in redis  # reachable inside the compose network only


def test_postgres_has_a_named_volume_and_readiness(
    services: dict[str, Any], compose: dict[str, Any]
) -> None:
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:16")
    source, target = pg["volumes"][0].split(":")[:2]
    assert source in compose["volumes"] and target == "/var/lib/postgresql/data"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert ":?" in pg["environment"]["POSTGRES_PASSWORD"]  # no default password


def test_startup_order(services: dict[str, Any]) -> None:
    migrate = services["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker", "web"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"
        assert services[name]["restart"] == "unless-stopped"


def test_workers_scale_and_stop_gracefully(services: dict[str, Any]) -> None:
    worker = services["worker"]
    assert int(_interpolate_defaults(worker["deploy"]["replicas"])) == 2
    grace = worker["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) >= 60
    # Docker must wait longer than the worker lets running jobs finish.
    assert int(grace[:-1]) > Settings(_env_file=None).worker_grace_sec  # type: ignore[call-arg]
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert worker.get("init") is True  # reaps subprocess skills' children


def test_web_needs_a_token_and_is_health_checked(services: dict[str, Any]) -> None:
    web = services["web"]
    env = _env(web)
    assert env["SKILLJOBS_API_TOKEN"].startswith("${SKILLJOBS_API_TOKEN:?")
    assert any(str(p).endswith(":8000") for p in web["ports"])
    test = " ".join(web["healthcheck"]["test"])
    assert "/healthz" in test and "urllib" in test and "curl" not in test


def test_shared_environment(services: dict[str, Any]) -> None:
    known = _settings_env_names()
    for name in ("migrate", "worker", "web"):
        env = _env(services[name])
        assert env["SKILLJOBS_DATABASE_URL"].startswith("postgresql+asyncpg://")
        assert "@postgres:5432/" in env["SKILLJOBS_DATABASE_URL"]
        assert env["SKILLJOBS_REDIS_URL"] == (
            "redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD in .env}@redis:6379/0"
        )
        assert env["SKILLJOBS_SECRET_KEY"].startswith("${SKILLJOBS_SECRET_KEY:?")
        assert services[name]["env_file"] == ".env"
        unknown = {k for k in env if k.startswith("SKILLJOBS_")} - known
        assert not unknown, f"{name}: not settings: {unknown}"


def test_workspaces_are_shared_by_workers_and_web(
    services: dict[str, Any], compose: dict[str, Any]
) -> None:
    root = _env(services["worker"])["SKILLJOBS_WORKSPACE_ROOT"]
    assert _env(services["web"])["SKILLJOBS_WORKSPACE_ROOT"] == root
    mounts = {}
    for name in ("worker", "web"):
        found = [v.split(":") for v in services[name]["volumes"] if v.split(":")[1] == root]
        assert found, f"{name} does not mount {root}"
        mounts[name] = found[0][0]
    assert mounts["worker"] == mounts["web"] and mounts["web"] in compose["volumes"]


# --- Dockerfile and .dockerignore -------------------------------------------------------


def _dockerfile() -> list[str]:
    """Instructions with line continuations joined."""
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    return [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    lines = _dockerfile()
    args = dict(
        ln.split(None, 1)[1].split("=", 1) for ln in lines if ln.startswith("ARG ") and "=" in ln
    )
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2
    final_base = _DEFAULT.sub(lambda m: args.get(m.group(1), ""), froms[-1].split()[1])
    assert final_base == "python:3.11-slim"
    runtime = lines[lines.index(froms[-1]) :]
    users = [ln.split()[1] for ln in runtime if ln.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    copies = " ".join(ln for ln in runtime if ln.startswith("COPY "))
    assert "--from=deps /opt/venv" in copies
    builder = " ".join(lines[: lines.index(froms[-1])])
    # the image installs a wheel built from the sources (migrations ship inside jobs/)
    for needed in ("jobs", "skills"):
        assert f"COPY {needed}" in builder
    assert "pip wheel" in builder and "pip install /dist/" in builder
    assert "pip install -e" not in " ".join(lines)
    entry = next(ln for ln in runtime if ln.startswith("ENTRYPOINT "))
    assert json.loads(entry.split(None, 1)[1]) == ["skilljobs"]


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    rules = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert rules[0] == "*"  # allow-list: nothing enters the context unless listed
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert {"jobs", "skills", "pyproject.toml"} <= allowed
    assert not allowed & {".env", ".venv", ".git", ".skilljobs", "tests"}
    assert "**/.env" in rules


def _healthcheck_code() -> str:
    line = next(ln for ln in _dockerfile() if ln.startswith("HEALTHCHECK "))
    argv = json.loads(line[line.index("CMD") + 3 :].strip())
    assert argv[:2] == ["python", "-c"]
    return argv[2]


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200
    hits: list[str] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_image_healthcheck_probes_only_the_web_role(
    tmp_path: Path, health_server: http.server.HTTPServer
) -> None:
    code = _healthcheck_code()
    assert "/proc/1/cmdline" in code and "curl" not in code
    port = health_server.server_address[1]
    cmdline = tmp_path / "cmdline"
    runnable = code.replace("/proc/1/cmdline", str(cmdline))

    def probe(*argv: str) -> int:
        cmdline.write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        return subprocess.run(
            [sys.executable, "-c", runnable], capture_output=True, timeout=30
        ).returncode

    _Health.hits.clear()
    _Health.status = 200
    assert probe("/opt/venv/bin/skilljobs", "web", "--host", "0.0.0.0", "--port", str(port)) == 0
    assert probe("/sbin/docker-init", "--", "skilljobs", "web", f"--port={port}") == 0
    assert _Health.hits == ["/healthz", "/healthz"]
    _Health.status = 503
    assert probe("skilljobs", "web", "--port", str(port)) != 0
    assert probe("skilljobs", "worker") == 0  # no request for other roles
    assert len(_Health.hits) == 3


# --- .env.example and the configuration reference ---------------------------------------


def _example_lines() -> dict[str, str]:
    """Every ``NAME=value`` line of .env.example, commented or not (first one wins)."""
    out: dict[str, str] = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"^#?\s?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def test_env_example_documents_every_setting() -> None:
    names = _example_lines()
    missing = _settings_env_names() - set(names)
    assert not missing, f".env.example lacks {sorted(missing)}"
    unknown = {n for n in names if n.startswith("SKILLJOBS_")} - _settings_env_names()
    assert unknown <= {"SKILLJOBS_IMAGE"}, unknown  # the compose image name is not a setting
    for secret in (
        "SKILLJOBS_SECRET_KEY",
        "SKILLJOBS_API_TOKEN",
        "POSTGRES_PASSWORD",
        "REDIS_PASSWORD",
    ):
        assert names[secret] == ""  # secrets ship empty
    assert "Fernet.generate_key()" in (ROOT / ".env.example").read_text()


def test_env_example_parses_as_is_and_its_examples_are_valid(tmp_path: Path, monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("SKILLJOBS_"):
            monkeypatch.delenv(name)
    env_file = tmp_path / ".env"
    shutil.copy(ROOT / ".env.example", env_file)
    as_is = Settings(_env_file=env_file)  # type: ignore[call-arg]
    assert not as_is.secret_key and not as_is.api_token  # empty means unset for secrets

    values = {
        n[len("SKILLJOBS_") :].lower(): v
        for n, v in _example_lines().items()
        if n.startswith("SKILLJOBS_") and v and n != "SKILLJOBS_IMAGE"
    }
    uncommented = Settings(_env_file=None, **values)  # type: ignore[call-arg]
    assert uncommented.notify_target_map["ops"][0].startswith("mailto://")
    assert uncommented.allow_hosts == ["files.intranet.example:8443", "minio.internal"]
    assert uncommented.worker_grace_sec < 60


def test_configuration_reference_lists_every_setting() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = sorted(n for n in _settings_env_names() if f"`{n}`" not in text)
    assert not missing, f"docs/configuration.md lacks {missing}"


# --- docker compose itself, when installed ----------------------------------------------


def _compose_cli() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if not shutil.which(cmd[0]):
            continue
        try:
            out = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and re.search(r"v?2\.\d+", out.stdout):
            return cmd
    return None


@pytest.mark.slow
def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("docker compose v2 is not installed here")
    for name in ("docker-compose.yml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SKILLJOBS_", "POSTGRES_", "REDIS_"))
    }
    (tmp_path / ".env").write_text(
        f"POSTGRES_PASSWORD=pw\nREDIS_PASSWORD=rpw\nSKILLJOBS_SECRET_KEY={GOOD_KEY}\nSKILLJOBS_API_TOKEN=t0123456789abcdef\n"
    )
    ok = subprocess.run(
        [*cli, "config", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    # The PyPI wrapper of the compose binary does not always pass its exit code on,
    # so the verdict is read from stderr as well.
    assert ok.returncode == 0 and "error" not in ok.stderr.lower(), ok.stderr
    (tmp_path / ".env").write_text(
        f"POSTGRES_PASSWORD=pw\nREDIS_PASSWORD=rpw\nSKILLJOBS_SECRET_KEY={GOOD_KEY}\n"
    )
    refused = subprocess.run(
        [*cli, "config", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 or "error" in refused.stderr.lower()
    assert "SKILLJOBS_API_TOKEN" in refused.stderr
