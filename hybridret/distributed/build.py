"""The distributed build: encode on a Ray Data actor pool, write one ordinary index per shard.

1. Documents are validated once (the library's own rules) and routed by a stable hash of their id.
   A Parquet corpus is read through Ray Data (``ray.data.read_parquet``: the files in parallel,
   only the columns used), each batch checked by the rules of :mod:`hybridret.arrow`.
2. Encoding is a Ray Data pipeline: ``map_batches`` over an actor pool whose actors hold the models
   (``num_gpus=1`` per actor when the cluster has GPUs, CPU actors otherwise). Every encoded
   batch lands in a shared content-keyed encoding cache (``enc-*.npz``, written atomically), which
   makes the build resumable: run it again after an interruption and only what is missing is
   encoded.
3. One Ray task per shard builds ``DIR/shard-NNN`` with an :class:`~hybridret.indexer.IndexWriter`
   that reads every encoding back from the cache (it never loads a model), then ``DIR/shards.json``
   is written last: a folder without it is not a sharded index.

The cache and the corpus must be on storage every node sees (a shared filesystem) on a real cluster.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..data import CorpusReader, Document
from ..encoders import Encoder
from ..errors import ConfigError, IndexExistsError
from .encoding import BatchEncoder, PrecomputedEncoder, encoder_shape
from .layout import LAYOUT_FILE, shard_name, split_by_shard, write_layout

__all__ = ["build_sharded", "encode_distributed"]

logger = logging.getLogger(__name__)


def _parquet_via_ray(reader: CorpusReader) -> Iterator[Document]:
    """The documents of a Parquet corpus read through Ray Data, in file order. A row the rules
    refuse is found again by the local reader, whose error names its file, row group and row."""
    import ray

    from ..arrow import BATCH_ROWS, batch_documents
    from ..errors import CorpusFormatError

    corpus = reader._parquet
    cols = corpus._resolved[0]
    ds = ray.data.read_parquet([str(f) for f in corpus.files]).select_columns(cols.columns)  # only those read
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ordered, ctx.execution_options.preserve_order = ctx.execution_options.preserve_order, True  # file order
    try:
        for b, batch in enumerate(ds.iter_batches(batch_size=BATCH_ROWS, batch_format="pyarrow")):
            for r, rec in batch_documents(batch, cols, lambda r, b=b: f"{reader.path}: batch {b}, row {r}"):
                doc = Document(**rec)
                if reader.on_empty == "error" and not doc.full_text:
                    raise CorpusFormatError(f"{reader.path}: batch {b}, row {r}: document {doc.id!r} is empty")
                yield doc
    except CorpusFormatError:
        for _ in CorpusReader(reader.path, format="parquet", columns=corpus.columns, on_empty=reader.on_empty):
            pass  # raises the same error, at its place in the files
        raise
    finally:
        ctx.execution_options.preserve_order = ordered


def _documents(documents: Iterable[Any] | str | Path, *, ray_data: bool = False) -> tuple[list[Document], int]:
    from ..arrow import flatten_arrow, is_arrow
    from ..indexer import as_document

    source = CorpusReader(documents) if isinstance(documents, (str, Path)) else documents
    items = source if hasattr(source, "skipped_empty") and not is_arrow(source) else flatten_arrow(source)
    if ray_data and _one_parquet_layout(source):
        items = _parquet_via_ray(source)  # type: ignore[arg-type]
    docs, blank, seen = [], 0, set()
    for i, item in enumerate(items):
        doc = as_document(item, i, allow_bare=True)
        if not doc.full_text.strip():
            blank += 1
            continue
        if doc.id in seen:
            from ..errors import CorpusFormatError

            raise CorpusFormatError(f"duplicate document id {doc.id!r}", field="id")
        seen.add(doc.id)
        docs.append(doc)
    if items is source:
        blank += int(getattr(source, "skipped_empty", 0) or 0)
    return docs, blank


def _one_parquet_layout(source: Any) -> bool:
    """A Parquet :class:`CorpusReader` whose files all use the same columns (one Ray Data read)."""
    corpus = getattr(source, "_parquet", None)
    return corpus is not None and all(r == corpus._resolved[0] for r in corpus._resolved)


def _ray_ready(address: str | None, num_cpus: int | None) -> Any:
    try:
        import ray
    except ImportError:  # pragma: no cover
        raise ConfigError("the distributed build needs Ray: pip install 'hybridret[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                 log_to_driver=False)
    return ray


def encode_distributed(docs: list[Document], config: dict[str, Any], cache_dir: str | Path, *,
                       workers: int | None = None, batch_size: int = 64, device: str | None = None,
                       num_gpus: float | None = None) -> int:
    """Encode ``docs`` into the encoding cache at ``cache_dir`` on a Ray Data actor pool; returns how
    many documents were encoded (the rest were in the cache already)."""
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    gpus = ray.cluster_resources().get("GPU", 0) if num_gpus is None else num_gpus
    per_gpu = 1 if gpus else 0
    free = float(ray.available_resources().get("CPU", 0))
    if workers is None:
        workers = int(gpus) if gpus else max(1, int(free))
    cpus = 0.0 if per_gpu else _cpus_per_actor(free, workers)
    ds = ray.data.from_items([{"id": d.id, "full_text": d.full_text} for d in docs],
                             override_num_blocks=max(1, min(len(docs) // batch_size + 1, 4 * workers)))
    out = ds.map_batches(BatchEncoder, fn_constructor_kwargs={"config": config, "cache_dir": str(cache_dir),
                                                              "device": device},
                         batch_size=batch_size, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=workers),
                         num_cpus=cpus, num_gpus=per_gpu)
    encoded = 0
    for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
        encoded += int(batch["encoded"].sum())
    return encoded


def _cpus_per_actor(free: float, workers: int) -> float:
    """One CPU per encoding actor, or the free share when other actors (e.g. shard servers) hold
    CPU slots: an actor pool asking for more CPUs than are free never starts (a deadlock)."""
    if free >= workers:
        return 1.0
    share = max(0.05, free / workers)
    logger.warning("only %.2f CPUs are free for %d encoding actors; each asks for %.2f", free, workers, share)
    return share


def _write_shard(root: str, docs: list[Document], shape: dict[str, Any], cache_dir: str,
                 settings: Mapping[str, Any] | None, chunk_size: int) -> dict[str, Any]:
    from ..indexer import IndexWriter

    enc = PrecomputedEncoder(shape, what=Path(root).name)
    with IndexWriter(root, encoder=enc, settings=settings) as writer:
        result = writer.write(docs, mode="build", encode_cache=cache_dir, chunk_size=chunk_size, show_progress=False)
    return result.to_dict()


def build_sharded(documents: Iterable[Any] | str | Path, output: str | Path, *, shards: int,
                  encoder: Encoder | None = None, settings: Mapping[str, Any] | None = None,
                  address: str | None = None, num_cpus: int | None = None, workers: int | None = None,
                  batch_size: int = 64, encode_cache: str | Path | None = None, overwrite: bool = False,
                  device: str | None = None, chunk_size: int = 1024) -> dict[str, Any]:
    """Build a sharded index of ``documents`` (an iterable, or a corpus path) at ``output`` with
    ``shards`` shards on Ray (``address``: an existing cluster; ``None``: a local one with
    ``num_cpus``). ``encode_cache`` (default ``OUTPUT/encode-cache``, removed after success)
    makes an interrupted build resumable. Returns per-shard counts and timings."""
    from ..encoders import PairedEncoder

    output = Path(output)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(f"shards must be a positive integer, got {shards!r}")
    if (output / LAYOUT_FILE).exists() or (output / "manifest.json").exists():
        if not overwrite:
            raise IndexExistsError(f"{output} already holds an index; pass overwrite=True (CLI: --overwrite)")
    t0 = time.perf_counter()
    if isinstance(documents, (str, Path)):
        documents = CorpusReader(documents)
    parquet = _one_parquet_layout(documents)
    if parquet:
        _ray_ready(address, num_cpus)  # the corpus is read through Ray Data
    docs, blank = _documents(documents, ray_data=parquet)
    groups = split_by_shard(docs, shards, key=lambda d: d.id)
    empty = [shard_name(i) for i, g in enumerate(groups) if not g]
    if empty:
        raise ConfigError(f"{len(docs)} documents leave {', '.join(empty)} empty; use fewer shards")
    encoder = encoder or PairedEncoder.from_names(device=device)
    shape = encoder_shape(encoder)
    ray = _ray_ready(address, num_cpus)
    cache_dir = Path(encode_cache) if encode_cache is not None else output / "encode-cache"
    output.mkdir(parents=True, exist_ok=True)
    (output / LAYOUT_FILE).unlink(missing_ok=True)  # the layout is written last
    t1 = time.perf_counter()
    encoded = encode_distributed(docs, shape["config"], cache_dir, workers=workers, batch_size=batch_size,
                                 device=device)
    t2 = time.perf_counter()
    free = float(ray.available_resources().get("CPU", 0))
    write = ray.remote(num_cpus=min(1.0, max(0.05, free)))(_write_shard)
    refs = [write.remote(str((output / shard_name(i)).resolve()), groups[i], shape, str(cache_dir.resolve()),
                         dict(settings) if settings else None, chunk_size) for i in range(shards)]
    results = ray.get(refs)
    t3 = time.perf_counter()
    write_layout(output, shards, shape["config"], extra={"built_with": "ray", "num_docs": len(docs)})
    if encode_cache is None:
        shutil.rmtree(cache_dir, ignore_errors=True)
    out = {"num_docs": len(docs), "skipped_empty": blank, "encoded": encoded, "shards": {
        shard_name(i): {"num_docs": r["added"], "commit": r["commit"]} for i, r in enumerate(results)},
        "seconds": {"read": t1 - t0, "encode": t2 - t1, "write": t3 - t2, "total": t3 - t0}}
    logging.getLogger("hybridret.summary").info("built %s: %d documents in %d shards (%d encoded, %.1f s)", output,
                                                len(docs), shards, encoded, t3 - t0)
    return out
