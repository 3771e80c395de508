"""Cleanup of skill dependency environments: the age, "no skill declares it", unfinished
build and size-cap rules; an environment a running job holds (in another process, or a
live subprocess skill of this one) is never removed; the CLI and the retention pass."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.catalog.loader import load_registry
from jobs.cli.app import app
from jobs.execution import env_store, envs
from jobs.execution.env_store import DAY, Lease, Policy
from jobs.execution.executor import Executor
from tests.helpers.settings import MARKET_SKILLS, make_settings

MARKET = MARKET_SKILLS
CTX = {"role_id": "r1", "session_id": "s1", "org_id": "o1", "channel": "web"}
MB = 1 << 20


def make_env(root: Path, name: str, *, days: float, size: int = 1000, ready: bool = True) -> Path:
    """An environment directory as a build leaves it, last used ``days`` ago."""
    path = root / name
    (path / "lib").mkdir(parents=True)
    (path / "lib" / "blob").write_bytes(b"x" * size)
    (path / env_store.INFO).write_text(json.dumps({"source": "requirements.txt"}))
    if ready:
        (path / env_store.READY).write_text("built")
    then = time.time() - days * DAY
    for p in (path, path / env_store.READY, env_store.use_lock(root, name)):
        if p.exists() or p.suffix == ".use":
            p.touch()
            os.utime(p, (then, then))
    return path


class Holder:
    """Another process holding a lock file (shared: a run there; exclusive: a build)."""

    def __init__(self, path: Path, *, shared: bool) -> None:
        mode = "LOCK_SH" if shared else "LOCK_EX"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.{mode}); "
                "print('held', flush=True); sys.stdin.read()",
                str(path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "held"

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    r = tmp_path / "envs"
    r.mkdir()
    yield r


def names(report: env_store.PruneReport) -> dict[str, str]:
    return {e.name: why for e, why in report.removed}


def test_rules_dry_run_then_removal(root: Path) -> None:
    make_env(root, "py-old", days=40)
    make_env(root, "py-recent", days=2)
    make_env(root, "py-orphan", days=2)
    make_env(root, "node-orphan-fresh", days=0.1)
    make_env(root, "py-halfbuilt", days=0.5, ready=False)
    make_env(root, "py-building", days=0.01, ready=False)
    wanted = {"py-old", "py-recent", "py-halfbuilt"}
    policy = Policy(max_age_days=30)

    dry = env_store.prune(root, policy, wanted=wanted, dry_run=True)
    assert names(dry) == {
        "py-old": "unused for 40 days",
        "py-orphan": "no loaded skill declares it",
        "py-halfbuilt": "an unfinished build",
    }
    assert all((root / n).is_dir() for n in names(dry))  # a dry run removes nothing

    done = env_store.prune(root, policy, wanted=wanted)
    assert names(done) == names(dry) and done.kept == 3
    assert done.freed == dry.freed and 3000 < done.freed < 4000
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "node-orphan-fresh",
        "py-building",
        "py-recent",
    ]
    # without knowing the skills (they did not load), nothing goes for being undeclared
    make_env(root, "py-orphan", days=2)
    assert names(env_store.prune(root, policy, wanted=None)) == {}
    # 0 / None: kept however old
    assert names(env_store.prune(root, Policy(max_age_days=None), wanted=wanted)) == {
        "py-orphan": "no loaded skill declares it"
    }


def test_looking_does_not_count_as_using(root: Path) -> None:
    """`envs list` and a dry run ask whether an environment is in use without making its
    lock file: an environment built but never run keeps ageing."""
    make_env(root, "py-built-never-run", days=40)
    env_store.use_lock(root, "py-built-never-run").unlink()
    (before,) = env_store.scan(root)
    assert not env_store.in_use(root, "py-built-never-run")
    dry = env_store.prune(root, Policy(max_age_days=30), dry_run=True)
    assert names(dry) == {"py-built-never-run": "unused for 40 days"}
    assert not env_store.use_lock(root, "py-built-never-run").exists()
    assert env_store.scan(root)[0].last_used == before.last_used


def test_size_cap_removes_least_recently_used_first(root: Path) -> None:
    for name, days in (("py-a", 5), ("py-b", 3), ("py-c", 1), ("py-d", 0)):
        make_env(root, name, days=days, size=MB)
    report = env_store.prune(root, Policy(max_age_days=None, max_bytes=int(2.5 * MB)))
    assert list(names(report)) == ["py-a", "py-b"]
    assert set(names(report).values()) == {"over the size cap"}
    assert report.size_before >= 4 * MB and report.kept == 2


def test_held_or_building_environment_is_never_removed(root: Path) -> None:
    make_env(root, "py-used", days=90)
    make_env(root, "py-built", days=90)
    run = Holder(env_store.use_lock(root, "py-used"), shared=True)  # a job runs with it
    build = Holder(env_store.build_lock(root, "py-built"), shared=False)  # a rebuild
    try:
        for dry in (True, False):
            report = env_store.prune(root, Policy(max_age_days=1, max_bytes=0), dry_run=dry)
            assert names(report) == {} and sorted(report.in_use) == ["py-built", "py-used"]
        assert env_store.in_use(root, "py-used") and not env_store.remove(root, "py-used")
        assert (root / "py-used" / env_store.READY).is_file()
    finally:
        run.stop()
        build.stop()
    assert not env_store.in_use(root, "py-used")
    assert set(names(env_store.prune(root, Policy(max_age_days=1)))) == {"py-used", "py-built"}


async def test_a_lease_waits_for_a_removal_and_refreshes_last_use(root: Path) -> None:
    make_env(root, "py-x", days=3)
    lease = await Lease.take(root, "py-x", 5.0)
    try:
        assert env_store.use_lock(root, "py-x").stat().st_mtime > time.time() - 60
        assert not env_store.remove(root, "py-x")
    finally:
        lease.release()
    assert env_store.remove(root, "py-x") and not (root / "py-x").exists()
    remover = Holder(env_store.use_lock(root, "py-x"), shared=False)  # a cleanup at work
    try:
        with pytest.raises(TimeoutError):
            await Lease.take(root, "py-x", 0.3)
    finally:
        remover.stop()


# --- with real environments (uv / npm from the registries) -------------------------------


@pytest.mark.network
@pytest.mark.slow
async def test_running_skill_keeps_its_environment(tmp_path: Path) -> None:
    """A subprocess skill that is still running holds its environment through a cleanup
    that would remove everything; once it ended the cleanup removes it, and the next run
    builds it again. An in-process skill's environment stays held for the worker's life."""
    skills = tmp_path / "skills"
    folder = skills / "slow_reqs"
    shutil.copytree(MARKET / "req_skill", folder)
    md = folder / "SKILL.md"
    md.write_text(md.read_text().replace("name: req_skill", "name: slow_reqs"))
    main = folder / "main.py"
    main.write_text(
        main.read_text().replace(
            "    argparse.ArgumentParser().parse_args()\n",
            "    argparse.ArgumentParser().parse_args()\n"
            "    import os, pathlib, time\n"
            "    go = pathlib.Path(os.environ['SKILL_WORKSPACE'], 'go')\n"
            "    pathlib.Path(os.environ['SKILL_WORKSPACE'], 'started').touch()\n"
            "    while not go.exists():\n"
            "        time.sleep(0.05)\n",
        )
    )
    shutil.copytree(MARKET / "inproc_reqs", skills / "inproc_reqs")
    settings = make_settings(
        tmp_path,
        redis_url=None,
        prefix="t",
        skills_path=str(skills),
        trusted_skills=str(skills / "inproc_reqs"),  # in the worker: held for its life
    )
    ex = Executor(settings=settings, registry=load_registry([skills]), sessionmaker=None, box=None)
    root = ex.envs.root
    ws = settings.resolved_workspace_root / "r1" / "s1"
    everything = Policy(max_age_days=None, max_bytes=0)
    try:
        run = asyncio.create_task(ex.execute("slow_reqs", {}, dict(CTX)))
        for _ in range(1200):
            if (ws / "started").exists() or run.done():
                break
            await asyncio.sleep(0.05)
        assert (ws / "started").exists(), run.done() and run.result().result
        report = await asyncio.to_thread(envs.cleanup, settings, policy=everything)
        assert names(report) == {} and len(report.in_use) == 1
        (ws / "go").touch()
        first = await run
        assert first.status == "succeeded", first.result
        env_dir = Path(first.result["prefix"])
        report = await asyncio.to_thread(envs.cleanup, settings, policy=everything)
        assert env_dir.name in names(report) and not env_dir.exists()
        (ws / "started").unlink()
        again = asyncio.create_task(ex.execute("slow_reqs", {}, dict(CTX)))
        (ws / "go").touch()
        second = await again
        assert second.status == "succeeded" and second.result["prefix"] == str(env_dir)

        inproc = await ex.execute("inproc_reqs", {"text": "é"}, dict(CTX))
        assert inproc.status == "succeeded", inproc.result
        report = await asyncio.to_thread(envs.cleanup, settings, policy=everything)
        kept = {e.name for e in env_store.scan(root)}
        assert report.in_use == sorted(kept) and len(kept) == 1  # the in-process one
    finally:
        await ex.aclose()


@pytest.mark.network
@pytest.mark.slow
def test_envs_cli_and_retention_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`skills prepare` builds; `envs list` shows it with the skill that declares it;
    `envs prune --dry-run` / `--older-than 0 --max-size` and `skilljobs prune` (the pass a
    worker runs every prune interval) remove what the rules let go."""
    skills = tmp_path / "skills"
    shutil.copytree(MARKET / "req_skill", skills / "req_skill")
    data = tmp_path / "data"
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(data))
    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", str(skills))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    assert runner.invoke(app, ["skills", "prepare"]).exit_code == 0
    make_env(data / "envs", "py-0ld0rphan", days=45, size=2 * MB)

    listed = json.loads(runner.invoke(app, ["envs", "list", "--json"]).output)
    by_name = {r["name"]: r for r in listed["items"]}
    assert len(by_name) == 2 and by_name["py-0ld0rphan"]["skills"] == []
    (built,) = [r for n, r in by_name.items() if n != "py-0ld0rphan"]
    assert built["skills"] == ["req_skill"] and built["ready"] and not built["in_use"]
    assert built["source"] == "requirements.txt" and built["size_bytes"] > 20_000
    table = runner.invoke(app, ["envs", "list"]).output
    assert "req_skill" in table and "- (none declares it)" in table
    # --rebuild removes it first, never from under a running job
    holder = Holder(env_store.use_lock(data / "envs", built["name"]), shared=True)
    try:
        busy = runner.invoke(app, ["skills", "prepare", "--rebuild", "req_skill"])
        assert busy.exit_code == 1 and "a running job uses it" in busy.output, busy.output
    finally:
        holder.stop()
    rebuilt = runner.invoke(app, ["skills", "prepare", "--rebuild", "req_skill"])
    assert rebuilt.exit_code == 0 and "req_skill: built" in rebuilt.output, rebuilt.output

    dry = runner.invoke(app, ["envs", "prune", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would remove py-0ld0rphan (requirements.txt, 2.0 MB): unused for 45 days" in dry.output
    assert "would remove 1 environments" in dry.output
    assert (data / "envs" / "py-0ld0rphan").is_dir()

    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    out = runner.invoke(app, ["prune"])
    assert out.exit_code == 0, out.output
    assert "1 skill environments (2.0 MB)" in out.output
    assert not (data / "envs" / "py-0ld0rphan").exists()
    assert (data / "envs" / built["name"] / env_store.READY).is_file()  # declared, recent

    out = runner.invoke(app, ["envs", "prune", "--max-size", "0.01"])
    assert f"removed {built['name']} (requirements.txt" in out.output
    assert "over the size cap" in out.output
    assert json.loads(runner.invoke(app, ["envs", "list", "--json"]).output)["items"] == []
    listed = runner.invoke(app, ["skills", "list", "--json"]).output
    rows = {r["name"]: r["env"] for r in json.loads(listed)["items"]}
    assert rows["req_skill"] == "missing (requirements.txt)"  # built again on next use


@pytest.mark.slow
async def test_the_workers_pruner_cleans_environments(services) -> None:  # type: ignore[no-untyped-def]
    """The retention loop every worker runs (``prune.run_forever``) removes an environment
    nobody used for the retention, keeps a fresh one, and records the count in the audit."""
    from sqlalchemy import select

    from jobs.models import OpsAction
    from jobs.queue import prune

    settings = services.settings.model_copy(update={"prune_interval_sec": 0.1})
    root = envs.EnvManager.from_settings(settings).root
    root.mkdir(parents=True, exist_ok=True)
    make_env(root, "py-stale", days=60, size=MB)
    make_env(root, "py-fresh", days=0)
    stop = asyncio.Event()
    loop = asyncio.create_task(prune.run_forever(services.sessionmaker, settings, stop))
    try:
        for _ in range(400):
            if not (root / "py-stale").exists():
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)
    assert not (root / "py-stale").exists() and (root / "py-fresh" / env_store.READY).is_file()
    async with services.sessionmaker() as s:
        audit = (await s.scalars(select(OpsAction).where(OpsAction.action == "prune"))).all()
    assert [a.details["envs"] for a in audit][:1] == [1]
    assert audit[0].details["env_bytes"] >= MB
