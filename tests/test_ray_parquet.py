"""A sharded build on Ray reads a Parquet corpus through Ray Data: the shards hold every row with
its metadata, and a bad row is named by its file, row group and row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hybridret[ray]')")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from hybridret import HybridRetriever  # noqa: E402
from hybridret.data import CorpusReader  # noqa: E402
from hybridret.distributed.build import build_sharded  # noqa: E402
from hybridret.distributed.layout import shard_name  # noqa: E402
from hybridret.errors import CorpusFormatError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ray import ray_cluster  # noqa: E402,F401 - the one local Ray cluster fixture

TOPICS = ["river bank loan", "orchestra concert piano", "virus fever hospital", "rocket orbit moon",
          "coffee tea market", "volcano lava island", "winter snow storm", "honey bee garden"]


def test_ray_build_reads_parquet_through_ray_data(ray_cluster, paired_encoder, tmp_path, monkeypatch):
    folder = tmp_path / "corpus"
    folder.mkdir()
    ids = [f"doc-{i}" for i in range(len(TOPICS))]
    table = pa.table({"doc_id": ids, "body": [f"{t} and more about {t}" for t in TOPICS],
                      "group": ["ab"[i % 2] for i in range(len(TOPICS))]})
    pq.write_table(table.slice(0, 5), folder / "a.parquet", row_group_size=2)
    pq.write_table(table.slice(5), folder / "b.parquet")
    read = []
    real = ray.data.read_parquet
    monkeypatch.setattr(ray.data, "read_parquet", lambda paths, **kw: read.append((paths, kw)) or real(paths, **kw))
    reader = CorpusReader(folder, columns={"id": "doc_id", "text": "body"})
    report = build_sharded(reader, tmp_path / "s2", shards=2, encoder=paired_encoder, workers=1, batch_size=8)
    assert read and sorted(read[0][0]) == [str(folder / "a.parquet"), str(folder / "b.parquet")]
    assert report["num_docs"] == len(TOPICS)
    got = {}
    for i in range(2):
        shard = HybridRetriever.load(tmp_path / "s2" / shard_name(i), encoder=paired_encoder)
        got.update({d["id"]: d["metadata"] for d in shard.documents()})
    assert got == {doc_id: {"group": "ab"[i % 2]} for i, doc_id in enumerate(ids)}

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["x", "y", None], "text": ["one", "two", "three"]}), bad, row_group_size=2)
    with pytest.raises(CorpusFormatError, match=r"bad.parquet: row group 1, row 0 \(row 2 of the file.*is null"):
        build_sharded(CorpusReader(bad), tmp_path / "bad", shards=2, encoder=paired_encoder, workers=1)
