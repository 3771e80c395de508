"""Dependency environments: what a PEP 723 skill costs (issue 16 budgets).

1. First build of a one-package environment (``six``) with uv — with an empty uv cache
   (nothing downloaded yet) and with a warm one (another environment already fetched
   the wheel); budget ≤ 10 s.
2. Second and later runs of a PEP 723 script skill through ``Executor.execute`` against
   the same script without the block (the worker's own interpreter), alternated so both
   see the same machine load; budget: median overhead ≤ 50 ms.

3. Node skills: CommonJS without dependencies, CommonJS with a lockfile environment
   (``require`` through NODE_PATH), an ES module with the same environment (``import``
   through the resolve hook ``node --import`` loads) — what the hook costs a run.

    .venv/bin/python -m bench.envs [--runs 40] [--no-node]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jobs.catalog.loader import load_registry, load_skill
from jobs.execution import envs
from jobs.execution.env_specs import node_version
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


# Node: the same tiny skill as CommonJS without dependencies, CommonJS with a lockfile
# (require through NODE_PATH) and ES module with the same lockfile (import through the
# resolve hook loaded with node --import); the two with dependencies share one environment.
NODE_PKG = '{"name": "bench-node", "version": "1.0.0", "private": true, "dependencies": {"is-number": "7.0.0"}}'
NODE_LOCK = """{
  "name": "bench-node", "version": "1.0.0", "lockfileVersion": 3, "requires": true,
  "packages": {
    "": {"name": "bench-node", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}},
    "node_modules/is-number": {
      "version": "7.0.0",
      "integrity": "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYxxng==",
      "license": "MIT", "engines": {"node": ">=0.12.0"}
    }
  }
}
"""
NODE_SKILLS = {
    "bench_node_plain": ("main.js", 'console.log(JSON.stringify({ ok: true, n: Number("4") }));\n'),
    "bench_node_cjs": (
        "main.js",
        'const isNumber = require("is-number");\n'
        "console.log(JSON.stringify({ ok: true, n: isNumber(4) }));\n",
    ),
    "bench_node_esm": (
        "main.mjs",
        'import isNumber from "is-number";\n'
        "console.log(JSON.stringify({ ok: true, n: isNumber(4) }));\n",
    ),
}


def make_node_skills(root: Path) -> None:
    for name, (entry, code) in NODE_SKILLS.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: benchmark skill\n"
            f"exec:\n  primary: {{type: node, entry: {entry}}}\n---\n"
        )
        (d / entry).write_text(code)
        if name != "bench_node_plain":
            (d / "package.json").write_text(NODE_PKG)
            (d / "package-lock.json").write_text(NODE_LOCK)


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


async def runs(root: Path, n: int, names: list[str]) -> dict[str, list[float]]:
    """Milliseconds per ``Executor.execute`` of each skill, alternated, after a first
    (building) run of each."""
    settings = Settings(data_dir=root / "data", redis_url=None, _env_file=None)  # type: ignore[call-arg]
    ex = Executor(
        settings=settings,
        registry=load_registry([root / "skills"]),
        sessionmaker=None,
        box=None,
    )
    ctx = {"role_id": "bench", "session_id": "s", "channel": "web"}
    for name in names:  # builds the environments
        first = await ex.execute(name, {"prompt": "x"}, dict(ctx))
        assert first.status == "succeeded", first.result
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(n):
        for name in names:
            t0 = time.perf_counter()
            out = await ex.execute(name, {"prompt": "x"}, dict(ctx))
            times[name].append((time.perf_counter() - t0) * 1000)
            assert out.status == "succeeded", out.result
    await ex.aclose()
    return times


def node_report(times: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    plain, cjs, esm = med["bench_node_plain"], med["bench_node_cjs"], med["bench_node_esm"]
    print(f"Node {'.'.join(map(str, node_version()))}: no deps median {plain:.1f} ms")
    print(f"  CommonJS + lockfile env: median {cjs:.1f} ms ({cjs - plain:+.1f} ms)")
    print(f"  ES module + lockfile env (resolve hook): median {esm:.1f} ms ({esm - plain:+.1f} ms)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--no-node", action="store_true", help="skip the Node measurements")
    args = ap.parse_args()
    if envs.find_uv() is None:
        print("uv is not installed: pip install uv")
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-envs-") as tmp:
        root = Path(tmp)
        make_skills(root / "skills")
        node = shutil.which("npm") is not None and not args.no_node
        if node:
            make_node_skills(root / "skills")
        cold, warm = first_builds(root)
        times = asyncio.run(runs(root, args.runs, ["bench_pep723", "bench_plain"]))
        with_env, plain = times["bench_pep723"], times["bench_plain"]
        if node:
            node_report(asyncio.run(runs(root, args.runs, list(NODE_SKILLS))))
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
