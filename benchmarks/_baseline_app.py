"""The hand-written baseline for benchmarks/serve_load.py: what a user writes in ~30 lines without
``hybridret serve`` (FastAPI, one HybridRetriever, one search per request, a lock around writes).
It answers the same routes and JSON shapes the load test uses. Run: python _baseline_app.py DIR PORT."""

import sys
import threading

import uvicorn
from fastapi import FastAPI

from hybridret import HybridRetriever

retriever = HybridRetriever.load(sys.argv[1], warm=True)
app = FastAPI()
write_lock = threading.Lock()
calls = {"search_calls": 0, "queries": 0}


@app.get("/health")
def health() -> dict:
    return {"status": "ok", "num_docs": retriever.num_docs}


@app.get("/info")
def info() -> dict:
    return {"batching": dict(calls), "segments": retriever.info()["segments"]}


@app.post("/search")
def search(body: dict) -> dict:
    calls["search_calls"] += 1
    calls["queries"] += 1
    hits = retriever.search(body["query"], k=body.get("k", 10), method=body.get("method", "hybrid"),
                            filter=body.get("filter"))
    return {"results": [{"hits": [h.to_dict() for h in hits[0]]}]}


@app.post("/documents")
def add(body: dict) -> dict:
    with write_lock:
        return retriever.add(body["documents"]).to_dict()


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
