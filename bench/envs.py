"""Dependency environments: what a PEP 723 skill costs (issue 16 budgets).

1. First build of a one-package environment (``six``) with uv — with an empty uv cache
   (nothing downloaded yet) and with a warm one (another environment already fetched
   the wheel); budget ≤ 10 s.
2. Second and later runs of a PEP 723 script skill through ``Executor.execute`` against
   the same script without the block (the worker's own interpreter), alternated so both
   see the same machine load; budget: median overhead ≤ 50 ms.

    .venv/bin/python -m bench.envs [--runs 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jobs.catalog.loader import load_registry, load_skill
from jobs.execution import envs
from jobs.execution.executor import Executor
from jobs.settings import Settings

BODY = """\
import argparse
import os
{imports}
if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", required=True)
    a = p.parse_args()
    out = os.path.join(os.environ["SKILL_WORKSPACE"], "out.png")
    with open(out, "wb") as fh:
        fh.write(b"\\x89PNG\\r\\n\\x1a\\n")
    print(f"MEDIA:{{out}}")
"""
PEP723 = '# /// script\n# dependencies = ["six==1.16.0"]\n# ///\n'


def make_skills(root: Path) -> None:
    for name, head, imports in (
        ("bench_pep723", PEP723, "import six  # noqa: F401\n"),
        ("bench_plain", "", ""),
    ):
        d = root / name
        d.mkdir(parents=True)
        (d / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: benchmark skill\n"
            "exec:\n  primary: {type: python, entry: main.py}\n---\n"
        )
        (d / "main.py").write_text(head + BODY.format(imports=imports))


def first_builds(root: Path) -> tuple[float, float]:
    """(cold uv cache, warm uv cache) seconds for a fresh one-package environment."""
    spec = envs.spec_for(load_skill(root / "skills" / "bench_pep723"))
    assert spec is not None
    saved = os.environ.get("UV_CACHE_DIR")
    os.environ["UV_CACHE_DIR"] = str(root / "uv-cache")  # empty: everything is downloaded
    try:
        t0 = time.perf_counter()
        envs.EnvManager(root / "cold").build(spec)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        envs.EnvManager(root / "warm").build(spec)
        warm = time.perf_counter() - t0
    finally:
        if saved is None:
            os.environ.pop("UV_CACHE_DIR", None)
        else:
            os.environ["UV_CACHE_DIR"] = saved
    return cold, warm


async def runs(root: Path, n: int) -> tuple[list[float], list[float]]:
    settings = Settings(data_dir=root / "data", redis_url=None, _env_file=None)  # type: ignore[call-arg]
    ex = Executor(
        settings=settings,
        registry=load_registry([root / "skills"]),
        sessionmaker=None,
        box=None,
    )
    ctx = {"role_id": "bench", "session_id": "s", "channel": "web"}
    first = await ex.execute("bench_pep723", {"prompt": "x"}, dict(ctx))  # builds it
    assert first.status == "succeeded", first.result
    await ex.execute("bench_plain", {"prompt": "x"}, dict(ctx))
    with_env: list[float] = []
    plain: list[float] = []
    for _ in range(n):
        for name, into in (("bench_pep723", with_env), ("bench_plain", plain)):
            t0 = time.perf_counter()
            out = await ex.execute(name, {"prompt": "x"}, dict(ctx))
            into.append((time.perf_counter() - t0) * 1000)
            assert out.status == "succeeded", out.result
    await ex.aclose()
    return with_env, plain


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    if envs.find_uv() is None:
        print("uv is not installed: pip install uv")
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-envs-") as tmp:
        root = Path(tmp)
        make_skills(root / "skills")
        cold, warm = first_builds(root)
        with_env, plain = asyncio.run(runs(root, args.runs))
    med_env, med_plain = statistics.median(with_env), statistics.median(plain)
    overhead = med_env - med_plain
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPU(s), {sys.platform}")
    print(f"first build with uv (one package): cold cache {cold:.2f} s, warm cache {warm:.2f} s")
    print(f"PEP 723 skill, later runs: median {med_env:.1f} ms (max {max(with_env):.1f})")
    print(f"same script without deps: median {med_plain:.1f} ms (max {max(plain):.1f})")
    print(f"overhead: {overhead:.1f} ms (budget 50 ms)")
    ok = overhead <= 50 and cold <= 10
    print("OK" if ok else "OVER BUDGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
