"""Load test of ``hybridret serve``, two scenarios.

``--scenario batching`` (the default): 1, 8 and 32 concurrent clients, 95% searches / 5% adds, with
micro-batching on and off, and against a hand-written ~30-line FastAPI app (``_baseline_app.py``).

``--scenario writes``: 32 clients mixing searches, adds, upserts and deletes (``--mix``), with group
commit on (``group``) and off (``nogroup``: ``hybridret serve --no-group-commit``, one commit per
write), at each ``--think-ms`` (0: a closed loop, the server's capacity; else a paced load); then
every acknowledged write is checked: each add or upsert found with its last text (by id and by a
search), each delete gone (see ``benchmarks/_load_writes.py``). Writes
benchmarks/results/serve-load-writes.json. ``--smoke``: 4 clients, 4 s, a 30-passage index (CI).

Everything runs on this machine over loopback: the script indexes the packaged sample corpus (or
copies ``--index``), starts ``hybridret serve`` on 127.0.0.1 once per batching mode (on a fresh
copy, so both modes start from the same index), drives it with asyncio + httpx clients for
``--seconds`` per concurrency level (bounded also by ``--max-requests``), then checks that every
document whose add was acknowledged is searchable (by its id in a metadata filter and its exact
text). Reports requests/s, p50/p95/p99 latency of searches and adds, errors (must be 0), and how
many queries each encoder call carried (the server's /info counters).

    python benchmarks/serve_load.py --seconds 10
    taskset -c 1 python benchmarks/serve_load.py --scenario writes

Writes benchmarks/results/serve-load.json (or serve-load-writes.json) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "hybridret" / "resources" / "sample"
RESULTS = ROOT / "benchmarks" / "results" / "serve-load.json"
RESULTS_WRITES = ROOT / "benchmarks" / "results" / "serve-load-writes.json"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
WORDS = ("river", "quartz", "lantern", "orchard", "glacier", "violin", "harbor", "meadow", "comet", "saffron")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_index(out: Path, docs: int | None = None) -> None:
    corpus = SAMPLE / "corpus.jsonl"
    if docs is not None:  # the first DOCS passages
        corpus = out.parent / "corpus.jsonl"
        corpus.write_text("".join((SAMPLE / "corpus.jsonl").read_text().splitlines(keepends=True)[:docs]))
    subprocess.run([sys.executable, "-m", "hybridret", "-q", "index", str(corpus), "-o", str(out)],
                   check=True, env=ENV)


def base_index(args: argparse.Namespace, base: Path) -> None:
    """The index every mode starts from: a copy of ``--index``, or the sample corpus built."""
    if args.index:
        shutil.copytree(args.index, base, ignore=shutil.ignore_patterns("*.lock", "leases"))
    else:
        base.parent.mkdir(parents=True, exist_ok=True)
        build_index(base, args.docs)


def serve_copy(base: Path, copy: Path, mode: str, args: argparse.Namespace) -> tuple[Server, int]:
    """A server on a fresh copy of ``base``, ready, and the documents it holds."""
    shutil.copytree(base, copy)
    server = Server(copy, mode, args.window_ms, args.max_batch)
    server.wait()
    return server, httpx.get(f"{server.url}/health").json()["num_docs"]


class Server:
    def __init__(self, index: Path, mode: str, window_ms: float, max_batch: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "hybridret", "-q", "serve", str(index), "--port", str(self.port),
               "--batch-window-ms", str(window_ms), "--max-batch", str(max_batch)]
        if mode == "off":
            cmd.append("--no-batching")
        elif mode == "nogroup":
            cmd.append("--no-group-commit")
        elif mode == "baseline":  # the hand-written ~30-line FastAPI app (benchmarks/_baseline_app.py)
            cmd = [sys.executable, str(ROOT / "benchmarks" / "_baseline_app.py"), str(index), str(self.port)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, env=ENV, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited: {self.log.read().decode(errors='replace')}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not start")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


async def drive(url: str, clients: int, seconds: float, max_requests: int, add_ratio: float, queries: list[str],
                tag: str, seed: int) -> dict[str, Any]:
    lat: dict[str, list[float]] = {"search": [], "add": []}
    errors: list[str] = []
    acked: list[dict[str, Any]] = []
    issued = 0
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal issued
        rng = random.Random(seed * 1000 + c)
        i = 0
        while time.perf_counter() < stop_at and issued < max_requests:
            issued += 1
            i += 1
            if rng.random() < add_ratio:
                uid = f"load-{tag}-{clients}-{c}-{i}"
                doc = {"id": uid, "text": f"Load test note {uid}: the {' '.join(rng.sample(WORDS, 4))}.",
                       "metadata": {"load_id": uid}}
                kind, req = "add", http.post("/documents", json={"documents": [doc]})
            else:
                doc = None
                kind, req = "search", http.post("/search", json={"query": rng.choice(queries), "k": 10})
            t0 = time.perf_counter()
            try:
                r = await req
            except httpx.HTTPError as exc:
                errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                continue
            lat[kind].append(time.perf_counter() - t0)
            if r.status_code != 200:
                errors.append(f"{kind}: HTTP {r.status_code}: {r.text[:200]}")
            elif doc is not None:
                acked.append(doc)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        before = (await http.get("/info")).json()["batching"]
        start = time.perf_counter()
        await asyncio.gather(*[client(c, http) for c in range(clients)])
        took = time.perf_counter() - start
        after = (await http.get("/info")).json()["batching"]
    calls = after["search_calls"] - before["search_calls"]
    nq = after["queries"] - before["queries"]

    def pct(xs: list[float]) -> dict[str, float | None]:
        if not xs:
            return {"p50": None, "p95": None, "p99": None}
        a = np.array(xs) * 1000
        return {p: round(float(np.percentile(a, q)), 2) for p, q in (("p50", 50), ("p95", 95), ("p99", 99))}

    done = len(lat["search"]) + len(lat["add"])
    return {"clients": clients, "seconds": round(took, 2), "requests": done, "searches": len(lat["search"]),
            "adds": len(lat["add"]), "requests_per_s": round(done / took, 2),
            "searches_per_s": round(len(lat["search"]) / took, 2), "search_ms": pct(lat["search"]),
            "add_ms": pct(lat["add"]), "errors": len(errors), "error_samples": errors[:5],
            "encoder_calls": calls, "queries_per_encoder_call": round(nq / calls, 2) if calls else None,
            "_acked": acked}


async def verify(url: str, docs: list[dict[str, Any]]) -> list[str]:
    """The ids of acknowledged documents that a search does not find."""
    missing: list[str] = []
    sem = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        async def one(doc: dict[str, Any]) -> None:
            async with sem:
                r = await http.post("/search", json={"query": doc["text"], "k": 1, "method": "bm25",
                                                     "filter": {"load_id": doc["id"]}})
                hits = r.json()["results"][0]["hits"] if r.status_code == 200 else []
                if not hits or hits[0]["id"] != doc["id"] or hits[0]["text"] != doc["text"]:
                    missing.append(doc["id"])
        await asyncio.gather(*[one(d) for d in docs])
    return missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="per concurrency level and mode (default: 60)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-requests", type=int, default=200_000, help="cap per level (default: 200000)")
    ap.add_argument("--add-ratio", type=float, default=0.05)
    ap.add_argument("--index", type=Path, default=None, help="index to copy (default: build the sample corpus)")
    ap.add_argument("--window-ms", type=float, default=3.0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--modes", nargs="+", default=None, choices=["on", "off", "baseline", "group", "nogroup"],
                    help="batching: hybridret serve with micro-batching on / off, and a hand-written FastAPI app "
                         "(default: all three); writes: group commit on / off (default: both)")
    ap.add_argument("--scenario", choices=["batching", "writes"], default="batching")
    ap.add_argument("--think-ms", type=float, nargs="+", default=[0.0, 2000.0],
                    help="writes: mean think time per client between an answer and its next request, one level "
                         "each (default: 0 2000)")
    ap.add_argument("--mix", default="search=0.7,add=0.15,upsert=0.1,delete=0.05",
                    help="writes: the share of each request kind (default: search=0.7,add=0.15,upsert=0.1,delete=0.05)")
    ap.add_argument("--docs", type=int, default=None, help="index only the first DOCS sample passages")
    ap.add_argument("--repeats", type=int, default=1, help="writes: run every mode this many times (median, spread)")
    ap.add_argument("--smoke", action="store_true", help="writes: 4 clients, 4 s, 30 passages, group commit on (CI)")
    args = ap.parse_args()
    if args.scenario == "writes" or args.smoke:
        return main_writes(args, ap)
    args.modes = args.modes or ["on", "off", "baseline"]
    if not 0 < args.seconds <= 3600 or max(args.clients) > 256:
        ap.error("--seconds must be in (0, 3600] and at most 256 clients")
    queries = [json.loads(x)["text"] for x in (SAMPLE / "queries.jsonl").read_text().splitlines() if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    try:
        base = work / "base"
        base_index(args, base)
        report: dict[str, Any] = {"seconds_per_level": args.seconds, "add_ratio": args.add_ratio,
                                  "window_ms": args.window_ms, "max_batch": args.max_batch,
                                  "cpus": os.cpu_count(), "index_docs": None, "modes": {}}
        for mode in args.modes:
            server, report["index_docs"] = serve_copy(base, work / f"idx-{mode}", mode, args)
            levels = []
            acked: list[dict[str, Any]] = []
            for n in args.clients:
                level = asyncio.run(drive(server.url, n, args.seconds, args.max_requests, args.add_ratio, queries,
                                          mode, seed=n))
                acked += level.pop("_acked")
                levels.append(level)
                print(f"batching {mode:>3}, {n:>2} clients: {level['requests_per_s']:.1f} req/s, "
                      f"errors {level['errors']}", file=sys.stderr)
            missing = asyncio.run(verify(server.url, acked))
            segments = len(httpx.get(f"{server.url}/info").json()["segments"])
            rc = server.stop()
            report["modes"][mode] = {"levels": levels, "acked_adds": len(acked), "acked_not_found": missing,
                                     "segments_at_end": segments, "server_exit": rc}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")

    head = (f"{'batching':>8} {'clients':>7} {'req/s':>7} {'search p50':>10} {'p95':>7} {'p99':>7} "
            f"{'add p50':>8} {'add p95':>8} {'q/call':>6} {'errors':>6}")
    print(head)
    print("-" * len(head))
    for mode, res in report["modes"].items():
        for lv in res["levels"]:
            s, a = lv["search_ms"], lv["add_ms"]
            print(f"{mode:>8} {lv['clients']:>7} {lv['requests_per_s']:>7.1f} {s['p50'] or 0:>10.1f} {s['p95'] or 0:>7.1f} "
                  f"{s['p99'] or 0:>7.1f} {a['p50'] or 0:>8.1f} {a['p95'] or 0:>8.1f} "
                  f"{lv['queries_per_encoder_call'] or 0:>6.2f} {lv['errors']:>6}")
        print(f"{mode:>8} acknowledged adds: {res['acked_adds']}, not searchable afterwards: "
              f"{len(res['acked_not_found'])}, segments at the end: {res['segments_at_end']}")
    print(f"(latencies in ms; {args.seconds:g} s per level; written to {args.output})")
    bad = any(lv["errors"] for r in report["modes"].values() for lv in r["levels"]) or \
        any(r["acked_not_found"] for r in report["modes"].values())
    return 1 if bad else 0


def main_writes(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    from _load_writes import drive as drive_writes
    from _load_writes import verify as verify_writes

    if args.smoke:
        args.seconds, args.clients, args.think_ms, args.docs = 4.0, [4], [0.0], 30
        args.modes = args.modes or ["group"]
    args.modes = args.modes or ["group", "nogroup"]
    if any(m not in ("group", "nogroup") for m in args.modes):
        ap.error("the writes scenario runs the modes group and nogroup")
    if args.clients == [1, 8, 32]:
        args.clients = [32]
    try:
        mix = {k: float(v) for k, v in (part.split("=") for part in args.mix.split(","))}
    except ValueError:
        ap.error(f"--mix must look like search=0.7,add=0.2,delete=0.1, got {args.mix!r}")
    if set(mix) - {"search", "add", "upsert", "delete"} or not sum(mix.values()) > 0:
        ap.error("--mix takes search, add, upsert and delete shares")
    if not 0 < args.seconds <= 3600 or max(args.clients) > 256:
        ap.error("--seconds must be in (0, 3600] and at most 256 clients")
    output = args.output if args.output != RESULTS else RESULTS_WRITES
    queries = [json.loads(x)["text"] for x in (SAMPLE / "queries.jsonl").read_text().splitlines() if x.strip()]
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    report: dict[str, Any] = {"scenario": "writes", "seconds_per_level": args.seconds, "mix": mix,
                              "cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
                              "loadavg_before": [round(x, 2) for x in load], "index_docs": None, "modes": {}}
    try:
        base = work / "base"
        base_index(args, base)
        for run, mode in [(r, m) for r in range(args.repeats) for m in args.modes]:
            server, report["index_docs"] = serve_copy(base, work / f"idx-{mode}-{run}", mode, args)
            levels = []
            state: dict[str, Any] = {}
            unknown: set[str] = set()
            for n in args.clients:
                for think in args.think_ms:
                    level = asyncio.run(drive_writes(server.url, n, args.seconds, mix, think, queries,
                                                     f"{mode}{int(think)}", seed=n))
                    state.update(level.pop("_state"))
                    unknown |= level.pop("_unknown")
                    level["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
                    levels.append(level)
                    print(f"group commit {mode:>7}, {n:>2} clients, think {think:g} ms: {level['requests_per_s']:.1f} "
                          f"req/s, errors {level['errors']}", file=sys.stderr)
            checked = asyncio.run(verify_writes(server.url, state))
            segments = len(httpx.get(f"{server.url}/info").json()["segments"])
            t0 = time.perf_counter()
            rc = server.stop()
            report["modes"].setdefault(mode, {"runs": []})["runs"].append(
                {"levels": levels, **checked, "unknown_outcome": len(unknown), "segments_at_end": segments,
                 "server_exit": rc, "shutdown_s": round(time.perf_counter() - t0, 2)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for res in report["modes"].values():  # per level: the median of the runs, and their range
        res["median"] = []
        for i, first in enumerate(res["runs"][0]["levels"]):
            lv = [r["levels"][i] for r in res["runs"]]
            out: dict[str, Any] = {"clients": first["clients"], "think_ms": first["think_ms"]}
            for key, get in (("requests_per_s", lambda x: x["requests_per_s"]),
                             ("search_p50", lambda x: x["search_ms"]["p50"]), ("search_p95", lambda x: x["search_ms"]["p95"]),
                             ("write_p50", lambda x: x["write_ms"]["p50"]), ("write_p95", lambda x: x["write_ms"]["p95"]),
                             ("writes_per_call", lambda x: x["writes_per_call"])):
                vals = [get(x) for x in lv if get(x) is not None]
                out[key] = {"median": float(np.median(vals)), "min": min(vals), "max": max(vals)} if vals else None
            out["errors"] = sum(x["errors"] for x in lv)
            res["median"].append(out)
        res["lost"] = sum(len(r["lost"]) for r in res["runs"])
        res["deleted_came_back"] = sum(len(r["deleted_came_back"]) for r in res["runs"])
        res["acknowledged_ids"] = sum(r["acknowledged_ids"] for r in res["runs"])
        res["server_exits"] = [r["server_exit"] for r in res["runs"]]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    head = (f"{'group':>7} {'clients':>7} {'think':>6} {'req/s':>6} {'search p50':>10} {'p95':>7} {'write p50':>9} "
            f"{'p95':>7} {'writes/commit':>13} {'errors':>6}")
    print(head)
    print("-" * len(head))
    def m(v: dict[str, Any] | None) -> float:
        return v["median"] if v else 0.0

    for mode, res in report["modes"].items():
        for lv in res["median"]:
            print(f"{mode:>7} {lv['clients']:>7} {lv['think_ms']:>6g} {m(lv['requests_per_s']):>6.1f} "
                  f"{m(lv['search_p50']):>10.1f} {m(lv['search_p95']):>7.1f} {m(lv['write_p50']):>9.1f} "
                  f"{m(lv['write_p95']):>7.1f} {m(lv['writes_per_call']):>13.2f} {lv['errors']:>6}")
        print(f"{mode:>7} acknowledged ids: {res['acknowledged_ids']}; lost: {res['lost']}, deleted but back: "
              f"{res['deleted_came_back']}; server exits {res['server_exits']}")
    print(f"(medians of {args.repeats} run(s); latencies in ms; {args.seconds:g} s per level; load average before "
          f"{load[0]:.2f}; written to {output})")
    bad = any(lv["errors"] for r in report["modes"].values() for lv in r["median"]) or \
        any(r["lost"] or r["deleted_came_back"] or any(report["modes"][k]["server_exits"]) for k, r in report["modes"].items())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
