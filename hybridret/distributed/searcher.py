"""ShardedSearcher: one search over many shard actors, equal to a single index over the same corpus.

A query batch is planned and run exactly as on a single index (:func:`hybridret.search.plan.plan_search`,
:func:`hybridret.search.run.run_plan`): encoded **once**, here, then searched through a
:class:`~hybridret.distributed.source.ShardedSource` against one pinned set of shard commits:
collection statistics (of every retriever that declares them, BM25's among them) summed over the
shards, each retriever's global top lists merged from the shards' exact scores, and fusion run
once, on the global candidate set. Nothing is normalised per shard.

Writes route each document to its owning shard (:func:`~hybridret.distributed.layout.shard_of`)
and return once every touched shard committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..encoders import Encoder, compare_configs
from ..errors import ConfigError, DocumentNotFoundError, IndexExistsError, IndexFormatError
from ..fusion.config import FusionConfig
from ..retrievers import REGISTRY, QueryBatch
from ..search.plan import default_fusion, plan_search, runnable
from ..search.request import SearchRequest
from ..search.rerank import Reranker, load_reranker
from ..search.run import hits_of, run_plan
from ..search.searcher import EncoderSlot, encode_query_batch
from ..search.snippets import WordMatcher, hit_snippets, matched_view
from ..types import Hit, Hits, MatchedTerm
from .layout import ShardLayout, read_layout, split_by_shard
from .merge import split_key
from .pool import ShardPool, ray_module
from .shard import ShardStaleError, shard_actor_class
from .source import ShardedSource

__all__ = ["ShardedSearcher"]

logger = logging.getLogger(__name__)


class ShardedHitSource:
    """Hit views of a sharded search: texts, metadata and matched terms from the owning shards,
    at the commits the search ran on."""

    def __init__(self, searcher: ShardedSearcher, commits: list[int]) -> None:
        self.searcher, self.commits = searcher, commits
        self.matcher = WordMatcher()

    def view(self, hits: Hits, i: int, *, details: bool = True) -> list[Hit]:
        """Query ``i``'s hits; ``details=False`` leaves out matched terms and snippets."""
        keys = hits.rows[i]
        shard, row = split_key(keys)
        docs: dict[int, dict[str, Any]] = {}
        for s in sorted(set(shard[shard >= 0].tolist())):
            mine = [int(r) for r in row[shard == s]]
            got = self.searcher.pool.call_one(s, "docs", self.commits[s], mine)
            docs.update({int(k): d for k, d in zip(keys[shard == s], got)})
        enc = None
        out: list[Hit] = []
        matcher = self.matcher
        for j, key in enumerate(keys):
            if key < 0:
                continue
            d = docs[int(key)]
            matched: list[MatchedTerm] = []
            if details and hits.query_sparse is not None and d["sparse"] is not None:
                enc = enc or self.searcher._encoder.get()
                matched = matched_view(enc, hits.query_sparse[i], *d["sparse"],
                                       (d["title"] + " " + d["text"]).strip(), matcher)
            out.append(Hit(id=d["id"], rank=j + 1, score=float(hits.scores[i, j]),
                           scores={n: float(v[i, j]) for n, v in hits.components.items()}, title=d["title"],
                           text=d["text"], matched_terms=matched, metadata=d["metadata"],
                           snippets=hit_snippets(hits.queries[i], d["text"], matched, matcher) if details else []))
        return out


class ShardedSearcher:
    """Search (and write to) a sharded index through one Ray actor per shard.

    >>> searcher = ShardedSearcher.open("indexes/sharded")          # local Ray, or address="ray://..."
    >>> hits = searcher.search("a question", k=10, method="rrf", filter={"lang": "en"})
    """

    def __init__(self, layout: ShardLayout, actors: list[Any], *, encoder: Encoder | None = None,
                 device: str | None = None, timeout: float | None = 120.0, owns_actors: bool = True) -> None:
        self.layout = layout
        self.root = layout.root
        self.names = layout.names
        self.pool = ShardPool(layout.root, layout.names, actors, timeout)
        self._owns = owns_actors
        self._encoder = EncoderSlot(encoder, layout.encoder, device)
        self._rerankers: dict[str, Reranker] = {}  # cross-encoder folder -> its loaded model
        infos = self.pool.call_all("info")
        for info in infos:
            diffs = compare_configs(layout.encoder, info["encoder"]) if layout.encoder else []
            if diffs:
                raise IndexFormatError(f"{info['name']} of {self.root} was built by another encoder than the "
                                       f"layout names: {'; '.join(diffs)}")
        self._infos = infos
        self._commits = [int(i["commit"]) for i in infos]

    @classmethod
    def open(cls, root: str | Path, *, address: str | None = None, encoder: Encoder | None = None,
             device: str | None = None, num_cpus: float = 0.25, num_gpus: float = 0.0, max_restarts: int = 3,
             max_task_retries: int = 3, timeout: float | None = 120.0) -> ShardedSearcher:
        """Start one actor per shard of the sharded index at ``root`` (every node must see ``root``
        at the same path: a shared filesystem) and connect them. Ray is initialised here when it is
        not yet (``address``: an existing cluster; ``None``: a local one). A shard actor that dies
        is restarted from its directory up to ``max_restarts`` times; calls in flight are retried.
        Retrievers added with :func:`hybridret.retrievers.register` in this process are registered
        in every shard actor too (they travel pickled, so their classes must be importable there)."""
        from ..retrievers import registered

        ray = ray_module()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        layout = read_layout(root)
        actor_cls = shard_actor_class()
        actors = [actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                                    max_task_retries=max_task_retries).remote(
                      str(layout.shard_dir(i).resolve()), name, device, registered())
                  for i, name in enumerate(layout.names)]
        return cls(layout, actors, encoder=encoder, device=device, timeout=timeout)

    # -- state ----------------------------------------------------------------------------------
    @property
    def actors(self) -> list[Any]:
        """The shard actors (``actors[i]`` serves shard ``names[i]``)."""
        return self.pool.actors

    @property
    def timeout(self) -> float | None:
        return self.pool.timeout

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
        return int(sum(i["num_docs"] for i in self.pool.call_all("info")))

    def refresh(self) -> bool:
        """Have every shard open its newest commit, then pin that set in one assignment."""
        commits = [int(c) for c in self.pool.call_all("refresh")]
        changed = commits != self._commits
        self._infos = self.pool.call_all("info")
        self._commits = commits
        return changed

    def available(self) -> dict[str, bool]:
        """Which retrievers every shard (and the encoder) can run."""
        live = [i for i in self._infos if i.get("segments", 1) > 0] or self._infos  # an emptied shard has no parts
        return runnable({name: all(i["available"].get(name, False) for i in live) for name in REGISTRY},
                        self._encoder.has)

    def fusion_config(self, method: str = "hybrid", fusion: FusionConfig | Mapping[str, Any] | None = None
                      ) -> FusionConfig | None:
        """The same defaults as :meth:`Searcher.fusion_config` (:func:`hybridret.search.plan.default_fusion`),
        over the shards' common components."""
        return default_fusion(method, fusion, available=self.available(), stored=self._stored_fusion())

    def _stored_fusion(self) -> Mapping[str, Any] | None:
        return self.layout.fusion or self._infos[0].get("fusion")

    def encode_queries(self, texts: list[str], needs: set[str]) -> QueryBatch:
        return encode_query_batch(self._encoder, texts, needs)

    def close(self) -> None:
        """Stop the shard actors this searcher started."""
        if self._owns:
            self.pool.close()

    # -- search ---------------------------------------------------------------------------------
    def search(self, queries: str | Sequence[str] | SearchRequest, k: int | None = None, *, partial: bool = False,
               **options: Any) -> Hits:
        """As :meth:`hybridret.search.searcher.Searcher.search` (the options of a
        :class:`~hybridret.search.request.SearchRequest`), over every shard (``offset``, grouping,
        reranking and ``diversify`` included: the same plan and stages; MMR reads the candidates' dense
        vectors from their owning shards). A shard that cannot answer raises
        :class:`ShardUnavailableError` naming it; with ``partial=True`` the others' results are
        returned and ``hits.missing_shards`` names the missing ones (always set). ``relevance=True``
        and ``threads`` are not supported here (a :class:`ConfigError`): search a single index for the
        first; each shard actor has its own CPUs (``num_cpus``) instead of the second."""
        req = SearchRequest.of(queries, k, **options)
        if req.relevance is not False:
            raise ConfigError("relevance=True is not supported on a sharded index yet (the BM25 bound needs the "
                              "shards' summed statistics per query token); search an unsharded index for it")
        if req.threads is not None:
            raise ConfigError("threads is not supported on a sharded index: each shard actor has its own CPUs "
                              "(ShardedSearcher.open(num_cpus=...))")
        if not isinstance(partial, bool):
            raise ConfigError(f"partial must be true or false, got {partial!r}")
        reranker = self.reranker(req.rerank) if req.rerank is not None else None
        try:
            return self._search(req, partial, reranker)
        except ShardStaleError:  # a shard restarted on a newer commit: pin the current set, once
            logger.info("a shard of %s moved to another commit; refreshing and retrying", self.root)
            self.refresh()
            return self._search(req, partial, reranker)

    def reranker(self, rerank: Any) -> Reranker:
        """``rerank`` as a :class:`~hybridret.search.rerank.Reranker` (a cross-encoder folder: loaded once,
        here on the coordinator, on the encoders' device)."""
        if isinstance(rerank, Reranker):
            return rerank
        return load_reranker(rerank, device=self._encoder.device, cache=self._rerankers)

    def _search(self, req: SearchRequest, partial: bool, reranker: Reranker | None) -> Hits:
        commits = list(self._commits)  # one consistent set of shard snapshots for the whole call
        live = sum(int(i.get("num_docs", 0)) for i in self._infos)  # at those commits: bounds k and depths
        plan = plan_search(req, available=self.available(), stored_fusion=self._stored_fusion(),
                           where="this sharded index", num_docs=live, rerank=reranker)
        source = ShardedSource(self.pool, commits, self._infos, partial=partial)
        hits = hits_of(plan, run_plan(plan, source, self.encode_queries), ShardedHitSource(self, commits))
        hits.missing_shards = sorted(source.missing)  # type: ignore[attr-defined]
        return hits

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
        got = self.pool.call("get", [([i for _, i in groups[s]],) for s in touched], touched)
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
            present = self.pool.call("contains", [([d.id for d in groups[s]],) for s in touched], touched)
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
        results = self.pool.call("write", args, touched)
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
        present = self.pool.call("contains", [(groups[s],) for s in touched], touched)
        absent = [i for s, p in zip(touched, present) for i, there in zip(groups[s], p) if not there]
        if absent and missing == "error":
            raise DocumentNotFoundError(f"{len(absent)} of {len(ids)} ids are not in {self.root} (first "
                                        f"{absent[0]!r}); nothing was deleted", absent)
        results = self.pool.call("delete", [(groups[s], "ignore") for s in touched], touched)
        self.refresh()
        return _sum_results(results, [self.names[s] for s in touched])

    def compact(self) -> dict[str, Any]:
        """Compact every shard (merge its segments, drop its deleted documents); re-encodes nothing."""
        results = self.pool.call("compact", [() for _ in self.actors])
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
