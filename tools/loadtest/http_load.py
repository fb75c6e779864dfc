#!/usr/bin/env python3
"""Load test of a running `dsv4 serve` (issue 10, item 6 acceptance): not a CI test, a tool to run by hand.

  1. streams:   N concurrent streaming chat completions (default 1,000), all opened at once; reports how many were
                held open at the same time, how many completed ([DONE] after a finish_reason), errors, keepalive
                comments seen while waiting, time to first token and to completion.
  2. slowloris: S connections (default 100) that send their request header one byte per second, while /health is
                requested every 0.25 s; reports its latency (acceptance: < 1 s).
  3. memory:    the server's RSS (VmRSS of --pid, same machine) before and after R requests (default 2,000; C at a
                time), and once more after they are done.
With --pid, each phase also reports the server's peak thread count (Threads of /proc/<pid>/status, every 50 ms).

Start the server with room for everyone, e.g.
    build/dsv4 serve -m models/dsv4-demo --port 8080 --queue 1000 &
    tools/loadtest/http_load.py --port 8080 --pid $!
Python 3.8+ standard library only. Exit code 1 when a check fails (not all streams completed, /health >= 1 s).
"""
import argparse
import asyncio
import json
import resource
import statistics
import sys
import time


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_status(pid, key):
    """An integer field of /proc/<pid>/status (VmRSS in KiB, Threads), or None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid):
    return proc_status(pid, "VmRSS")


class ThreadPeak:
    """Samples the server's thread count (/proc/<pid>/status Threads) every 50 ms while a phase runs."""

    def __init__(self, pid):
        self.pid, self.peak, self.task = pid, None, None

    async def _run(self):
        while True:
            n = proc_status(self.pid, "Threads")
            if n is not None:
                self.peak = n if self.peak is None else max(self.peak, n)
            await asyncio.sleep(0.05)

    def __enter__(self):
        if self.pid:
            self.task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc):
        if self.task:
            self.task.cancel()


def request_bytes(host, port, method, path, body=None, keep_alive=False):
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    head += "Connection: keep-alive\r\n" if keep_alive else "Connection: close\r\n"
    data = b""
    if body is not None:
        data = json.dumps(body).encode()
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return (head + "\r\n").encode() + data


async def read_response_head(reader):
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed before the status line")
    parts = status_line.decode(errors="replace").split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    headers = {}
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed in the response header")
        if line in (b"\r\n", b"\n"):
            break
        k, _, v = line.decode(errors="replace").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def body_chunks(reader, headers):
    """Yields the response body as it arrives (chunked, Content-Length or until close)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def simple_request(host, port, method, path, body=None, timeout=30.0):
    async def go():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request_bytes(host, port, method, path, body))
            await writer.drain()
            status, headers = await read_response_head(reader)
            data = b"".join([c async for c in body_chunks(reader, headers)])
            return status, data
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)


# ---- 1. concurrent streams -------------------------------------------------------------------------------------------

async def one_stream(args, model, i, state):
    t0 = time.monotonic()
    r = {"ok": False, "error": None, "ttft": None, "total": None, "comments": 0, "chunks": 0}
    body = {
        "model": model,
        "stream": True,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Load test request {i}: say something."}],
    }
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(args.host, args.port), args.timeout)
    except Exception as e:  # noqa: BLE001 - report any failure
        r["error"] = f"connect: {e!r}"
        return r
    state["open"] += 1
    state["peak"] = max(state["peak"], state["open"])
    try:
        writer.write(request_bytes(args.host, args.port, "POST", "/v1/chat/completions", body))
        await writer.drain()
        status, headers = await asyncio.wait_for(read_response_head(reader), args.timeout)
        if status != 200:
            data = b"".join([c async for c in body_chunks(reader, headers)])
            r["error"] = f"HTTP {status}: {data[:200]!r}"
            return r
        buf, finished, done = b"", False, False
        async for chunk in body_chunks(reader, headers):
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b":"):
                        r["comments"] += 1
                    elif line.startswith(b"data: "):
                        payload = line[6:]
                        if payload == b"[DONE]":
                            done = True
                            continue
                        r["chunks"] += 1
                        if r["ttft"] is None:
                            r["ttft"] = time.monotonic() - t0
                        try:
                            j = json.loads(payload)
                        except ValueError:
                            continue
                        if "error" in j:
                            r["error"] = f"error event: {j['error']}"
                        for c in j.get("choices", []):
                            if c.get("finish_reason"):
                                finished = True
        if done and finished and not r["error"]:
            r["ok"] = True
        elif not r["error"]:
            r["error"] = f"stream ended without {'[DONE]' if not done else 'a finish_reason'}"
    except Exception as e:  # noqa: BLE001
        r["error"] = repr(e)
    finally:
        state["open"] -= 1
        writer.close()
        r["total"] = time.monotonic() - t0
    return r


async def phase_streams(args, model):
    state = {"open": 0, "peak": 0}
    t0 = time.monotonic()
    results = await asyncio.gather(*[one_stream(args, model, i, state) for i in range(args.connections)])
    wall = time.monotonic() - t0
    ok = [r for r in results if r["ok"]]
    errors = {}
    for r in results:
        if r["error"]:
            errors[r["error"][:120]] = errors.get(r["error"][:120], 0) + 1
    ttft = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
    return {
        "connections": args.connections,
        "completed": len(ok),
        "held_open_at_once": state["peak"],
        "errors": errors,
        "keepalive_comments": sum(r["comments"] for r in results),
        "wall_s": round(wall, 2),
        "ttft_median_s": round(statistics.median(ttft), 3) if ttft else None,
        "ttft_max_s": round(ttft[-1], 3) if ttft else None,
        "generated_chunks": sum(r["chunks"] for r in results),
    }


# ---- 2. slowloris ----------------------------------------------------------------------------------------------------

async def slow_client(args, stop, stats):
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {args.host}\r\nUser-Agent: slowloris\r\n".encode()
    try:
        reader, writer = await asyncio.open_connection(args.host, args.port)
    except Exception:  # noqa: BLE001
        stats["connect_failed"] += 1
        return
    stats["connected"] += 1
    try:
        i = 0
        while not stop.is_set():
            writer.write(head[i % len(head):i % len(head) + 1])
            await writer.drain()
            i += 1
            try:
                data = await asyncio.wait_for(reader.read(1024), 1.0)
                if not data or b"408" in data:
                    stats["closed_by_server"] += 1
                    return
            except asyncio.TimeoutError:
                pass
    except (ConnectionError, OSError):
        stats["closed_by_server"] += 1
    finally:
        writer.close()


async def phase_slowloris(args):
    stop = asyncio.Event()
    stats = {"connected": 0, "connect_failed": 0, "closed_by_server": 0}
    tasks = [asyncio.ensure_future(slow_client(args, stop, stats)) for _ in range(args.slowloris)]
    await asyncio.sleep(1.0)
    latencies, failures = [], 0
    t_end = time.monotonic() + args.slowloris_seconds
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        try:
            status, _ = await simple_request(args.host, args.port, "GET", "/health", timeout=10)
            if status != 200:
                failures += 1
        except Exception:  # noqa: BLE001
            failures += 1
        latencies.append(time.monotonic() - t0)
        await asyncio.sleep(0.25)
    stop.set()
    await asyncio.gather(*tasks)
    return {
        "slow_connections": args.slowloris,
        **stats,
        "health_requests": len(latencies),
        "health_failures": failures,
        "health_median_s": round(statistics.median(latencies), 4) if latencies else None,
        "health_max_s": round(max(latencies), 4) if latencies else None,
    }


# ---- 3. memory -------------------------------------------------------------------------------------------------------

async def phase_memory(args, model):
    before = rss_kib(args.pid)
    sem = asyncio.Semaphore(args.concurrency)
    counts = {"ok": 0, "failed": 0}
    body = {"model": model, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "memory check"}]}

    async def one(i):
        async with sem:
            b = dict(body, messages=[{"role": "user", "content": f"memory check {i}"}])
            try:
                status, _ = await simple_request(args.host, args.port, "POST", "/v1/chat/completions", b,
                                                 timeout=args.timeout)
                counts["ok" if status == 200 else "failed"] += 1
            except Exception:  # noqa: BLE001
                counts["failed"] += 1

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(args.requests)])
    wall = time.monotonic() - t0
    after = rss_kib(args.pid)
    await asyncio.sleep(2.0)
    settled = rss_kib(args.pid)
    return {"requests": args.requests, **counts, "wall_s": round(wall, 2), "rss_before_kib": before,
            "rss_after_kib": after, "rss_after_2s_kib": settled,
            "rss_growth_kib": (settled - before) if before and settled else None}


async def main_async(args):
    status, data = await simple_request(args.host, args.port, "GET", "/v1/models")
    if status != 200:
        print(f"GET /v1/models: HTTP {status}", file=sys.stderr)
        return 2
    model = args.model or json.loads(data)["data"][0]["id"]
    report = {"server": f"http://{args.host}:{args.port}", "model": model,
              "fd_limit": raise_fd_limit(args.connections + args.slowloris + 256)}
    failed = []
    report["threads_at_start"] = proc_status(args.pid, "Threads")
    if "streams" in args.phases:
        with ThreadPeak(args.pid) as tp:
            s = await phase_streams(args, model)
        report["streams"] = s
        s["server_threads_peak"] = tp.peak
        print(f"streams: {s['completed']}/{s['connections']} completed, {s['held_open_at_once']} held open at once, "
              f"{s['keepalive_comments']} keepalive comments, errors {s['errors']}, {s['wall_s']} s, server threads at most "
              f"{s['server_threads_peak']}", file=sys.stderr)
        if s["completed"] != s["connections"]:
            failed.append("not every stream completed")
    if "slowloris" in args.phases:
        with ThreadPeak(args.pid) as tp:
            s = await phase_slowloris(args)
        report["slowloris"] = s
        s["server_threads_peak"] = tp.peak
        print(f"slowloris: {s['connected']} slow connections; /health max {s['health_max_s']} s, median "
              f"{s['health_median_s']} s, {s['health_failures']} failures", file=sys.stderr)
        if s["health_failures"] or (s["health_max_s"] or 0) >= 1.0:
            failed.append("/health was delayed by slow connections")
    if "memory" in args.phases:
        with ThreadPeak(args.pid) as tp:
            s = await phase_memory(args, model)
        report["memory"] = s
        s["server_threads_peak"] = tp.peak
        print(f"memory: {s['ok']}/{s['requests']} ok; RSS {s['rss_before_kib']} KiB before, {s['rss_after_kib']} KiB "
              f"after, {s['rss_after_2s_kib']} KiB 2 s later", file=sys.stderr)
        if s["failed"]:
            failed.append("requests failed in the memory phase")
    report["failed_checks"] = failed
    print(json.dumps(report, indent=2))
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--pid", type=int, default=0, help="the server's process id (RSS), same machine")
    p.add_argument("--model", default="", help="model id (default: the first of /v1/models)")
    p.add_argument("--connections", type=int, default=1000, help="concurrent streaming requests")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per streaming request")
    p.add_argument("--slowloris", type=int, default=100, help="slow connections")
    p.add_argument("--slowloris-seconds", type=float, default=10.0, help="how long /health is probed")
    p.add_argument("--requests", type=int, default=2000, help="requests of the memory phase")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent requests of the memory phase")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--phases", default="streams,slowloris,memory")
    args = p.parse_args()
    args.phases = set(args.phases.split(","))
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
