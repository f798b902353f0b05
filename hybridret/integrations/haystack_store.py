"""Haystack: a ``DocumentStore`` over a living hybridret index, in this process or behind ``hybridret serve``.

>>> from haystack import Document
>>> from hybridret.integrations.haystack_store import HybridRetDocumentStore
>>> store = HybridRetDocumentStore("indexes/kb")        # built there on the first write; or a server URL
>>> store.write_documents([Document(content="Octopuses have three hearts.", meta={"kind": "animal"})])
>>> store.filter_documents({"field": "meta.kind", "operator": "==", "value": "animal"})

Haystack's protocol (``count_documents``, ``filter_documents``, ``write_documents`` with a
:class:`DuplicatePolicy`, ``delete_documents``, ``to_dict``/``from_dict``) plus what Haystack's
extended stores have (``delete_all_documents``, ``delete_by_filter``, ``update_by_filter``,
``count_documents_by_filter``, and an ``_async`` twin of each). Search it with
``HybridRetHaystackRetriever(document_store=store)``.

hybridret encodes documents with its own models, so what Haystack computes elsewhere is not stored:

* ``Document.embedding`` / ``sparse_embedding``: refused (:class:`~hybridret.errors.ConfigError`), since
  an embedder in front of this store is wasted work; ``embeddings="ignore"`` drops them instead;
* ``Document.blob``: refused (hybridret stores text; convert it first); a document without text is refused;
* ``Document.score`` (a query's, not the document's): not stored;
* ``meta``: hybridret's metadata rules (keys without ``.`` or a leading ``$``, JSON values);
  a top-level list holding objects or lists (e.g. the ``_split_overlap`` of Haystack's
  ``DocumentSplitter``) is kept as JSON and given back as it was, but cannot be filtered on.
  ``meta[title_field]`` (``"title"``), when a string, is also indexed as the document's title.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, CorpusFormatError, IndexExistsError
from ..types import Hit
from ._common import FIRST_BUILD as _FIRST_BUILD
from ._common import as_backend, finite_scores, require

require("haystack", "haystack", "Haystack")

from haystack import Document, default_from_dict, default_to_dict  # noqa: E402
from haystack.document_stores.errors import DuplicateDocumentError  # noqa: E402
from haystack.document_stores.types import DuplicatePolicy  # noqa: E402
from haystack.utils import Secret  # noqa: E402

from .haystack_filters import haystack_filter_to_hybridret  # noqa: E402

__all__ = ["HaystackDuplicateError", "HybridRetDocumentStore"]

logger = logging.getLogger(__name__)

PACKED = "_haystack_json"  # metadata key: top-level values hybridret metadata cannot hold, as JSON
_EVERYTHING = {"$or": [{PACKED: {"$exists": True}}, {PACKED: {"$exists": False}}]}  # matches every document
_CLIENT_BATCH = 1000  # documents per request to a server (its limit is 10 000 and 16 MiB)
_EMBEDDINGS = ("refuse", "ignore")


class HaystackDuplicateError(IndexExistsError, DuplicateDocumentError):
    """A document id is already in the store (``DuplicatePolicy.FAIL``/``NONE``): catchable as
    Haystack's ``DuplicateDocumentError`` or hybridret's ``IndexExistsError``; ``ids`` lists them."""

    def __init__(self, message: str, ids: list[str]) -> None:
        super().__init__(message)
        self.ids = ids


def _is_url(where: Any) -> bool:
    return isinstance(where, str) and where.startswith(("http://", "https://"))


class HybridRetDocumentStore:
    """A Haystack ``DocumentStore`` backed by a hybridret index.

    ``index``: an index directory (opened as a :class:`~hybridret.HybridRetriever`; an empty or
    missing one is built there, with the packaged models, on the first write), a ``hybridret serve``
    URL (``http://...``; ``api_key`` is the server's key, by default read from the environment
    variable ``HYBRIDRET_API_KEY`` when set), a :class:`~hybridret.HybridRetriever` or a
    :class:`~hybridret.client.Client`; ``None``: a new index in a temporary directory (an
    ``InMemoryDocumentStore`` of sorts; it cannot be serialised). ``encoder``: the models of an
    index built by this store (default: the packaged MiniLM + SPLADE pair). ``embeddings``:
    ``"refuse"`` documents carrying Haystack embeddings, or ``"ignore"`` the embeddings.
    ``title_field``: the meta key indexed as the title too (``None``: none).

    Writes are committed when they return; with a server, a write of more than 1000 documents is
    sent (and committed) 1000 at a time.
    """

    def __init__(self, index: Any = None, *, api_key: Secret | None = Secret.from_env_var("HYBRIDRET_API_KEY",
                                                                                             strict=False),
                 embeddings: str = "refuse", title_field: str | None = "title", encoder: Any = None) -> None:
        if embeddings not in _EMBEDDINGS:
            raise ConfigError(f"embeddings must be 'refuse' or 'ignore', got {embeddings!r}")
        if title_field is not None and (not isinstance(title_field, str) or not title_field):
            raise ConfigError(f"title_field must be a meta key (a non-empty string) or None, got {title_field!r}")
        if api_key is not None and not isinstance(api_key, Secret):
            raise ConfigError("api_key must be a haystack.utils.Secret, e.g. Secret.from_env_var('HYBRIDRET_API_KEY'), "
                              f"got {type(api_key).__name__}")
        self.api_key, self.embeddings, self.title_field = api_key, embeddings, title_field
        self._where: str | None = None  # where to_dict says the index is (None: a temporary directory)
        self._build_at: Path | None = None  # an index directory to build on the first write
        self._owned = False  # a Client this store opened (closed by close())
        self._encoder = encoder
        self._server_checked = False  # whether a served index was checked for chunking (see _write)
        if index is None or isinstance(index, (str, Path)):
            self.backend = self._open(index)
        else:
            self.backend = as_backend(index, writable=True)

    def _open(self, where: str | Path | None) -> Any:
        from ..retriever import HybridRetriever

        if _is_url(where):
            from ..client import Client

            self._where, self._owned = str(where), True
            key = self.api_key.resolve_value() if self.api_key is not None else None
            return Client(str(where), api_key=key)
        if where is not None:
            from ..index.manifest import MANIFEST
            from ..serve.backends import is_sharded

            root = Path(where)
            self._where = str(where)
            if is_sharded(root):
                raise ConfigError(f"{root} is a sharded index: serve it (hybridret serve {root} --ray) and give the "
                                  "store the server's URL")
            if (root / MANIFEST).is_file():
                return HybridRetriever.load(root, encoder=self._encoder)
            if root.exists() and (not root.is_dir() or any(root.iterdir())):
                raise ConfigError(f"{root} is neither an index (no {MANIFEST}) nor an empty directory; give the store "
                                  "an index directory, a new path, or a server URL")
            self._build_at = root
        return self._new_retriever()

    def _new_retriever(self) -> Any:
        from ..retriever import HybridRetriever

        if self._encoder is not None:
            return HybridRetriever(self._encoder)
        return HybridRetriever.from_models()

    def _location(self) -> str | None:
        url = getattr(self.backend, "url", None)
        if isinstance(url, str):
            return url
        path = getattr(self.backend, "path", None)
        return str(path) if path is not None else None

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The index directory or server URL, the API key's environment variable (never a key) and
        the settings; :meth:`from_dict` (and ``Pipeline.loads``) reopen it."""
        where = self._where if self._where is not None else self._location()
        if where is None or _temporary(where):
            raise ConfigError("cannot serialise this store: its index lives in a temporary directory (or is not "
                              "written yet); give HybridRetDocumentStore an index directory or a server URL")
        return default_to_dict(self, index=where, api_key=self.api_key, embeddings=self.embeddings,
                               title_field=self.title_field)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridRetDocumentStore:
        init = dict(data.get("init_parameters", {}))
        where = init.get("index")
        if isinstance(where, dict):  # {"index": path} / {"url": url}, as the retriever writes them
            init["index"] = where.get("url") or where.get("index")
        return default_from_dict(cls, {**data, "init_parameters": init})

    def close(self) -> None:
        """Close the server connection this store opened (a Client given to it stays open)."""
        if self._owned:
            self.backend.close()

    # -- reads ----------------------------------------------------------------------------------
    def _unbuilt(self) -> bool:
        """A store whose index has not been written yet (in this process)."""
        return getattr(self.backend, "path", "") is None

    def count_documents(self) -> int:
        """How many documents the store holds (expired ones not counted)."""
        return 0 if self._unbuilt() else int(self.backend.count())

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """Every document matching ``filters`` (Haystack's syntax, or hybridret's own; ``None``/``{}``:
        all), in the order written (a replaced document moves to the end). Filters apply to ``meta``
        only; an operator or value hybridret cannot compare raises ``FilterError`` (see
        :func:`~hybridret.integrations.haystack_filters.haystack_filter_to_hybridret`)."""
        flt = haystack_filter_to_hybridret(filters)
        if self._unbuilt():
            return []
        return [self._to_haystack(d) for d in self.backend.documents(flt)]

    def count_documents_by_filter(self, filters: dict[str, Any]) -> int:
        """How many documents match ``filters`` (counted on the metadata columns; no text is read)."""
        flt = haystack_filter_to_hybridret(filters)
        return 0 if self._unbuilt() else int(self.backend.count(flt))

    # -- writes ---------------------------------------------------------------------------------
    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        """Write ``documents``; returns how many were written. ``policy``: ``NONE`` (= ``FAIL``) and
        ``FAIL`` raise :class:`HaystackDuplicateError` naming the ids already stored and write
        nothing; ``SKIP`` leaves those as they are; ``OVERWRITE`` replaces them (a document whose
        text is unchanged is not encoded again). Within one call a repeated id counts as a
        duplicate (``SKIP``: the first is written; ``OVERWRITE``: the last)."""
        policy = _policy(policy)
        docs = self._check_documents(documents)
        if policy == DuplicatePolicy.NONE:
            policy = DuplicatePolicy.FAIL
        unique: dict[str, dict[str, Any]] = {}
        repeated: list[str] = []
        for d in docs:
            if d["id"] in unique:
                repeated.append(d["id"])
                if policy == DuplicatePolicy.OVERWRITE:
                    del unique[d["id"]]  # the last one wins, at its own position
                    unique[d["id"]] = d
                continue
            unique[d["id"]] = d
        if repeated and policy == DuplicatePolicy.FAIL:
            raise HaystackDuplicateError(f"{len(repeated)} document id(s) appear more than once in this write: "
                                         f"{_shown(repeated)}; nothing was written", repeated)
        batch = list(unique.values())
        if not batch:
            return 0
        if policy == DuplicatePolicy.OVERWRITE:
            self._write(batch, upsert=True)
            return len(docs)  # Haystack: OVERWRITE reports every document given
        stored = self._existing([d["id"] for d in batch])
        if stored and policy == DuplicatePolicy.FAIL:
            raise HaystackDuplicateError(f"{len(stored)} document(s) are already in the store: {_shown(stored)}; "
                                         "nothing was written (DuplicatePolicy.OVERWRITE replaces them, SKIP keeps "
                                         "them)", stored)
        if stored:
            logger.info("skipping %d document(s) already in the store: %s", len(stored), _shown(stored))
        known = set(stored)
        fresh = [d for d in batch if d["id"] not in known]
        if fresh:
            try:
                self._write(fresh, upsert=False)
            except IndexExistsError as exc:  # written by someone else since we looked
                raise HaystackDuplicateError(f"{exc} (written by another writer meanwhile)", []) from None
        return len(fresh)

    def delete_documents(self, document_ids: list[str]) -> None:
        """Delete the documents with these ids; ids not in the store are ignored (as Haystack's
        stores do). One commit. An id also deletes hybridret chunks of it (``ID#0``, ... with
        ``meta["parent_id"] == ID``)."""
        ids = _check_ids(document_ids)
        if ids and not self._unbuilt():
            for part in _batches(ids, 10_000):
                self.backend.delete(part, missing="ignore")

    def delete_all_documents(self) -> None:
        """Delete every document (one commit; the index stays, and so do its settings and models)."""
        if not self._unbuilt() and self.backend.count():
            self.backend.delete(filter=_EVERYTHING)

    def delete_by_filter(self, filters: dict[str, Any]) -> int:
        """Delete every document matching ``filters`` in one commit; returns how many."""
        flt = self._required(filters, "delete_by_filter", "delete_all_documents() deletes every document")
        if self._unbuilt():
            return 0
        return _count(self.backend.delete(filter=flt), "deleted")

    def update_by_filter(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        """Merge ``meta`` into the meta of every document matching ``filters``; returns how many.
        The texts are unchanged, so nothing is encoded again (unless ``meta`` changes the title)."""
        flt = self._required(filters, "update_by_filter", "give a filter that matches what to update")
        if not isinstance(meta, Mapping) or not meta:
            raise ConfigError(f"meta must be a non-empty dict of the fields to set, got {meta!r}")
        if self._unbuilt():
            return 0
        docs = [self._to_haystack(d) for d in self.backend.documents(flt)]
        for doc in docs:
            doc.meta.update(meta)
        if docs:
            encoded = self._write(self._check_documents(docs), upsert=True)
            logger.info("update_by_filter: %d document(s) updated, %d encoded again", len(docs), encoded)
        return len(docs)

    # -- async twins ----------------------------------------------------------------------------
    async def count_documents_async(self) -> int:
        return await asyncio.to_thread(self.count_documents)

    async def filter_documents_async(self, filters: dict[str, Any] | None = None) -> list[Document]:
        return await asyncio.to_thread(self.filter_documents, filters)

    async def count_documents_by_filter_async(self, filters: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.count_documents_by_filter, filters)

    async def write_documents_async(self, documents: list[Document],
                                    policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        return await asyncio.to_thread(self.write_documents, documents, policy)

    async def delete_documents_async(self, document_ids: list[str]) -> None:
        await asyncio.to_thread(self.delete_documents, document_ids)

    async def delete_all_documents_async(self) -> None:
        await asyncio.to_thread(self.delete_all_documents)

    async def delete_by_filter_async(self, filters: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.delete_by_filter, filters)

    async def update_by_filter_async(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.update_by_filter, filters, meta)

    # -- plumbing -------------------------------------------------------------------------------
    @staticmethod
    def _required(filters: Any, what: str, instead: str) -> dict[str, Any]:
        flt = haystack_filter_to_hybridret(filters)
        if flt is None:
            raise ConfigError(f"{what} needs a filter, got {filters!r}; {instead}")
        return flt

    def _existing(self, ids: list[str]) -> list[str]:
        if self._unbuilt():
            return []
        found: list[str] = []
        for part in _batches(ids, 1000):  # ids travel in a URL through a server
            found += [i for i, d in zip(part, self.backend.get(part)) if d is not None]
        return found

    def _write(self, docs: list[dict[str, Any]], *, upsert: bool) -> int:
        """Add or upsert hybridret documents (committed on return); how many were encoded."""
        backend = self.backend
        with _FIRST_BUILD:  # two first writes at once: one builds, the other then writes into it
            if self._unbuilt():  # the first write builds the index (in its directory, if one was given)
                workdir = self._build_at
                backend.index(docs, workdir=workdir, show_progress=False)
                if workdir is not None:
                    self._build_at = None
                return len(docs)
        if hasattr(backend, "searcher") and hasattr(backend, "index"):  # a HybridRetriever: documents stay whole
            return _count((backend.upsert if upsert else backend.add)(docs, show_progress=False, chunk_tokens=0),
                          "encoded")
        self._check_server_chunking()
        return sum(_count((backend.upsert if upsert else backend.add)(part), "encoded")
                   for part in _batches(docs, _CLIENT_BATCH))

    def _check_server_chunking(self) -> None:
        """A served index that cuts documents into chunks would store a Haystack document as several;
        refuse it (once per store) rather than break count and filter semantics."""
        if self._server_checked:
            return
        chunking = (self.backend.info() or {}).get("chunking")
        if chunking:
            raise ConfigError(f"the index served at {self.backend.url} cuts documents into chunks ({chunking}); a "
                              "Haystack document store keeps each document whole (split them with Haystack's "
                              "DocumentSplitter): serve an index built without chunk_tokens")
        self._server_checked = True

    def _check_documents(self, documents: Any) -> list[dict[str, Any]]:
        """Haystack Documents as hybridret's ``{"id", "text", "title", "metadata"}``, or an error
        naming the document and what hybridret cannot store."""
        if isinstance(documents, (str, bytes, Mapping, Document)) or not isinstance(documents, Sequence):
            raise CorpusFormatError(f"write_documents takes a list of haystack Documents, got {type(documents).__name__}")
        out = []
        for i, doc in enumerate(documents):
            if not isinstance(doc, Document):
                raise CorpusFormatError(f"documents[{i}] is a {type(doc).__name__}, not a haystack Document")
            where = f"documents[{i}] (id {doc.id!r})"
            if doc.blob is not None:
                raise CorpusFormatError(f"{where} has a blob: hybridret stores text only; convert it first (e.g. with "
                                        "a Haystack converter) and write the text as content")
            if not isinstance(doc.content, str) or not doc.content.strip():
                raise CorpusFormatError(f"{where} has no content: hybridret indexes each document's text")
            if (doc.embedding is not None or doc.sparse_embedding is not None) and self.embeddings == "refuse":
                raise ConfigError(f"{where} carries an embedding: hybridret encodes documents with its own models "
                                  "and would not use it; remove the embedder before this store, or create the store "
                                  "with embeddings='ignore'")
            meta = _pack(doc.meta, where)
            title = doc.meta.get(self.title_field) if self.title_field else None
            entry = {"id": doc.id, "text": doc.content, "metadata": meta}
            if isinstance(title, str):
                entry["title"] = title
            out.append(entry)
        return out

    def hit_to_document(self, hit: Hit, group: dict[str, Any] | None = None) -> Document:
        """A search hit as this store's Document (its meta as written) with the hit's ``score``, and
        ``meta["scores"]`` (each retriever's) and the group fields as
        :func:`~hybridret.integrations.haystack.hit_to_document` gives them."""
        doc = self._to_haystack({"id": hit.id, "title": hit.title, "text": hit.text, "metadata": hit.metadata})
        meta = {**doc.meta, "scores": finite_scores(hit.scores)}
        if group:
            meta.update(source_id=group["key"], group_rank=group["rank"], group_score=group["score"])
        return Document(id=doc.id, content=doc.content, meta=meta, score=float(hit.score))

    def _to_haystack(self, stored: Mapping[str, Any]) -> Document:
        meta = _unpack(stored.get("metadata") or {})
        title = stored.get("title")
        if self.title_field and title and self.title_field not in meta:  # an index written outside Haystack
            meta[self.title_field] = title
        return Document(id=stored["id"], content=stored.get("text", ""), meta=meta)


def _policy(policy: Any) -> DuplicatePolicy:
    """A :class:`DuplicatePolicy`, or its name or value as a string (``"overwrite"``, ``"SKIP"``)."""
    if isinstance(policy, DuplicatePolicy):
        return policy
    if isinstance(policy, str):
        for p in DuplicatePolicy:
            if policy.lower() in (p.name.lower(), str(p.value).lower()):
                return p
    raise ConfigError(f"policy must be a haystack DuplicatePolicy ({', '.join(p.name for p in DuplicatePolicy)}), "
                      f"got {policy!r}")


def _temporary(where: str) -> bool:
    """An index in the temporary directory a HybridRetriever makes for itself (removed with it)."""
    if _is_url(where):
        return False
    path = Path(where).resolve()
    return path.name.startswith("hybridret-") and path.parent == Path(tempfile.gettempdir()).resolve()


def _storable(value: Any) -> bool:
    """Whether hybridret metadata can hold a top-level value as it is (lists hold scalars only)."""
    if isinstance(value, (list, tuple)):
        return not any(isinstance(x, (list, tuple, Mapping)) for x in value)
    return True


def _pack(meta: Mapping[str, Any], where: str) -> dict[str, Any]:
    if PACKED in meta:
        raise CorpusFormatError(f"{where}: meta key {PACKED!r} is reserved by hybridret's document store")
    out = {k: v for k, v in meta.items() if _storable(v)}
    packed = {}
    for key, value in meta.items():
        if not _storable(value):
            try:
                packed[key] = json.dumps(value, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise CorpusFormatError(f"{where}: meta[{key!r}] cannot be stored as JSON: {exc}") from None
    if packed:
        out[PACKED] = packed
    return out


def _unpack(meta: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    packed = out.pop(PACKED, None)
    if isinstance(packed, Mapping):
        for key, text in packed.items():
            out[key] = json.loads(text)
    return out


def _check_ids(ids: Any) -> list[str]:
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Sequence):
        raise ConfigError(f"document_ids must be a list of strings, got {type(ids).__name__}")
    for i in ids:
        if not isinstance(i, str):
            raise ConfigError(f"document ids are strings, got {i!r}")
    return list(dict.fromkeys(ids))


def _batches(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _count(result: Any, name: str) -> int:
    value = result.get(name, 0) if isinstance(result, Mapping) else getattr(result, name, 0)
    return int(value or 0)


def _shown(ids: list[str], n: int = 10) -> str:
    return ", ".join(repr(i) for i in ids[:n]) + (f" ... ({len(ids) - n} more)" if len(ids) > n else "")

