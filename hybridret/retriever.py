"""HybridRetriever: encoders + dense index + sparse/BM25 index + fusion, with save/load."""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .data import Document, iter_batches
from .encoders import Encoder, PairedEncoder, encoder_from_config
from .errors import ConfigError, CorpusFormatError, IndexExistsError, IndexFormatError
from .hybrid import FusionConfig, fused_search
from .index.dense import DenseIndex
from .index.docstore import DocStore, DocStoreWriter
from .index.manifest import MANIFEST, commit, link_tree, new_generation, read_manifest
from .index.sparse import SparseIndex
from .types import Hit, Hits, MatchedTerm

__all__ = ["METHODS", "HybridRetriever"]

logger = logging.getLogger(__name__)

METHODS = ("hybrid", "dense", "sparse", "bm25", "linear", "rrf", "gqr")
FUSION_CHUNK = 256  # queries fused at a time


def _as_document(item: Any, row: int) -> Document:
    if isinstance(item, Document):
        return item
    if isinstance(item, str):
        return Document(id=str(row), text=item)
    if isinstance(item, Mapping):
        doc_id = item.get("_id", item.get("id"))
        text = item.get("text", item.get("contents"))
        if doc_id is None or text is None:
            raise CorpusFormatError(f"document #{row} needs an id ('_id' or 'id') and a 'text'", field="id")
        return Document(id=str(doc_id), text=str(text), title=str(item.get("title") or ""))
    if isinstance(item, tuple) and len(item) in (2, 3):
        return Document(id=str(item[0]), text=str(item[-1]), title=str(item[1]) if len(item) == 3 else "")
    raise CorpusFormatError(f"document #{row}: cannot index a {type(item).__name__}; pass Document, dict, (id, text) or str")


class HybridRetriever:
    """Index documents with a hybrid encoder and search them densely, sparsely, with BM25, or fused.

    >>> retriever = HybridRetriever.from_models()          # packaged MiniLM + SPLADE-tiny
    >>> retriever.index([{"id": "a", "text": "..."}, ...])
    >>> hits = retriever.search(["a question"], k=10)       # hybrid by default
    >>> retriever.save("indexes/mine"); HybridRetriever.load("indexes/mine")

    Settings: ``faiss_factory`` (any FAISS factory string, default exact ``"Flat"``),
    ``faiss_metric`` (``"ip"``/``"l2"``), ``sparse_scheme`` / ``sparse_bits`` / ``sparse_max_weight``
    (how learned weights become tantivy tokens: bit planes, or that many weight buckets; results stay
    exact whatever they are, only speed changes), ``bm25`` (index the text for BM25) and
    ``store_text`` (keep texts for hit views).
    """

    def __init__(
        self,
        encoder: Encoder | None = None,
        *,
        faiss_factory: str = "Flat",
        faiss_metric: str = "ip",
        sparse_scheme: str = "planes",
        sparse_bits: int = 6,
        sparse_max_weight: float = 5.0,
        bm25: bool = True,
        store_text: bool = True,
        device: str | None = None,
    ) -> None:
        self._encoder = encoder
        self._encoder_config = encoder.config() if encoder is not None else None
        self.device = device
        self.settings: dict[str, Any] = {
            "faiss_factory": faiss_factory, "faiss_metric": faiss_metric, "sparse_scheme": sparse_scheme,
            "sparse_bits": sparse_bits,
            "sparse_max_weight": sparse_max_weight, "bm25": bm25, "store_text": store_text,
        }
        self.dense: DenseIndex | None = None
        self.sparse: SparseIndex | None = None
        self.docs: DocStore | None = None
        self.manifest: dict[str, Any] = {}
        self._generation: Path | None = None
        self._text_terms_cache: dict[int, set[int]] = {}

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_models(cls, dense_model: str | None = None, sparse_model: str | None = None, *,
                    device: str | None = None, max_length: int = 256, **settings: Any) -> HybridRetriever:
        """A paired encoder from two model names (``None`` = packaged defaults), then an empty retriever."""
        encoder = PairedEncoder.from_names(dense_model, sparse_model, device=device, max_length=max_length)
        return cls(encoder, device=device, **settings)

    @property
    def encoder(self) -> Encoder:
        """The encoder; loaded on first use for a retriever read from disk."""
        if self._encoder is None:
            if self._encoder_config is None:
                raise ConfigError("this retriever has no encoder")
            self._encoder = encoder_from_config(self._encoder_config, device=self.device)
        return self._encoder

    @property
    def num_docs(self) -> int:
        return len(self.docs) if self.docs is not None else 0

    # -- indexing -------------------------------------------------------------------------------
    def index(self, documents: Iterable[Any], *, batch_size: int = 32, chunk_size: int = 1024,
              workdir: str | Path | None = None, show_progress: bool | None = None,
              total: int | None = None, encode_cache: str | Path | None = None) -> HybridRetriever:
        """Encode and index a stream of documents (``Document``, dict, ``(id, text)`` or str).

        Documents are processed ``chunk_size`` at a time, so memory holds one chunk plus the FAISS
        index. Files go to a new generation folder inside ``workdir`` (default: a temporary
        directory, removed with the retriever); :meth:`save` makes them permanent. Documents whose
        title and text are both blank are skipped and counted (``manifest["skipped_empty"]``).
        Duplicate ids raise :class:`CorpusFormatError`. ``total`` (the number of documents, if
        known and ``documents`` has no ``len``) gives the progress bar an ETA.

        ``encode_cache`` (a folder) keeps every encoded chunk on disk: after an interruption, the
        same call re-encodes only the chunks that are missing (see :class:`EncodingCache`). The
        chunks must be the same, so keep ``chunk_size`` and the document order.
        """
        from tqdm.auto import tqdm

        from .encoders._hf import progress_enabled

        if chunk_size < 1 or batch_size < 1:
            raise ConfigError("chunk_size and batch_size must be positive")
        encoder = self.encoder
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="hybridret-")
            weakref.finalize(self, shutil.rmtree, workdir, True)
        cache = None
        if encode_cache is not None:
            from .encoders.cache import EncodingCache

            cache = EncodingCache(encode_cache, encoder.config(), chunk_size)
        gen = new_generation(workdir)
        truncated_before = encoder.truncation_counts()
        s = self.settings
        docs_w = DocStoreWriter(gen, store_text=s["store_text"])
        dense_w = sparse_w = None
        bar = None
        try:
            if encoder.has_dense:
                dense_w = DenseIndex.create(gen / "dense", int(encoder.dense_dim or 0),
                                            factory=s["faiss_factory"], metric=s["faiss_metric"])
            if encoder.has_sparse or s["bm25"]:
                vocab = len(encoder.vocab) if encoder.vocab is not None else 1
                slots = {"bits" if s["sparse_scheme"] == "planes" else "buckets": s["sparse_bits"]}
                sparse_w = SparseIndex.create(gen / "sparse", vocab, scheme=s["sparse_scheme"], **slots,
                                              max_weight=s["sparse_max_weight"], bm25=s["bm25"])
            if total is None and hasattr(documents, "__len__"):
                total = len(documents)  # type: ignore[arg-type]
            bar = tqdm(total=total, desc="indexing", unit="doc",
                       disable=not progress_enabled(show_progress, total or chunk_size + 1, chunk_size))
            seen: set[str] = set()
            skipped = 0
            row = 0
            for chunk_no, chunk in enumerate(iter_batches(documents, chunk_size)):
                batch: list[Document] = []
                for item in chunk:
                    doc = _as_document(item, row + len(batch) + skipped)
                    if not doc.full_text.strip():
                        skipped += 1
                        continue
                    if doc.id in seen:
                        raise CorpusFormatError(f"duplicate document id {doc.id!r}", field="id")
                    if "\n" in doc.id or "\r" in doc.id or not doc.id.strip():
                        raise CorpusFormatError(f"invalid document id {doc.id!r} (blank or contains a newline)",
                                                field="id")
                    seen.add(doc.id)
                    batch.append(doc)
                if not batch:
                    bar.update(len(chunk))
                    continue
                texts = [d.full_text for d in batch]
                ids = [d.id for d in batch]
                enc = cache.get(chunk_no, ids) if cache is not None else None
                if enc is None:
                    enc = encoder.encode_documents(texts, batch_size=batch_size, show_progress=False)
                    if cache is not None:
                        cache.put(chunk_no, ids, enc)
                docs_w.add(ids, [d.title for d in batch], [d.text for d in batch])
                if dense_w is not None:
                    dense_w.add(enc.dense)
                if sparse_w is not None:
                    weights = enc.sparse if enc.sparse is not None else sp.csr_matrix((len(batch), 1), dtype=np.float32)
                    sparse_w.add(weights, texts)
                row += len(batch)
                bar.update(len(chunk))  # after the chunk is encoded and written, so the rate is honest
            bar.close()
            if row == 0:
                raise CorpusFormatError("no documents to index (the input was empty or every document was blank)")
            if skipped:
                logger.warning("skipped %d empty documents", skipped)
            for model, count in encoder.truncation_counts().items():
                if count > truncated_before.get(model, 0):
                    logger.info("%s: %d of %d documents were truncated to max_length tokens", model,
                                count - truncated_before.get(model, 0), row)
            docs_w.close()
            if dense_w is not None:
                logger.info("building FAISS index %s over %d vectors", s["faiss_factory"], row)
                dense_w.close()
            if sparse_w is not None:
                sparse_w.close()
        except BaseException:
            if bar is not None:
                bar.close()
            docs_w.abort()
            for w in (dense_w, sparse_w):
                if w is not None:
                    w.abort()
            shutil.rmtree(gen, ignore_errors=True)
            raise
        if cache is not None:
            logger.info("encoding cache %s: %d chunks reused, %d encoded (%.0f MB; remove it when done)",
                        cache.root, cache.hits, cache.misses, cache.nbytes() / 1e6)
        self.manifest = {"num_docs": row, "skipped_empty": skipped}
        self._open(gen, row)
        logger.info("indexed %d documents", row)
        return self

    def _open(self, gen: Path, num_docs: int) -> None:
        self._generation = gen
        self.docs = DocStore(gen, expected=num_docs)
        self.dense = DenseIndex(gen / "dense", device=self.device) if (gen / "dense").is_dir() else None
        self.sparse = SparseIndex(gen / "sparse") if (gen / "sparse").is_dir() else None
        for name, part in (("dense", self.dense), ("sparse", self.sparse)):
            if part is not None and part.num_docs != num_docs:
                raise IndexFormatError(f"{gen}: {name} index holds {part.num_docs} documents, expected {num_docs}")
        self._text_terms_cache.clear()

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the index to ``path``. The previous index there stays readable until the new one is
        complete (the manifest is replaced last, atomically). Returns ``path``."""
        if self._generation is None:
            raise ConfigError("nothing to save: call index() first")
        root = Path(path)
        if (root / MANIFEST).exists() and not overwrite:
            raise IndexExistsError(f"an index already exists at {root}; pass overwrite=True (CLI: --overwrite)")
        if not self._generation.is_dir():
            raise IndexFormatError(
                f"this retriever's files ({self._generation}) were removed when another save replaced that "
                "index; searching still works, but to save, load the index again or re-index"
            )
        if self._generation.parent.resolve() == root.resolve():
            gen = self._generation
        else:
            gen = new_generation(root)
            try:
                link_tree(self._generation, gen)
            except BaseException:
                shutil.rmtree(gen, ignore_errors=True)
                raise
        commit(root, gen, self._manifest_body(), overwrite=True)
        # keep reading from (and linking later saves from) our own files: another save into ``root``
        # may replace the copy just made
        return root

    def _manifest_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "num_docs": self.num_docs,
            "skipped_empty": int(self.manifest.get("skipped_empty", 0)),
            "encoder": self._encoder_config,
            "settings": dict(self.settings),
            "components": {},
        }
        if self.dense is not None:
            body["components"]["dense"] = dict(self.dense.meta)
        if self.sparse is not None:
            body["components"]["sparse"] = dict(self.sparse.meta)
        for key in ("fusion", "fusion_tuned_on", "source"):
            if key in self.manifest:
                body[key] = self.manifest[key]
        return body

    @classmethod
    def load(cls, path: str | Path, *, encoder: Encoder | None = None, device: str | None = None) -> HybridRetriever:
        """Open an index written by :meth:`save`; the encoder is rebuilt from the manifest on first use."""
        manifest, gen = read_manifest(path)
        settings = dict(manifest.get("settings", {}))
        known = {"faiss_factory", "faiss_metric", "sparse_scheme", "sparse_bits", "sparse_max_weight", "bm25",
                 "store_text"}
        self = cls(encoder, device=device, **{k: v for k, v in settings.items() if k in known})
        stored = manifest.get("encoder")
        if encoder is not None and stored is not None and encoder.config() != stored:
            logger.warning("the encoder given differs from the one the index was built with: %s", stored)
        if encoder is None:
            self._encoder_config = stored
        self.manifest = manifest
        num_docs = manifest.get("num_docs")
        if not isinstance(num_docs, int):
            raise IndexFormatError(f"{path}: manifest has no document count")
        self._open(gen, num_docs)
        return self

    def info(self) -> dict[str, Any]:
        """The manifest plus the size on disk."""
        out = dict(self._manifest_body())
        out.update({k: v for k, v in self.manifest.items() if k not in out})
        if self._generation is not None:
            out["bytes_on_disk"] = sum(f.stat().st_size for f in self._generation.rglob("*") if f.is_file())
        return out

    # -- search ---------------------------------------------------------------------------------
    def _encode_queries(self, texts: list[str], dense: bool, sparse: bool) -> tuple[np.ndarray | None, sp.csr_matrix | None]:
        enc = self.encoder
        if isinstance(enc, PairedEncoder):
            qd = enc.dense.encode_queries(texts).dense if dense else None
            qs = enc.sparse.encode_queries(texts).sparse if sparse else None
            return qd, qs
        batch = enc.encode_queries(texts)
        return (batch.dense if dense else None), (batch.sparse if sparse else None)

    def _require(self, dense: bool, sparse: bool, bm25: bool) -> None:
        if self.docs is None:
            raise ConfigError("the retriever has no index yet: call index() or load()")
        if dense and self.dense is None:
            raise ConfigError("this index has no dense component")
        if sparse and (self.sparse is None or not self.encoder.has_sparse):
            raise ConfigError("this index has no learned-sparse component")
        if bm25 and (self.sparse is None or not self.sparse.meta.get("bm25")):
            raise ConfigError("this index was built without BM25 text")

    def fusion_config(self, method: str = "hybrid", fusion: FusionConfig | Mapping[str, Any] | None = None) -> FusionConfig:
        """The fusion settings ``search`` uses for a method: explicit ``fusion`` first, then what
        ``hybridret tune`` stored in the index (for ``hybrid``, or for the method it tuned), then
        defaults (``hybrid`` = GQR guided by learned sparse + BM25, the best fixed setting measured
        in docs/fusion.md)."""
        stored = self.manifest.get("fusion")
        if fusion is not None:
            cfg = fusion if isinstance(fusion, FusionConfig) else FusionConfig.from_dict(fusion)
            return cfg if method == "hybrid" else cfg.with_(method=method)
        if stored:
            cfg = FusionConfig.from_dict(stored)
            if method in ("hybrid", cfg.method):
                return cfg
        # measured best fixed setting across the shared collections (docs/fusion.md): GQR with a
        # learned-sparse + BM25 guide; defaults drop whatever this index lacks
        cfg = FusionConfig(method="gqr" if method == "hybrid" else method)
        have = {"dense": self.dense is not None,
                "sparse": self.sparse is not None and self._encoder_has_sparse(),
                "bm25": self.sparse is not None and bool(self.sparse.meta.get("bm25"))}
        guide = {r: w for r, w in cfg.guide.items() if have[r]}
        retrievers = tuple(r for r in ("dense", "sparse", "bm25") if have[r])[:max(2, len(cfg.retrievers))]
        if cfg.method == "gqr" and guide and guide != dict(cfg.guide):
            cfg = cfg.with_(guide=guide)
        elif cfg.method == "gqr" and not guide:
            cfg = FusionConfig(method="linear", retrievers=retrievers)
        elif cfg.method != "gqr" and retrievers != cfg.retrievers:
            cfg = cfg.with_(retrievers=retrievers)
        return cfg

    def _encoder_has_sparse(self) -> bool:
        if self._encoder is not None:
            return self._encoder.has_sparse
        cfg = self._encoder_config or {}
        return cfg.get("type") in ("paired", "splade", "joint")

    def search(self, queries: str | Sequence[str], k: int = 10, *, method: str = "hybrid",
               fusion: FusionConfig | Mapping[str, Any] | None = None, candidates: int | None = None) -> Hits:
        """Search. ``method``: ``"hybrid"`` (default: the index's tuned fusion, else GQR: the dense
        query refined towards the learned-sparse + BM25 scores of the candidates), ``"dense"``,
        ``"sparse"``, ``"bm25"``, or a fusion method ``"linear"``, ``"rrf"``, ``"gqr"`` (see
        :class:`FusionConfig`). ``candidates`` overrides the per-retriever depth of the candidate
        union. Returns :class:`Hits` of shape ``(len(queries), k)``."""
        texts = [queries] if isinstance(queries, str) else [str(q) for q in queries]
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        cfg = None
        if method in ("dense", "sparse", "bm25"):
            used = {method}
        else:
            cfg = self.fusion_config(method, fusion)
            if candidates is not None:
                cfg = cfg.with_(depth=candidates)
            used = set(cfg.union_retrievers)
        self._require("dense" in used, "sparse" in used, "bm25" in used)
        if not texts:
            empty = np.zeros((0, k), dtype=np.int64)
            return Hits(queries=[], method=method, ids=empty.astype(object), rows=empty,
                        scores=empty.astype(np.float32), _viewer=self._view)
        qd, qs = self._encode_queries(texts, "dense" in used, "sparse" in used) if used - {"bm25"} else (None, None)
        comps: dict[str, np.ndarray] = {}
        if method == "dense":
            rows, scores = self.dense.search(qd, k)  # type: ignore[union-attr]
            comps["dense"] = scores
        elif method == "sparse":
            rows, scores = self.sparse.search(qs, k)  # type: ignore[union-attr]
            comps["sparse"] = scores
        elif method == "bm25":
            rows, scores = self.sparse.search_bm25(texts, k)  # type: ignore[union-attr]
            comps["bm25"] = scores
        else:  # in slices, so GQR's (queries, candidates, dim) block stays small
            parts = [fused_search(cfg, k, texts=texts[a:a + FUSION_CHUNK],  # type: ignore[arg-type]
                                  qd=None if qd is None else qd[a:a + FUSION_CHUNK],
                                  qs=None if qs is None else qs[a:a + FUSION_CHUNK],
                                  dense=self.dense, sparse=self.sparse)
                     for a in range(0, len(texts), FUSION_CHUNK)]
            rows = np.concatenate([p[0] for p in parts])
            scores = np.concatenate([p[1] for p in parts])
            comps = {name: np.concatenate([p[2][name] for p in parts]) for name in parts[0][2]}
        ids = np.where(rows >= 0, self.docs.ids[np.maximum(rows, 0)], "")  # type: ignore[union-attr]
        label = method if cfg is None or method != "hybrid" else f"hybrid:{cfg.method}"
        return Hits(queries=texts, method=label, ids=ids.astype(object), rows=rows,
                    scores=scores.astype(np.float32), components=comps, query_sparse=qs, _viewer=self._view)

    # -- per-hit view ---------------------------------------------------------------------------
    def _view(self, hits: Hits, i: int) -> list[Hit]:
        out: list[Hit] = []
        docs = self.docs
        if docs is None:
            raise ConfigError("the retriever has no index")
        for j, row in enumerate(hits.rows[i]):
            if row < 0:
                continue
            title, text = docs.get(int(row))
            matched: list[MatchedTerm] = []
            if hits.query_sparse is not None and self.sparse is not None:
                matched = self._matched_terms(hits.query_sparse[i], int(row), (title + " " + text).strip())
            out.append(Hit(id=str(hits.ids[i, j]), rank=j + 1, score=float(hits.scores[i, j]),
                           scores={name: float(v[i, j]) for name, v in hits.components.items()},
                           title=title, text=text, matched_terms=matched))
        return out

    def _matched_terms(self, q: sp.csr_matrix, row: int, text: str) -> list[MatchedTerm]:
        if self.sparse is None:
            return []
        d = self.sparse.forward[row]
        shared, qi, di = np.intersect1d(q.indices, d.indices, assume_unique=True, return_indices=True)
        if not len(shared):
            return []
        if row not in self._text_terms_cache:
            if len(self._text_terms_cache) > 4096:
                self._text_terms_cache.clear()
            self._text_terms_cache[row] = self.encoder.text_term_ids(text) if text else set()
        literal = self._text_terms_cache[row]
        vocab = self.encoder.vocab or []
        terms = [MatchedTerm(term=vocab[t], query_weight=float(q.data[a]), doc_weight=float(d.data[b]),
                             expansion=int(t) not in literal) for t, a, b in zip(shared, qi, di)]
        terms.sort(key=lambda m: -m.contribution)
        return terms

