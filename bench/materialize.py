"""Materializing a 200 MB remote file: throughput against plain httpx, and peak memory.

Run: ``.venv/bin/python -m bench.materialize``. Budget: ``materialize()`` of a 200 MB file from
a loopback server reaches ≥ 80 % of a plain httpx streaming download's throughput measured in
the same run, with peak RSS growth ≤ 64 MB. The server runs in a child process so its buffers
do not count; peak RSS is read from /proc (VmHWM, reset through /proc/self/clear_refs).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from delivery.materialize import materialize
from delivery.net.fetch import SafeFetcher

SIZE = 200 * 1024 * 1024
BLOCK = bytes(range(256)) * 4096  # 1 MiB
ROUNDS = 5


# --- the loopback server (child process) ------------------------------------------------


async def _serve() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method = head.split(b" ", 1)[0]
            writer.write(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/octet-stream\r\n"
                + f"Content-Length: {SIZE}\r\n\r\n".encode()
            )
            if method == b"GET":
                view = memoryview(BLOCK)
                for _ in range(SIZE // len(BLOCK)):
                    writer.write(view)
                    await writer.drain()
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# --- measurements (this process) ----------------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> int:
    """Reset VmHWM to the current RSS; returns that RSS in kB."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS")


async def plain_httpx(url: str, folder: Path) -> Path:
    target = folder / "plain.bin"
    async with httpx.AsyncClient(trust_env=False) as client, client.stream("GET", url) as r:
        r.raise_for_status()
        with target.open("wb") as fh:
            async for chunk in r.aiter_bytes():
                fh.write(chunk)
    return target


async def ours(url: str, folder: Path, port: int) -> Path:
    async with SafeFetcher([f"127.0.0.1:{port}"]) as fetcher:
        out, records = await materialize({"file_url": url}, folder, fetcher)
    assert records[0]["status"] == "downloaded", records
    return Path(out["files"][0]["local_path"])


async def _watch_loop(stalls: list[float]) -> None:
    """Record how late 1 ms sleeps wake up: the longest event-loop stall."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        stalls.append(time.perf_counter() - start - 0.001)


async def _timed(kind: str, url: str, port: int, folder: Path) -> tuple[float, int, float, Path]:
    before = _reset_peak()
    stalls: list[float] = []
    watcher = asyncio.create_task(_watch_loop(stalls))
    start = time.perf_counter()
    path = await (plain_httpx(url, folder) if kind == "httpx" else ours(url, folder, port))
    elapsed = time.perf_counter() - start
    watcher.cancel()
    growth_kb = _status_kb("VmHWM") - before
    return elapsed, growth_kb, max(stalls, default=0.0), path


async def run(port: int) -> dict[str, dict[str, float]]:
    url = f"http://127.0.0.1:{port}/big.bin"
    expected = hashlib.sha256()
    for _ in range(SIZE // len(BLOCK)):
        expected.update(BLOCK)
    times: dict[str, list[float]] = {"httpx": [], "materialize": []}
    peaks: dict[str, list[int]] = {"httpx": [], "materialize": []}
    lags: dict[str, list[float]] = {"httpx": [], "materialize": []}
    with tempfile.TemporaryDirectory(prefix="bench-materialize-") as tmp:
        folder = Path(tmp)
        await plain_httpx(url, folder)  # warm-up (imports, page cache, TCP)
        for _ in range(ROUNDS):
            for kind in ("httpx", "materialize"):
                elapsed, growth, lag, path = await _timed(kind, url, port, folder)
                if kind == "materialize":
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    assert digest == expected.hexdigest(), "materialized file differs"
                assert path.stat().st_size == SIZE
                path.unlink()
                times[kind].append(elapsed)
                peaks[kind].append(growth)
                lags[kind].append(lag)
    mb = SIZE / (1024 * 1024)
    return {
        kind: {
            "median_s": statistics.median(times[kind]),
            "mb_per_s": mb / statistics.median(times[kind]),
            "best_mb_per_s": mb / min(times[kind]),
            "peak_rss_growth_mb": max(peaks[kind]) / 1024,
            "median_max_stall_ms": statistics.median(lags[kind]) * 1000,
        }
        for kind in times
    }


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        asyncio.run(_serve())
        return
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.materialize", "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        results = asyncio.run(run(port))
    finally:
        child.terminate()
        child.wait(timeout=10)
    base, mine = results["httpx"], results["materialize"]
    ratio = mine["mb_per_s"] / base["mb_per_s"]
    print(f"200 MB from a loopback server, {ROUNDS} rounds each, medians:")
    print("| path | median | throughput | best | peak RSS growth | longest loop stall |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in (("plain httpx stream → file", base), ("materialize() (SafeFetcher)", mine)):
        print(
            f"| {name} | {r['median_s']:.2f} s | {r['mb_per_s']:.0f} MB/s | "
            f"{r['best_mb_per_s']:.0f} MB/s | {r['peak_rss_growth_mb']:.1f} MB | "
            f"{r['median_max_stall_ms']:.1f} ms |"
        )
    print(
        f"throughput ratio: {ratio:.0%} (budget ≥ 80 %); "
        f"peak RSS growth {mine['peak_rss_growth_mb']:.1f} MB (budget ≤ 64 MB)"
    )
    ok = ratio >= 0.8 and mine["peak_rss_growth_mb"] <= 64
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
