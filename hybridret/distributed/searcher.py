"""ShardedSearcher: one search over many shard actors, equal to a single index over the same corpus.

A query batch is encoded **once**, here. Then, against one pinned set of shard commits:

1. (BM25 only) every shard returns its collection statistics for the batch's tokens; their sum is
   the whole collection's (document count, total length, document frequencies);
2. every shard returns each retriever's top ``depth`` (pre-filtered) with exact scores, the union
   of its own lists and every retriever's exact score of that union (BM25 with the global
   statistics), so a candidate's scores come from the one shard that owns it;
3. the coordinator merges each retriever's lists into the global top ``depth``, forms the global
   union, gathers the exact scores (and, for GQR, asks the owning shards for the dense vectors),
   and runs normalisation, RRF ranks, linear fusion or GQR once, on the global candidate set.

Nothing is normalised per shard. Writes route each document to its owning shard
(:func:`~hybridret.distributed.layout.shard_of`) and return once every touched shard committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..encoders import Encoder, compare_configs
from ..errors import ConfigError, DocumentNotFoundError, IndexExistsError, IndexFormatError
from ..filters import Filter
from ..hybrid import FUSION_CHUNK, Candidates, FusionConfig, fuse
from ..retrievers import REGISTRY, RETRIEVERS, QueryBatch
from ..searcher import EncoderSlot, Searcher, check_search, encode_query_batch
from ..types import Hit, Hits, MatchedTerm
from .layout import ShardLayout, read_layout, split_by_shard
from .merge import SHARD_SHIFT, global_union, key_of, lookup, merge_lists, split_key
from .shard import ShardStaleError, ShardUnavailableError, shard_actor_class

__all__ = ["ShardedSearcher"]

logger = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("the distributed path needs Ray: pip install 'hybridret[ray]'") from None
    return ray


def _global_bm25() -> bool:
    from ..retrievers import bm25

    return hasattr(bm25, "collection_stats") and hasattr(bm25, "bm25_tokens")


class _Stats:
    """The availability / fusion defaults view that :meth:`Searcher.fusion_config` reads."""

    def __init__(self, available: dict[str, bool], fusion: Mapping[str, Any] | None) -> None:
        self._available = available
        self.manifest = {"fusion": fusion}

    def available(self, snap: Any = None) -> dict[str, bool]:
        return dict(self._available)


class ShardedHitSource:
    """Hit views of a sharded search: texts, metadata and matched terms from the owning shards,
    at the commits the search ran on."""

    def __init__(self, searcher: ShardedSearcher, commits: list[int]) -> None:
        self.searcher, self.commits = searcher, commits

    def view(self, hits: Hits, i: int) -> list[Hit]:
        keys = hits.rows[i]
        shard, row = split_key(keys)
        docs: dict[int, dict[str, Any]] = {}
        for s in sorted(set(shard[shard >= 0].tolist())):
            mine = [int(r) for r in row[shard == s]]
            got = self.searcher._call_one(s, "docs", self.commits[s], mine)
            docs.update({int(k): d for k, d in zip(keys[shard == s], got)})
        enc = None
        out: list[Hit] = []
        for j, key in enumerate(keys):
            if key < 0:
                continue
            d = docs[int(key)]
            matched: list[MatchedTerm] = []
            if hits.query_sparse is not None and d["sparse"] is not None:
                enc = enc or self.searcher._encoder.get()
                matched = _matched(enc, hits.query_sparse[i], d["sparse"], (d["title"] + " " + d["text"]).strip())
            out.append(Hit(id=d["id"], rank=j + 1, score=float(hits.scores[i, j]),
                           scores={n: float(v[i, j]) for n, v in hits.components.items()}, title=d["title"],
                           text=d["text"], matched_terms=matched, metadata=d["metadata"]))
        return out


def _matched(enc: Encoder, q: sp.csr_matrix, doc: tuple[np.ndarray, np.ndarray], text: str) -> list[MatchedTerm]:
    indices, data = doc
    shared, qi, di = np.intersect1d(q.indices, indices, assume_unique=True, return_indices=True)
    if not len(shared):
        return []
    literal = enc.text_term_ids(text) if text else set()
    vocab = enc.vocab or []
    terms = [MatchedTerm(term=vocab[t], query_weight=float(q.data[a]), doc_weight=float(data[b]),
                         expansion=int(t) not in literal) for t, a, b in zip(shared, qi, di)]
    terms.sort(key=lambda m: -m.contribution)
    return terms


class ShardedSearcher:
    """Search (and write to) a sharded index through one Ray actor per shard.

    >>> searcher = ShardedSearcher.open("indexes/sharded")          # local Ray, or address="ray://..."
    >>> hits = searcher.search("a question", k=10, method="rrf", filter={"lang": "en"})
    """

    def __init__(self, layout: ShardLayout, actors: list[Any], *, encoder: Encoder | None = None,
                 device: str | None = None, timeout: float | None = 120.0, owns_actors: bool = True) -> None:
        self.layout = layout
        self.root = layout.root
        self.actors = actors
        self.names = layout.names
        self.timeout = timeout
        self._owns = owns_actors
        self._encoder = EncoderSlot(encoder, layout.encoder, device)
        infos = self._call("info", [() for _ in actors])
        for info in infos:
            diffs = compare_configs(layout.encoder, info["encoder"]) if layout.encoder else []
            if diffs:
                raise IndexFormatError(f"{info['name']} of {self.root} was built by another encoder than the "
                                       f"layout names: {'; '.join(diffs)}")
        self._infos = infos
        self._commits = [int(i["commit"]) for i in infos]
        self._warned_bm25 = False

    @classmethod
    def open(cls, root: str | Path, *, address: str | None = None, encoder: Encoder | None = None,
             device: str | None = None, num_cpus: float = 0.25, num_gpus: float = 0.0, max_restarts: int = 3,
             max_task_retries: int = 3, timeout: float | None = 120.0) -> ShardedSearcher:
        """Start one actor per shard of the sharded index at ``root`` (every node must see ``root``
        at the same path: a shared filesystem) and connect them. Ray is initialised here when it is
        not yet (``address``: an existing cluster; ``None``: a local one). A shard actor that dies
        is restarted from its directory up to ``max_restarts`` times; calls in flight are retried."""
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        layout = read_layout(root)
        actor_cls = shard_actor_class()
        actors = [actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                                    max_task_retries=max_task_retries).remote(
                      str(layout.shard_dir(i).resolve()), name, device) for i, name in enumerate(layout.names)]
        return cls(layout, actors, encoder=encoder, device=device, timeout=timeout)

    # -- calls to shards ------------------------------------------------------------------------
    def _call(self, method: str, args: Sequence[tuple[Any, ...]], shards: Sequence[int] | None = None, *,
              partial: bool = False) -> list[Any]:
        """Call ``method`` on shards (all by default) at once; a shard that cannot answer raises
        :class:`ShardUnavailableError` naming it, or with ``partial`` gives ``None``."""
        ray = _ray()
        shards = list(range(len(self.actors))) if shards is None else list(shards)
        refs = [getattr(self.actors[s], method).remote(*a) for s, a in zip(shards, args)]
        out: list[Any] = []
        failed: list[str] = []
        errors: list[str] = []
        for s, ref in zip(shards, refs):
            try:
                out.append(ray.get(ref, timeout=self.timeout))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                failed.append(self.names[s])
                errors.append(f"{self.names[s]}: {type(exc).__name__}")
                out.append(None)
        if failed and not partial:
            raise ShardUnavailableError(f"shards of {self.root} did not answer {method}: {', '.join(errors)}", failed)
        return out

    def _call_one(self, s: int, method: str, *args: Any) -> Any:
        return self._call(method, [args], [s])[0]

    # -- state ----------------------------------------------------------------------------------
    @property
    def commits(self) -> dict[str, int]:
        """The commit of each shard that searches read (one consistent set; see :meth:`refresh`)."""
        return dict(zip(self.names, self._commits))

    @property
    def shard_infos(self) -> list[dict[str, Any]]:
        """Each shard's state (name, commit, num_docs, ...) at the commits searches read."""
        return [dict(i) for i in self._infos]

    @property
    def num_docs(self) -> int:
        return int(sum(i["num_docs"] for i in self._call("info", [() for _ in self.actors])))

    def refresh(self) -> bool:
        """Have every shard open its newest commit, then pin that set in one assignment."""
        commits = [int(c) for c in self._call("refresh", [() for _ in self.actors])]
        changed = commits != self._commits
        self._infos = self._call("info", [() for _ in self.actors])
        self._commits = commits
        return changed

    def available(self) -> dict[str, bool]:
        live = [i for i in self._infos if i.get("segments", 1) > 0] or self._infos  # an emptied shard has no parts
        return {name: all(i["available"][name] for i in live) and
                (REGISTRY[name].needs == "text" or self._encoder.has(REGISTRY[name].needs)) for name in RETRIEVERS}

    def fusion_config(self, method: str = "hybrid", fusion: FusionConfig | Mapping[str, Any] | None = None
                      ) -> FusionConfig | None:
        """The same defaults as :meth:`Searcher.fusion_config`, over the shards' common components."""
        view = _Stats(self.available(), self.layout.fusion or self._infos[0].get("fusion"))
        return Searcher.fusion_config(view, method, fusion, view)  # type: ignore[arg-type]

    def encode_queries(self, texts: list[str], needs: set[str]) -> QueryBatch:
        return encode_query_batch(self._encoder, texts, needs)

    def close(self) -> None:
        """Stop the shard actors this searcher started."""
        if self._owns:
            ray = _ray()
            for a in self.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # already gone
                    pass
            self.actors = []

    # -- search ---------------------------------------------------------------------------------
    def search(self, queries: str | Sequence[str], k: int = 10, *, method: str = "hybrid",
               filter: Filter | Mapping[str, Any] | str | None = None,
               fusion: FusionConfig | Mapping[str, Any] | None = None, candidates: int | None = None,
               partial: bool = False) -> Hits:
        """As :meth:`hybridret.searcher.Searcher.search`, over every shard. A shard that cannot
        answer raises :class:`ShardUnavailableError` naming it; with ``partial=True`` the others'
        results are returned and ``hits.missing_shards`` names the missing ones (always set)."""
        texts, k, candidates, filt = check_search(queries, k, method, candidates, filter)
        try:
            return self._search(texts, k, method, filt, fusion, candidates, partial)
        except ShardStaleError:  # a shard restarted on a newer commit: pin the current set, once
            logger.info("a shard of %s moved to another commit; refreshing and retrying", self.root)
            self.refresh()
            return self._search(texts, k, method, filt, fusion, candidates, partial)

    def _search(self, texts: list[str], k: int, method: str, filt: Filter | None, fusion: Any,
                candidates: int | None, partial: bool) -> Hits:
        commits = list(self._commits)  # one consistent set of shard snapshots for the whole call
        cfg = None
        single = method if method in REGISTRY else None
        have = self.available()
        if single is None:
            cfg = self.fusion_config(method, fusion)
            if cfg is None:
                single = next(r for r, ok in have.items() if ok)
            elif candidates is not None:
                cfg = cfg.with_(depth=candidates)
        used = {single} if single else set(cfg.union_retrievers)  # type: ignore[union-attr]
        for name in sorted(used):
            if not have[name]:
                what = {"dense": "dense", "sparse": "learned-sparse", "bm25": "BM25"}.get(name, name)
                raise ConfigError(f"this sharded index has no {what} component")
        if cfg is not None and cfg.method == "gqr":
            if any(i["dense_metrics"] not in ([], ["ip"]) for i in self._infos):
                raise ConfigError("GQR needs a dense index with inner-product scores (faiss_metric='ip')")
            if cfg.gqr.final == "research":
                raise ConfigError("GQR with final='research' is not available on a sharded index; use 'rerank' or "
                                  "'fuse'")
        label = method if method != "hybrid" else f"hybrid:{cfg.method if cfg else single}"
        n, keep = len(texts), [i for i, t in enumerate(texts) if t.strip()]
        keys = np.full((n, k), -1, dtype=np.int64)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        ids = np.full((n, k), "", dtype=object)
        comps: dict[str, np.ndarray] = {}
        missing: set[str] = set()
        qs = None
        if keep:
            q = self.encode_queries([texts[i] for i in keep], {REGISTRY[u].needs for u in used})
            parts = []
            for a in range(0, len(q), FUSION_CHUNK):
                sub = q.slice(a, a + FUSION_CHUNK)
                parts.append(self._search_chunk(sub, k, single, cfg, filt, commits, partial, missing))
            r = np.concatenate([p[0] for p in parts])
            keys[keep], scores[keep], ids[keep] = r, np.concatenate([p[1] for p in parts]), \
                np.concatenate([p[2] for p in parts])
            for name in parts[0][3]:
                comps[name] = np.full((n, k), np.nan, dtype=np.float32)
                comps[name][keep] = np.concatenate([p[3][name] for p in parts])
            if q.sparse is not None:
                place = sp.csr_matrix((np.ones(len(keep), np.float32), (keep, np.arange(len(keep)))),
                                      shape=(n, len(keep)))
                qs = (place @ q.sparse).tocsr()
        hits = Hits(queries=texts, method=label, ids=ids, rows=keys, scores=scores, components=comps,
                    query_sparse=qs, _source=ShardedHitSource(self, commits))
        hits.missing_shards = sorted(missing)  # type: ignore[attr-defined]
        return hits

    def _bm25_stats(self, q: QueryBatch, commits: list[int], partial: bool, missing: set[str]) -> Any:
        if not _global_bm25():
            if not self._warned_bm25:
                logger.warning("this hybridret has no global BM25 statistics: each shard scores BM25 with its own "
                               "(results differ from a single index)")
                self._warned_bm25 = True
            return None
        got = self._call("bm25_stats", [(c, q.texts) for c in commits], partial=partial)
        missing.update(self.names[s] for s, g in enumerate(got) if g is None)
        found = [g for g in got if g is not None]
        if not found:
            raise ShardUnavailableError(f"no shard of {self.root} answered", list(self.names))
        total = found[0]
        for g in found[1:]:
            total = total + g
        return total

    def _search_chunk(self, q: QueryBatch, k: int, single: str | None, cfg: FusionConfig | None, filt: Filter | None,
                      commits: list[int], partial: bool, missing: set[str]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        ray = _ray()
        names = (single,) if single else cfg.union_retrievers  # type: ignore[union-attr]
        stats = self._bm25_stats(q, commits, partial, missing) if "bm25" in names else None
        depth = k if single else max(k, cfg.depth)  # type: ignore[union-attr]
        q_ref = ray.put(q)
        score_all = () if single else names
        answers = self._call("search", [(c, q_ref, names, depth, filt, stats, score_all) for c in commits],
                             partial=partial)
        missing.update(self.names[s] for s, a in enumerate(answers) if a is None)
        shards = [s for s, a in enumerate(answers) if a is not None]
        if not shards:
            raise ShardUnavailableError(f"no shard of {self.root} answered", list(self.names))
        nq = len(q)
        lists: dict[str, np.ndarray] = {}
        listed_scores: dict[str, np.ndarray] = {}
        for name in names:
            per = []
            for s in shards:
                rows, sc = answers[s]["lists"][name]
                id_map = answers[s]["ids"]
                per.append((key_of(s, rows), sc, np.vectorize(lambda r, m=id_map: m.get(int(r), ""),
                                                               otypes=[object])(rows) if rows.size else
                            np.full(rows.shape, "", dtype=object)))
            gk, gs, gi = merge_lists(per, depth, nq)
            lists[name], listed_scores[name] = gk, gs
            if single:
                return gk, gs, gi, {name: gs}
        union, listed = global_union(lists)
        all_keys = np.concatenate([key_of(s, answers[s]["union"]) for s in shards], axis=1)
        exact = {}
        for name in names:
            vals = np.concatenate([answers[s]["exact"][name] for s in shards], axis=1)
            exact[name] = lookup(union, all_keys, vals).astype(np.float32)
        if "dense" in exact:  # padding scores -inf, as the dense index does
            exact["dense"] = np.where(union >= 0, exact["dense"], -np.inf).astype(np.float32)
        id_of: dict[int, str] = {}
        for s in shards:
            id_of.update({(s << SHARD_SHIFT) | int(r): i for r, i in answers[s]["ids"].items()})
        # coordinator table: candidate entries addressed by position (what fuse sees as rows)
        flat = union[union >= 0]
        table_keys, inverse = np.unique(flat, return_inverse=True)
        table_rows = np.full(union.shape, -1, dtype=np.int64)
        table_rows[union >= 0] = inverse
        vectors = None
        if cfg.method == "gqr":  # type: ignore[union-attr]
            table = self._vectors(table_keys, commits)
            vectors = np.where((table_rows >= 0)[..., None], table[np.maximum(table_rows, 0)], 0.0).astype(np.float32)
        cands = Candidates(rows=table_rows, exact=exact, listed=listed, vectors=vectors)
        rows, fused, comps = fuse(cfg, cands, k, None, q)  # type: ignore[arg-type]
        out_keys = np.where(rows >= 0, table_keys[np.maximum(rows, 0)] if len(table_keys) else -1, -1)
        out_ids = np.vectorize(lambda x: id_of.get(int(x), ""), otypes=[object])(out_keys)
        return out_keys, fused, out_ids, comps

    def _vectors(self, table_keys: np.ndarray, commits: list[int]) -> np.ndarray:
        dim = int(next(i["representations"]["dense"]["dim"] for i in self._infos))
        out = np.zeros((len(table_keys), dim), dtype=np.float32)
        shard, row = split_key(table_keys)
        owners = sorted(set(shard.tolist()))
        got = self._call("vectors", [(commits[s], row[shard == s]) for s in owners], owners)
        for s, v in zip(owners, got):
            out[shard == s] = v
        return out

    # -- documents and writes --------------------------------------------------------------------
    def get(self, ids: str | Sequence[str]) -> list[dict[str, Any] | None]:
        """Stored documents by id, from their owning shards (``None`` for unknown ids)."""
        if isinstance(ids, str):
            ids = [ids]
        if isinstance(ids, (bytes, Mapping)) or not isinstance(ids, Sequence):
            raise ConfigError(f"ids must be a string or a list of strings, got {type(ids).__name__}")
        for i in ids:
            if not isinstance(i, str):
                raise ConfigError(f"document ids are strings, got {i!r}")
        groups = split_by_shard(list(enumerate(ids)), len(self.actors), key=lambda p: p[1])
        touched = [s for s, g in enumerate(groups) if g]
        got = self._call("get", [([i for _, i in groups[s]],) for s in touched], touched)
        out: list[dict[str, Any] | None] = [None] * len(ids)
        for s, docs in zip(touched, got):
            for (pos, _), d in zip(groups[s], docs):
                out[pos] = d
        return out

    def add(self, documents: Iterable[Any]) -> dict[str, Any]:
        """Add new documents (ids already present anywhere: :class:`IndexExistsError`, nothing written)."""
        return self._write(documents, "add")

    def upsert(self, documents: Iterable[Any]) -> dict[str, Any]:
        """Add or replace documents by id, each in its owning shard."""
        return self._write(documents, "upsert")

    def _write(self, documents: Iterable[Any], mode: str) -> dict[str, Any]:
        from ..indexer import as_document
        from .encoding import encodings_table

        docs = [as_document(d, i) for i, d in enumerate(documents)]
        groups = split_by_shard(docs, len(self.actors), key=lambda d: d.id)
        touched = [s for s, g in enumerate(groups) if g]
        if mode == "add":
            present = self._call("contains", [([d.id for d in groups[s]],) for s in touched], touched)
            dup = [d.id for s, p in zip(touched, present) for d, there in zip(groups[s], p) if there]
            if dup:
                raise IndexExistsError(f"{len(dup)} documents are already in {self.root} (first {dup[0]!r}); use "
                                       "upsert to replace them; nothing was written")
        texts = list(dict.fromkeys(d.full_text for d in docs if d.full_text.strip()))
        table = encodings_table(texts, self._encoder.get().encode_documents(texts, show_progress=False)) if texts \
            else {}
        info = self._infos[0]
        shape = {"config": self.layout.encoder or info["encoder"], "representations": info["representations"]}
        args = [(groups[s], mode, shape, {d.full_text: table[d.full_text] for d in groups[s] if d.full_text in table})
                for s in touched]
        results = self._call("write", args, touched)
        self.refresh()
        return _sum_results(results, [self.names[s] for s in touched])

    def delete(self, ids: Iterable[str], *, missing: str = "error") -> dict[str, Any]:
        """Delete by id from the owning shards. ``missing="error"``: an unknown id anywhere refuses
        the whole call before any shard deletes anything."""
        if missing not in ("error", "ignore"):
            raise ConfigError(f"missing must be 'error' or 'ignore', got {missing!r}")
        ids = [ids] if isinstance(ids, str) else [str(i) for i in ids]
        groups = split_by_shard(list(dict.fromkeys(ids)), len(self.actors))
        touched = [s for s, g in enumerate(groups) if g]
        present = self._call("contains", [(groups[s],) for s in touched], touched)
        absent = [i for s, p in zip(touched, present) for i, there in zip(groups[s], p) if not there]
        if absent and missing == "error":
            raise DocumentNotFoundError(f"{len(absent)} of {len(ids)} ids are not in {self.root} (first "
                                        f"{absent[0]!r}); nothing was deleted", absent)
        results = self._call("delete", [(groups[s], "ignore") for s in touched], touched)
        self.refresh()
        return _sum_results(results, [self.names[s] for s in touched])

    def compact(self) -> dict[str, Any]:
        """Compact every shard (merge its segments, drop its deleted documents); re-encodes nothing."""
        results = self._call("compact", [() for _ in self.actors])
        self.refresh()
        return _sum_results(results, list(self.names))


def _sum_results(results: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"added": 0, "updated": 0, "unchanged": 0, "deleted": 0, "skipped_empty": 0, "encoded": 0,
                           "missing": [], "commits": {}}
    for name, r in zip(names, results):
        for key in ("added", "updated", "unchanged", "deleted", "skipped_empty"):
            out[key] += int(r.get(key, 0))
        out["missing"] += list(r.get("missing", []))
        out["commits"][name] = r.get("commit")
    return out
