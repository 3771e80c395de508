"""Dependency environments of marketplace skills (tests/market_skills): real uv / pip / npm
installs from the registries, real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry, load_skill
from jobs.execution import envs
from jobs.execution.executor import Executor
from jobs.skill import SkillRegistry
from tests.helpers.settings import MARKET_SKILLS, ROOT, make_settings

MARKET = MARKET_SKILLS
CTX = {"role_id": "r1", "session_id": "s1", "org_id": "o1", "channel": "web"}
network = pytest.mark.network


@pytest.fixture(scope="module")
def envs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One environment store for the module: builds are shared like in production."""
    return tmp_path_factory.mktemp("envs")


def executor(tmp_path: Path, registry: SkillRegistry, root: Path) -> Executor:
    ex = Executor(
        settings=make_settings(tmp_path, redis_url=None, prefix="t"),
        registry=registry,
        sessionmaker=None,
        box=None,
    )
    ex.envs = envs.EnvManager(root)
    return ex


@pytest.fixture
async def ex(tmp_path: Path, envs_root: Path):  # type: ignore[no-untyped-def]
    e = executor(tmp_path, load_registry([MARKET]), envs_root)
    yield e
    await e.aclose()


def copy_skill(src: str, dest: Path, name: str) -> Path:
    folder = dest / name
    shutil.copytree(MARKET / src, folder)
    md = folder / "SKILL.md"
    md.write_text(md.read_text().replace(f"name: {src}", f"name: {name}"))
    return folder


# --- what a skill declares (no network) ---------------------------------------------------


def test_spec_sources() -> None:
    media = envs.spec_for(load_skill(MARKET / "pep723_media"))
    assert media is not None and media.kind == "python"
    assert media.requirements == ("python-slugify==8.0.4",)
    assert media.source == "PEP 723 block in generate.py"
    req = envs.spec_for(load_skill(MARKET / "req_skill"))
    assert req is not None and req.requirements == ("six==1.16.0",)
    node = envs.spec_for(load_skill(MARKET / "node_lock"))
    assert node is not None and node.kind == "node" and node.source == "package-lock.json"
    assert envs.spec_for(load_skill(MARKET / "pep723_plain")) is None


def test_node_specs_know_which_skills_are_es_modules(tmp_path: Path) -> None:
    """Only ES-module skills get the resolve hook (it costs a loader thread per start)."""
    esm = {n: envs.spec_for(load_skill(MARKET / n)) for n in ("node_lock", "node_esm", "node_mjs")}
    assert {n: s.esm for n, s in esm.items() if s} == {
        "node_lock": False,  # CommonJS main.js
        "node_esm": True,  # "type": "module"
        "node_mjs": True,  # .mjs
    }
    assert esm["node_lock"].dirname == esm["node_mjs"].dirname  # type: ignore[union-attr]
    folder = copy_skill("node_lock", tmp_path, "node_dynamic_import")
    (folder / "main.js").write_text('import("is-number").then((m) => console.log(m.default(1)));\n')
    assert envs.spec_for(load_skill(folder)).esm  # type: ignore[union-attr]


def test_key_is_content_and_python_version(tmp_path: Path) -> None:
    a = copy_skill("req_skill", tmp_path, "a")
    b = copy_skill("req_skill", tmp_path, "b")
    (b / "requirements.txt").write_text("six==1.16.0  # same set, other comment\n")
    ka = envs.spec_for(load_skill(a))
    kb = envs.spec_for(load_skill(b))
    assert ka is not None and kb is not None and ka.key == kb.key
    (b / "requirements.txt").write_text("six==1.17.0\n")
    kc = envs.spec_for(load_skill(b))
    assert kc is not None and kc.key != ka.key


def test_pyproject_dependencies(tmp_path: Path) -> None:
    folder = copy_skill("req_skill", tmp_path, "pp")
    (folder / "requirements.txt").unlink()
    (folder / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["six"]\n')
    spec = envs.spec_for(load_skill(folder))
    assert spec is not None and spec.source == "pyproject.toml"
    assert spec.requirements == ("six",)


def test_key_line_of_uv_and_pip() -> None:
    uv_out = textwrap.dedent(
        """\
          × No solution found when resolving dependencies:
          ╰─▶ Because nosuch was not found in the package registry and you require
              nosuch, we can conclude that your requirements are unsatisfiable.
        """
    )
    assert envs.key_line(uv_out).startswith("Because nosuch was not found")
    pip_out = "ERROR: Could not find a version that satisfies the requirement nosuch\n"
    assert "nosuch" in envs.key_line(pip_out)


async def test_undeclared_module_subprocess(ex: Executor) -> None:
    out = await ex.execute("undeclared", {}, dict(CTX))
    r = out.result
    assert out.status == "failed" and out.error_type == "config"
    assert r["non_retriable"] is True and r["missing_module"] == "slugify_not_declared"
    assert "PEP 723" in r["error"] and "requirements.txt" in r["error"]
    assert "try again" not in r["error"].lower()


async def test_undeclared_module_in_process(ex: Executor) -> None:
    out = await ex.execute("undeclared_inproc", {}, dict(CTX))
    assert out.error_type == "config" and out.result["non_retriable"] is True
    assert out.result["missing_module"] == "yaml_not_declared"


async def test_import_time_module_error_in_process(ex: Executor, tmp_path: Path) -> None:
    folder = tmp_path / "imports_missing"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: imports_missing\ndescription: x\n---\n")
    (folder / "handler.py").write_text(
        "import not_here_pkg\n\nasync def execute(i, c):\n    return {}\n"
    )
    ex.registry = load_registry([folder.parent])
    out = await ex.execute("imports_missing", {}, dict(CTX))
    assert out.error_type == "config" and out.result["missing_module"] == "not_here_pkg"


@pytest.mark.slow
def test_lock_times_out_while_another_process_builds(tmp_path: Path) -> None:
    spec = envs.spec_for(load_skill(MARKET / "req_skill"))
    assert spec is not None
    lock = tmp_path / f"{spec.dirname}.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(envs.BuildFailed, match="another process"):
            envs.EnvManager(tmp_path, timeout=0.5).build(spec)
    finally:
        holder.kill()
        holder.wait()


# --- real installs -------------------------------------------------------------------------


@network
@pytest.mark.slow
async def test_pep723_script_prints_media(ex: Executor, envs_root: Path) -> None:
    out = await ex.execute("pep723_media", {"prompt": "Hello World"}, dict(CTX))
    assert out.status == "succeeded", out.result
    media = Path(ex.workspace_root) / "r1" / "s1" / "hello-world.png"
    assert media.is_file()
    assert str(envs_root) in out.log  # ran with the environment's interpreter
    ready = next(envs_root.glob("py-*/.ready"))
    stamp = ready.stat().st_mtime_ns
    again = await ex.execute("pep723_media", {"prompt": "second"}, dict(CTX))
    assert again.status == "succeeded" and ready.stat().st_mtime_ns == stamp  # reused


@network
@pytest.mark.slow
async def test_requirements_env_is_isolated(ex: Executor, envs_root: Path) -> None:
    out = await ex.execute("req_skill", {}, dict(CTX))
    r = out.result
    assert out.status == "succeeded", r
    assert r["six"] == "1.16.0" and r["prefix"].startswith(str(envs_root))
    assert r["sees_httpx"] is False  # the worker's packages stay in the worker
    assert r["sees_slugify"] is False  # nor another skill's environment


@network
@pytest.mark.slow
async def test_same_set_shared_changed_set_rebuilt(tmp_path: Path, envs_root: Path) -> None:
    skills = tmp_path / "skills"
    copy_skill("req_skill", skills, "one")
    two = copy_skill("req_skill", skills, "two")
    ex = executor(tmp_path, load_registry([skills]), envs_root)
    first = (await ex.execute("one", {}, dict(CTX))).result
    second = (await ex.execute("two", {}, dict(CTX))).result
    assert first["prefix"] == second["prefix"]
    (two / "requirements.txt").write_text("six==1.17.0\n")
    ex.registry = load_registry([skills])
    changed = (await ex.execute("two", {}, dict(CTX))).result
    assert changed["six"] == "1.17.0" and changed["prefix"] != first["prefix"]
    await ex.aclose()


@network
@pytest.mark.slow
async def test_uninstallable_dependency_is_config(ex: Executor) -> None:
    out = await ex.execute("bad_dep", {}, dict(CTX))
    r = out.result
    assert out.error_type == "config" and r["non_retriable"] is True
    assert r["package"] == "skilljobs-no-such-package-zz9"
    assert "not found in the package registry" in r["error"]
    assert "requirements.txt" in r["error"]


@network
@pytest.mark.slow
def test_pip_fallback_without_uv(tmp_path: Path) -> None:
    manager = envs.EnvManager(tmp_path, uv=False)
    good = envs.spec_for(load_skill(MARKET / "req_skill"))
    bad = envs.spec_for(load_skill(MARKET / "bad_dep"))
    assert good is not None and bad is not None
    path = manager.build(good)
    assert (path / envs.READY).is_file()
    assert list(path.glob("lib/python*/site-packages/six.py"))
    with pytest.raises(envs.BuildFailed) as failed:
        manager.build(bad)
    assert failed.value.package == "skilljobs-no-such-package-zz9"
    assert "No matching distribution" in str(failed.value) or "Could not find" in str(failed.value)
    assert not manager.path_of(bad).exists()  # a failed build leaves nothing half-made


@network
@pytest.mark.slow
def test_concurrent_builds_in_two_processes(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from jobs.catalog.loader import load_skill\n"
        "from jobs.execution import envs\n"
        f"spec = envs.spec_for(load_skill(Path({str(MARKET / 'req_skill')!r})))\n"
        f"print(envs.EnvManager(Path({str(tmp_path)!r})).build(spec))\n"
    )
    root = ROOT
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    assert len(list(tmp_path.glob("py-*/.ready"))) == 1


@network
@pytest.mark.slow
async def test_node_skill_with_lockfile(ex: Executor, envs_root: Path) -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    out = await ex.execute("node_lock", {"value": "42"}, dict(CTX))
    assert out.status == "succeeded", out.result
    assert out.result["is_number"] is True
    assert list(envs_root.glob("node-*/node_modules/is-number/package.json"))


@network
@pytest.mark.slow
async def test_node_esm_skills_import_their_packages(ex: Executor, envs_root: Path) -> None:
    """ES modules ignore NODE_PATH: "type": "module" (static import in a local module, and
    dynamic import) and a .mjs script both resolve the cached node_modules, with nothing
    written into the skill's folder."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    before = {p.name for p in (MARKET / "node_esm").rglob("*")}
    out = await ex.execute("node_esm", {"n": 7}, dict(CTX))
    assert out.status == "succeeded", out.result
    assert out.result["message"] == "7 is odd" and out.result["odd"] is True
    assert {p.name for p in (MARKET / "node_esm").rglob("*")} == before
    assert list(envs_root.glob("node-*/node_modules/is-odd/package.json"))
    # the hook is read from the environments folder (reachable by the skill user, sandbox)
    assert (envs_root / "node_paths.mjs").read_bytes() == envs.NODE_ESM_HOOK.read_bytes()
    mjs = await ex.execute("node_mjs", {"value": "x1"}, dict(CTX))
    assert mjs.status == "succeeded", mjs.result
    assert mjs.result["is_number"] is False
    # the .mjs skill declares what the CommonJS node_lock declares: one environment for both
    assert (await ex.execute("node_lock", {"value": "3"}, dict(CTX))).result["is_number"] is True
    with_is_number = list(envs_root.glob("node-*/node_modules/is-number/package.json"))
    assert len(with_is_number) == 2  # that one, and node_esm's (is-odd needs is-number)


@network
async def test_node_esm_undeclared_package_is_config(ex: Executor, tmp_path: Path) -> None:
    """An ES module importing a package its lockfile does not have fails as config, naming it."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    folder = copy_skill("node_mjs", tmp_path / "skills", "node_mjs_undeclared")
    (folder / "main.mjs").write_text(
        'import leftPad from "left-pad";\nconsole.log(leftPad(1, 3));\n'
    )
    e = executor(tmp_path, load_registry([tmp_path / "skills"]), ex.envs.root)
    try:
        out = await e.execute("node_mjs_undeclared", {}, dict(CTX))
    finally:
        await e.aclose()
    assert out.status == "failed" and out.result["error_type"] == "config", out.result
    assert out.result["missing_module"] == "left-pad" and out.result["non_retriable"] is True


@network
@pytest.mark.slow
def test_cli_prepare_list_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from jobs.cli.app import app

    skills = tmp_path / "skills"
    copy_skill("req_skill", skills, "with_reqs")
    copy_skill("bad_dep", skills, "broken_reqs")
    copy_skill("pep723_plain", skills, "no_reqs")
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", str(skills))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    listed = runner.invoke(app, ["skills", "list", "--json"], catch_exceptions=False)
    rows = {r["name"]: r["env"] for r in json.loads(listed.output)["items"]}
    assert rows["with_reqs"] == "missing (requirements.txt)" and rows["no_reqs"] == "-"
    res = runner.invoke(app, ["skills", "prepare", "with_reqs"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "with_reqs: built" in res.output
    res = runner.invoke(app, ["skills", "prepare"], catch_exceptions=False)
    assert res.exit_code == 1  # the broken one fails, named with its package
    assert "with_reqs: ready" in res.output and "skilljobs-no-such-package-zz9" in res.output
    res = runner.invoke(app, ["skills", "check", str(skills / "with_reqs")])
    assert "env: ready (requirements.txt)" in res.output
    res = runner.invoke(app, ["skills", "prepare", "nope"])
    assert res.exit_code != 0 and "nope" in res.output

    from jobs.cli.checks import Status, ok, warn
    from jobs.cli.common import load_settings
    from jobs.cli.envs import check_skill_envs

    check = check_skill_envs(load_settings(), ok, warn)
    assert check is not None and check.status is Status.WARN  # broken_reqs is not built
    assert "1 of 2 not built yet: broken_reqs" in check.detail and "prepare" in check.fix


# --- as a background job on a real worker --------------------------------------------------


@network
@pytest.mark.slow
async def test_textbook_async_pep723_job(market_services) -> None:  # type: ignore[no-untyped-def]
    """The OpenClaw image generator: async, PEP 723, MEDIA line — built by the worker on
    first use, run once, its picture kept; a broken dependency fails once, as config."""
    from jobs.queue.dispatcher import Dispatcher
    from tests.helpers.jobs import drain, job_and_attempts

    ctx = {"channel": "web", "role_id": "r1", "org_id": "o1", "session_id": "sess-1"}
    svc = market_services
    ok = await Dispatcher(svc).dispatch(
        "pep723_media", {"prompt": "A Red Fox"}, ctx, "orgdeleg:acme"
    )
    bad = await Dispatcher(svc).dispatch("bad_dep", {}, ctx, "orgdeleg:acme")
    assert ok.status_code == 202 and bad.status_code == 202, (ok.body, bad.body)
    await drain(svc)
    job, attempts = await job_and_attempts(svc, ok.body["job_id"])
    assert job.status == "succeeded" and len(attempts) == 1, job.error
    assert "a-red-fox.png" in json.dumps(svc.box.unseal(job.result))
    job, attempts = await job_and_attempts(svc, bad.body["job_id"])
    assert job.status == "failed" and len(attempts) == 1  # never re-run
    assert job.error_type == "config" and "skilljobs-no-such-package-zz9" in (job.error or "")
    assert "again" not in (job.error or "").lower()


@network
async def test_in_process_skill_with_requirements(ex: Executor, envs_root: Path) -> None:
    out = await ex.execute("inproc_reqs", {"text": "café Zürich"}, dict(CTX))
    assert out.status == "succeeded", out.result
    assert out.result["ascii"] == "cafe Zurich"
    assert not any(str(envs_root) in p for p in sys.path)  # only for this skill's imports


def inproc_skill(skills: Path, name: str, requirements: str, handler: str) -> None:
    folder = skills / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: in-process\n---\n")
    if requirements:
        (folder / "requirements.txt").write_text(requirements)
    (folder / "handler.py").write_text(textwrap.dedent(handler))


@network
async def test_in_process_environments_do_not_leak(tmp_path: Path, envs_root: Path) -> None:
    """An in-process skill imports from its own environment (at import time, lazily in an
    async entry and in a sync one's thread); another skill in the same worker cannot import
    what only the first one's environment holds."""
    skills = tmp_path / "skills"
    inproc_skill(
        skills,
        "with_env",
        "python-slugify==8.0.4\n",
        """
        from text_unidecode import unidecode  # a dependency of python-slugify

        async def execute(input_data, runtime_context):
            import slugify  # lazily, while the run goes on

            return {"ok": True, "slug": slugify.slugify(unidecode(input_data["text"]))}
        """,
    )
    inproc_skill(
        skills,
        "sync_with_env",
        "python-slugify==8.0.4\n",
        """
        def execute(input_data):
            from slugify import slugify

            return {"ok": True, "slug": slugify(input_data["text"])}
        """,
    )
    inproc_skill(
        skills,
        "without_env",
        "",
        """
        async def execute(input_data, runtime_context):
            import slugify  # not declared: must not come from the other skill's environment

            return {"ok": True}
        """,
    )
    e = executor(tmp_path, load_registry([skills]), envs_root)
    try:
        sys.modules.pop("slugify", None)
        out = await e.execute("with_env", {"text": "Grüße aus Köln"}, dict(CTX))
        assert out.status == "succeeded", out.result
        assert out.result["slug"] == "grusse-aus-koln"
        sys.modules.pop("slugify", None)  # as if only the other skill had imported it so far
        sys.modules.pop("slugify.slugify", None)
        out = await e.execute("without_env", {}, dict(CTX))
        assert out.status == "failed" and out.result["missing_module"] == "slugify", out.result
        out = await e.execute("sync_with_env", {"text": "A B"}, dict(CTX))
        assert out.status == "succeeded" and out.result["slug"] == "a-b", out.result
    finally:
        await e.aclose()


@network
async def test_removed_environment_is_built_again(ex: Executor, envs_root: Path) -> None:
    first = await ex.execute("req_skill", {}, dict(CTX))
    assert first.status == "succeeded", first.result
    shutil.rmtree(Path(first.result["prefix"]))
    again = await ex.execute("req_skill", {}, dict(CTX))
    assert again.status == "succeeded" and again.result["prefix"] == first.result["prefix"]


@network
@pytest.mark.slow
async def test_node_esm_skill_in_the_sandbox(tmp_path: Path) -> None:
    """An untrusted Node ES-module skill runs in the sandbox as an unprivileged id and reads
    its cached node_modules and the resolve hook (bound read-only), whatever the modes of
    the environments folder and of the files its author shipped."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    skills = tmp_path / "skills"
    folder = copy_skill("node_esm", skills, "node_esm_uid")
    (folder / "main.js").write_text(
        'import isOdd from "is-odd";\n'
        "console.log(JSON.stringify({ ok: true, uid: process.getuid(), odd: isOdd(3) }));\n"
    )
    (folder / "main.js").chmod(0o600)
    settings = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=str(skills))
    ex = Executor(settings=settings, registry=load_registry([skills]), sessionmaker=None, box=None)
    try:
        out = await ex.execute("node_esm_uid", {}, dict(CTX))
        assert out.status == "succeeded", out.result
        assert out.result["odd"] is True and out.result["uid"] == 65534
        ex.envs.root.chmod(0o700)
        out = await ex.execute("node_esm_uid", {}, dict(CTX))
        assert out.status == "succeeded" and out.result["uid"] == 65534, out.result
    finally:
        await ex.aclose()


async def test_a_missing_module_of_the_skills_own_folder_is_not_a_package(
    ex: Executor, tmp_path: Path
) -> None:
    """``from scripts.helpers import …`` in a script of ``scripts/`` fails: the advice says
    it is the skill's own code, never "install scripts" (a dependency-confusion risk)."""
    folder = tmp_path / "own_pkg"
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: own_pkg\ndescription: x\nexec: {primary: {entry: scripts/run.py}}\n---\n"
    )
    (folder / "scripts" / "helpers.py").write_text("VALUE = 1\n")
    (folder / "scripts" / "run.py").write_text("from scripts.helpers import VALUE\nprint(VALUE)\n")
    ex.registry = load_registry([folder.parent])
    out = await ex.execute("own_pkg", {}, dict(CTX))
    r = out.result
    assert out.status == "failed" and out.error_type == "config", r
    assert r["missing_module"].startswith("scripts")
    assert "scripts/ is the skill's own code, not a package to install" in r["error"]
    assert "PEP 723" not in r["error"] and "requirements.txt" not in r["error"]
