"""The writes scenario of ``benchmarks/serve_load.py`` (``--scenario writes``): clients mixing searches,
adds, upserts and deletes against ``hybridret serve``, with group commit on and off.

Each client writes only documents of its own (ids ``w-MODE-LEVEL-CLIENT-N``) and waits for each answer
before its next request, so the last acknowledged write of every id is known: after the run every
acknowledged add or upsert must be found (``GET /documents`` with its last text, and a BM25 search
filtered on its ``load_id``), and every acknowledged delete must stay gone (neither finds it). A
write that got no 200 is an error, and its id leaves the check (its outcome is unknown).

A level is ``CLIENTS`` clients with a think time drawn around ``THINK_MS`` between one answer and the
next request: ``0`` is a closed loop (the server's capacity: latency = clients / throughput), a think
time makes a paced load the server can keep up with (where latency targets mean something).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import numpy as np

WORDS = ("river", "quartz", "lantern", "orchard", "glacier", "violin", "harbor", "meadow", "comet", "saffron",
         "granite", "falcon", "tundra", "cobalt", "willow", "ember")
WRITES = ("add", "upsert", "delete")


def pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    a = np.array(xs) * 1000
    return {**{p: round(float(np.percentile(a, q)), 1) for p, q in (("p50", 50), ("p95", 95), ("p99", 99))},
            "n": len(xs)}


async def drive(url: str, clients: int, seconds: float, mix: dict[str, float], think_ms: float,
                queries: list[str], tag: str, seed: int) -> dict[str, Any]:
    lat: dict[str, list[float]] = {k: [] for k in ("search", *WRITES)}
    errors: list[str] = []
    state: dict[str, str | None] = {}  # id -> its last acknowledged text; None: acknowledged delete
    unknown: set[str] = set()
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    kinds, weights = list(mix), list(mix.values())

    async def client(c: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(seed * 1000 + c)
        mine: list[str] = []
        i = 0
        if think_ms:
            await asyncio.sleep(rng.uniform(0, think_ms / 1000))  # spread the first requests
        while time.perf_counter() < stop_at:
            i += 1
            op = rng.choices(kinds, weights)[0]
            if op in ("upsert", "delete") and not mine:
                op = "add"
            uid = text = None
            if op == "search":
                req = http.post("/search", json={"query": rng.choice(queries), "k": 10})
            elif op == "delete":
                uid = mine.pop(rng.randrange(len(mine)))
                req = http.request("DELETE", "/documents", json={"ids": [uid]})
            else:
                uid = f"w-{tag}-{c}-{i}" if op == "add" else rng.choice(mine)
                text = f"Load note {uid} version {i}: the {' '.join(rng.sample(WORDS, 5))}."
                req = http.post("/documents", json={"documents": [{"id": uid, "text": text,
                                                                   "metadata": {"load_id": uid}}],
                                                    "upsert": op == "upsert"})
            t0 = time.perf_counter()
            try:
                r = await req
                ok = r.status_code == 200
                why = "" if ok else f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                ok, why = False, f"{type(exc).__name__}: {exc}"
            lat[op].append(time.perf_counter() - t0)
            if not ok:
                errors.append(f"{op}: {why}")
                if uid is not None:
                    unknown.add(uid)
                    state.pop(uid, None)
            elif op == "add":
                mine.append(uid)  # type: ignore[arg-type]
                state[uid] = text  # type: ignore[index]
            elif op == "upsert":
                state[uid] = text  # type: ignore[index]
            elif op == "delete":
                state[uid] = None  # type: ignore[index]
            if think_ms:
                await asyncio.sleep(rng.expovariate(1000 / think_ms))

    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        before = (await http.get("/info")).json()
        start = time.perf_counter()
        await asyncio.gather(*[client(c, http) for c in range(clients)])
        took = time.perf_counter() - start
        after = (await http.get("/info")).json()
    g0, g1 = before["writes_grouped"], after["writes_grouped"]
    b0, b1 = before["batching"], after["batching"]
    writes = [x for k in WRITES for x in lat[k]]
    done = len(writes) + len(lat["search"])
    calls = g1["write_calls"] - g0["write_calls"]
    return {"clients": clients, "think_ms": think_ms, "seconds": round(took, 2), "requests": done,
            "requests_per_s": round(done / took, 2), "searches_per_s": round(len(lat["search"]) / took, 2),
            "writes_per_s": round(len(writes) / took, 2), "search_ms": pct(lat["search"]), "write_ms": pct(writes),
            **{f"{k}_ms": pct(lat[k]) for k in WRITES},
            "errors": len(errors), "error_samples": errors[:5],
            "write_calls": calls,
            "writes_per_call": round((g1["requests"] - g0["requests"]) / calls, 2) if calls else None,
            "largest_group": g1["largest_group"],
            "queries_per_encoder_call": round((b1["queries"] - b0["queries"])
                                              / max(1, b1["search_calls"] - b0["search_calls"]), 2),
            "_state": state, "_unknown": unknown}


async def verify(url: str, state: dict[str, str | None]) -> dict[str, Any]:
    """Every acknowledged write as it was acknowledged: found with its last text, or gone."""
    lost: list[str] = []
    back: list[str] = []
    ids = list(state)
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        for start in range(0, len(ids), 200):
            part = ids[start:start + 200]
            got = (await http.get("/documents", params={"ids": part})).json()["documents"]
            for uid, doc in zip(part, got):
                want = state[uid]
                if want is None and doc is not None:
                    back.append(uid)
                elif want is not None and (doc is None or doc["text"] != want):
                    lost.append(uid)
        sem = asyncio.Semaphore(8)

        async def search(uid: str) -> None:
            async with sem:
                want = state[uid]
                r = await http.post("/search", json={"query": want or uid, "k": 1, "method": "bm25",
                                                     "filter": {"load_id": uid}})
                hits = r.json()["results"][0]["hits"] if r.status_code == 200 else None
                if want is None and hits:
                    back.append(uid)
                elif want is not None and (not hits or hits[0]["id"] != uid or hits[0]["text"] != want):
                    lost.append(uid)

        await asyncio.gather(*[search(u) for u in ids])
    live = sum(1 for v in state.values() if v is not None)
    return {"acknowledged_ids": len(ids), "live": live, "deleted": len(ids) - live,
            "lost": sorted(set(lost)), "deleted_came_back": sorted(set(back))}
