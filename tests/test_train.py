"""Training dual hybrid encoders: losses, data, the trainer, save/reload, resume and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hybridret.errors import CorpusFormatError  # noqa: E402
from hybridret.train import TrainExample, flops, info_nce, margin_mse, read_triples, write_triples  # noqa: E402

PAIRS = [
    ("what do bees make", "Bees collect nectar from flowers and turn it into honey inside the hive."),
    ("highest mountain on earth", "Everest is the highest mountain on Earth, in the Himalayas."),
    ("who walked on the moon", "In 1969 Apollo 11 astronauts Armstrong and Aldrin walked on the Moon."),
    ("how is sourdough leavened", "Sourdough is leavened with a starter of wild yeast and bacteria."),
    ("what does the heart do", "The heart pumps blood through the circulatory system."),
    ("when was the eiffel tower built", "The iron lattice tower in Paris was completed in 1889."),
    ("why do volcanoes erupt", "Volcanoes erupt when magma rises through the crust of the Earth."),
    ("what is in coffee", "Coffee is brewed from roasted beans and contains caffeine."),
]
DOCS = [p for _, p in PAIRS]


def _examples() -> list[TrainExample]:
    # the hard negative of query i is the passage of query i + 1
    return [TrainExample(q, p, [DOCS[(i + 1) % len(DOCS)]]) for i, (q, p) in enumerate(PAIRS)]


def _config(out: Path, **kw):  # type: ignore[no-untyped-def]
    from hybridret.train import TrainConfig

    base = dict(model="splade-tiny", output_dir=str(out), steps=20, batch_size=4, n_negatives=1, max_length=32,
                lr=2e-4, warmup_steps=2, flops_query=0.0, flops_doc=0.0, checkpoint_every=100, log_every=1,
                seed=3, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def _history(folder: Path) -> list[dict]:
    return json.loads((folder / "training.json").read_text())["history"]


# ----------------------------------------------------------------------------- losses and data


def test_losses_small_cases() -> None:
    q = torch.eye(2)
    d = torch.tensor([[1.0, 0], [-1, 0], [0, 1], [0, -1]])  # positives at rows 0 and 2, then a hard negative
    assert info_nce(q, d, 0.01).item() < 1e-3
    assert info_nce(q, d[[1, 0, 3, 2]], 0.01).item() > 10
    w = torch.tensor([[1.0, 0, 2], [3.0, 0, 0]])
    assert flops(w).item() == pytest.approx(2.0**2 + 1.0**2)
    assert margin_mse(torch.tensor([2.0]), torch.tensor([[1.0]]), torch.tensor([5.0]), torch.tensor([[4.0]])).item() == 0


def test_read_triples_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert write_triples(_examples()[:2], path) == 2
    back = read_triples(path)
    assert back[0].query == PAIRS[0][0] and back[0].negatives == [DOCS[1]]
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"query": "q", "positive": "p"})
    for line, message in ((json.dumps({"query": "q"}), "missing field 'positive'"),
                          ("{not json", "invalid JSON"),
                          (json.dumps({"query": "q", "positive": "p", "negatives": "n"}), "'negatives'")):
        bad.write_text(f"{good}\n\n{line}\n")
        with pytest.raises(CorpusFormatError, match=message) as info:
            read_triples(bad)
        assert info.value.line == 3 and f"{bad}:3" in str(info.value)


# ----------------------------------------------------------------------------- model


def test_saved_folder_reloads_through_joint_encoder(tmp_path: Path) -> None:
    from hybridret.encoders import JointEncoder
    from hybridret.train import HybridModel

    torch.manual_seed(0)
    for shared in (True, False):
        model = HybridModel.from_pretrained("splade-tiny", shared=shared, projection_dim=24, max_length=32,
                                            device="cpu")
        with torch.no_grad():  # move the weights away from the checkpoint's
            for p in model.document_tower.parameters():
                p.add_(0.01 * torch.randn_like(p))
        model.eval()
        out = model.save(tmp_path / f"m-{shared}")
        folder = out if shared else out / "document"
        enc = JointEncoder(str(folder), max_length=32, device="cpu")
        assert enc.dense_dim == 24
        got = enc.encode_documents(DOCS[:5])
        with torch.no_grad():
            dense, sparse = model.encode(DOCS[:5], "document")
        np.testing.assert_allclose(got.dense, dense.numpy(), atol=1e-5)
        np.testing.assert_allclose(got.sparse.toarray(), sparse.numpy(), atol=1e-5)
        reloaded = HybridModel.from_pretrained(out, max_length=32, device="cpu")
        assert reloaded.shared is shared
        if not shared:  # the top folder loads as an asymmetric JointEncoder: each side its own tower
            both = JointEncoder(str(out), max_length=32, device="cpu")
            assert both.config()["model"] == str(out) and "query_model" not in both.config()
            with torch.no_grad():
                qd, qs = model.encode(DOCS[:3], "query")
            got_q = both.encode_queries(DOCS[:3])
            np.testing.assert_allclose(got_q.dense, qd.numpy(), atol=1e-5)
            np.testing.assert_allclose(got_q.sparse.toarray(), qs.numpy(), atol=1e-5)
            np.testing.assert_allclose(both.encode_documents(DOCS[:3]).dense, dense[:3].numpy(), atol=1e-5)
            assert not np.allclose(got_q.dense, dense[:3].numpy(), atol=1e-3)


def test_minilm_backbone_gets_a_sparse_head(tmp_path: Path) -> None:
    from hybridret.train import HybridModel, train

    model = HybridModel.from_pretrained("all-MiniLM-L6-v2", max_length=16, device="cpu")
    backbone = model.query_tower.backbone
    assert type(backbone).__name__ == "BertForMaskedLM"
    assert backbone.get_output_embeddings().weight is backbone.get_input_embeddings().weight
    with torch.no_grad():
        dense, sparse = model.encode(["a question about bees"])
    assert dense.shape == (1, 384) and sparse.shape == (1, 30522) and int((sparse > 0).sum()) > 0
    folder = train(_config(tmp_path / "mini", model="all-MiniLM-L6-v2", steps=1, batch_size=2, max_length=16),
                   _examples()[:4])
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


# ----------------------------------------------------------------------------- trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hybridret.train import train

    return train(_config(tmp_path_factory.mktemp("train") / "m", steps=30), _examples())


def test_loss_falls(trained: Path) -> None:
    losses = [h["loss"] for h in _history(trained)]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    manifest = json.loads((trained / "training.json").read_text())
    assert manifest["steps"] == 30 and manifest["config"]["seed"] == 3 and "torch" in manifest["versions"]


def test_flops_weight_reduces_document_terms(trained: Path, tmp_path: Path) -> None:
    from hybridret.encoders import JointEncoder
    from hybridret.train import train

    sparse = train(_config(tmp_path / "f", steps=30, flops_query=0.5, flops_doc=0.5), _examples())
    nnz = [JointEncoder(str(f), max_length=32, device="cpu").encode_documents(DOCS).sparse.getnnz(axis=1).mean()
           for f in (trained, sparse)]
    assert nnz[1] < 0.8 * nnz[0], nnz


def test_resume_reproduces_uninterrupted_run(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from hybridret.errors import ConfigError
    from hybridret.train import train

    full = train(_config(tmp_path / "full", steps=4, checkpoint_every=2), _examples())
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step-2", part / "checkpoints" / "step-2")
    with pytest.raises(ConfigError, match="resume"):
        train(_config(part, steps=4, checkpoint_every=2), _examples())
    resumed = train(_config(part, steps=4, checkpoint_every=2), _examples(), resume=True)
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _history(full) == _history(resumed)
    # resuming with other training settings is refused, naming what changed
    other = tmp_path / "other"
    shutil.copytree(full / "checkpoints", other / "checkpoints")
    with pytest.raises(ConfigError, match="lr"):
        train(_config(other, steps=4, checkpoint_every=2, lr=1e-3), _examples(), resume=True)


def test_distillation_teachers(tmp_path: Path) -> None:
    from hybridret.errors import ConfigError
    from hybridret.train import train

    folder = train(_config(tmp_path / "paired", steps=2, teacher="paired"), _examples())
    assert all(h["distill"] > 0 for h in _history(folder))
    examples = [TrainExample(q, p, [DOCS[(i + 1) % 8]], query_id=f"q{i}", positive_id=f"d{i}",
                             negative_ids=[f"d{(i + 1) % 8}"]) for i, (q, p) in enumerate(PAIRS)]
    run = tmp_path / "teacher.run"
    run.write_text("".join(f"q{i} Q0 d{j} {r} {s} t\n" for i in range(8)
                           for r, (j, s) in enumerate([(i, 9.0), ((i + 1) % 8, 4.0)], 1)))
    folder = train(_config(tmp_path / "run", steps=2, teacher=str(run)), examples)
    assert all(h["distill"] > 0 for h in _history(folder))
    with pytest.raises(ConfigError, match="no score"):
        train(_config(tmp_path / "noid", steps=1, teacher=str(run)), _examples())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_amp_training_on_gpu(tmp_path: Path) -> None:
    from hybridret.encoders import JointEncoder
    from hybridret.train import train

    folder = train(_config(tmp_path / "gpu", steps=5, device="cuda", amp=True, flops_query=1e-3, flops_doc=1e-3),
                   _examples())
    manifest = json.loads((folder / "training.json").read_text())
    assert manifest["amp"] is True and all(np.isfinite(h["loss"]) for h in manifest["history"])
    batch = JointEncoder(str(folder), max_length=32, device="cuda").encode_documents(DOCS)
    assert np.isfinite(batch.dense).all() and batch.sparse.nnz > 0


# ----------------------------------------------------------------------------- CLI end to end


def test_cli_train_index_mine(tmp_path: Path) -> None:
    from hybridret.cli import main
    from hybridret.retriever import HybridRetriever

    triples = tmp_path / "t.jsonl"
    write_triples(_examples(), triples)
    model = tmp_path / "model"
    assert main(["-q", "train", "--data", str(triples), "-o", str(model), "--steps", "2", "--batch-size", "2",
                 "--negatives", "1", "--max-length", "32", "--device", "cpu", "--projection-dim", "32"]) == 0
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, (q, _) in enumerate(PAIRS)))
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(PAIRS))))
    index = tmp_path / "index"
    assert main(["-q", "index", str(corpus), "-o", str(index), "--joint-model", str(model),
                 "--max-length", "32", "--device", "cpu"]) == 0
    r = HybridRetriever.load(index, device="cpu")
    assert r.num_docs == len(DOCS) and r.encoder.dense_dim == 32
    assert r.search([PAIRS[0][0]], k=3, method="hybrid").ids.shape == (1, 3)
    assert main(["-q", "index", str(corpus), "-o", str(tmp_path / "sp"), "--sparse-model", str(model),
                 "--max-length", "32", "--device", "cpu"]) == 0
    out = tmp_path / "mined.jsonl"
    assert main(["-q", "mine-negatives", str(index), "--queries", str(queries), "--qrels", str(qrels),
                 "-o", str(out), "-k", "4", "-n", "2"]) == 0
    mined = read_triples(out)
    assert len(mined) == len(PAIRS)
    for ex in mined:
        assert len(ex.negatives) == 2 and ex.positive not in ex.negatives
