"""Contrastive training of dual hybrid encoders (dense + SPLADE sparse, jointly) with FLOPS
regularisation and optional margin-MSE distillation.

One *step* is one optimiser update over ``grad_accum`` micro-batches of ``batch_size`` examples.
The data order is a pure function of the seed and the micro-batch number (one seeded permutation
per epoch), so a run resumed from a checkpoint sees exactly the batches the uninterrupted run saw.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .data import TrainExample
from .losses import flops, info_nce, margin_mse

__all__ = ["TrainConfig", "train"]

logger = logging.getLogger("hybridret.train")

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run (stored in the output's ``training.json``).

    Loss = ``dense_weight * InfoNCE(dense, temperature) + sparse_weight * InfoNCE(sparse,
    sparse_temperature) + ramp * (flops_query * FLOPS(queries) + flops_doc * FLOPS(docs)) +
    distill_weight * margin-MSE``, where ``ramp = min(1, (step / flops_warmup_steps) ** 2)``.
    ``teacher``: ``None``, ``"paired"`` (the packaged MiniLM + SPLADE-tiny scores, dense teaching
    dense and sparse teaching sparse) or a TREC run file whose scores teach both (needs example
    ids). ``amp`` applies on CUDA only (float16 autocast + gradient scaling).
    """

    model: str = "splade-tiny"
    output_dir: str = "models/hybrid"
    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 2e-5
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0
    dense_weight: float = 1.0
    sparse_weight: float = 1.0
    temperature: float = 0.05
    sparse_temperature: float = 1.0
    flops_query: float = 3e-4
    flops_doc: float = 1e-4
    flops_warmup_steps: int = 0
    max_length: int = 256
    n_negatives: int = 4
    shared: bool = True
    projection_dim: int | None = None
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    seed: int = 0
    device: str | None = None
    amp: bool = True
    teacher: str | None = None
    distill_weight: float = 1.0
    data: str | None = None  # where the examples came from (for the manifest only)
    log_every: int = 10

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "grad_accum", "max_length", "checkpoint_every", "log_every")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "flops_warmup_steps", "n_negatives", "keep_checkpoints"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("lr", "temperature", "sparse_temperature"):
            if not float(getattr(self, name)) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("weight_decay", "dense_weight", "sparse_weight", "flops_query", "flops_doc", "distill_weight"):
            if float(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.max_length < 8:
            raise ConfigError(f"max_length must be at least 8, got {self.max_length}")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise ConfigError(f"projection_dim must be positive, got {self.projection_dim}")
        if self.teacher is not None and self.teacher != "paired" and not Path(self.teacher).is_file():
            raise ConfigError(f"teacher must be 'paired' or a run file; {self.teacher!r} is neither")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- data order


class _Batches:
    """Micro-batch ``m`` = items ``[m*B, (m+1)*B)`` of the endless stream of seeded epoch permutations."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self._cache: dict[int, np.ndarray] = {}

    def _epoch(self, e: int) -> np.ndarray:
        if e not in self._cache:
            self._cache = {e: np.random.default_rng([self.seed, e]).permutation(self.n)}
        return self._cache[e]

    def __call__(self, m: int) -> list[int]:
        out = []
        for pos in range(m * self.batch_size, (m + 1) * self.batch_size):
            out.append(int(self._epoch(pos // self.n)[pos % self.n]))
        return out


def _prepare(examples: Sequence[TrainExample], n_neg: int, seed: int) -> list[tuple[TrainExample, list[str], list[str | None]]]:
    """Fix each example's ``n_neg`` negatives: its own hard negatives first, then (seeded) random
    passages of the training pool that are not one of the query's positives."""
    positives: dict[str, set[str]] = {}
    pool: dict[str, str | None] = {}
    for ex in examples:
        positives.setdefault(ex.query, set()).add(ex.positive)
        pool.setdefault(ex.positive, ex.positive_id)
        for i, t in enumerate(ex.negatives):
            pool.setdefault(t, ex.negative_ids[i] if ex.negative_ids else None)
    pool_items = list(pool.items())
    rng = np.random.default_rng([seed, 7919])
    out = []
    filled = 0
    for ex in examples:
        own = [t for t in ex.negatives if t not in positives[ex.query]][:n_neg]
        ids = [ex.negative_ids[ex.negatives.index(t)] if ex.negative_ids else None for t in own]
        tries = 0
        while len(own) < n_neg and tries < 50 * n_neg:
            tries += 1
            text, did = pool_items[int(rng.integers(len(pool_items)))]
            if text not in positives[ex.query] and text not in own:
                own.append(text)
                ids.append(did)
                filled += 1
        if len(own) < n_neg:
            raise ConfigError(f"cannot find {n_neg} negatives for query {ex.query[:60]!r}: the training pool is too small")
        out.append((ex, own, ids))
    if filled:
        logger.info("filled %d missing hard negatives with random training passages", filled)
    return out


# ----------------------------------------------------------------------------- teachers


def _paired_teacher(prepared: list[tuple[TrainExample, list[str], list[str | None]]], max_length: int,
                    device: str | None) -> np.ndarray:
    """``(N, 2, 1 + n_neg)`` dense and sparse scores of the packaged paired encoder."""
    from ..encoders import PairedEncoder

    enc = PairedEncoder.from_names(device=device, max_length=max_length)
    queries = sorted({ex.query for ex, _, _ in prepared})
    docs = sorted({t for ex, negs, _ in prepared for t in [ex.positive, *negs]})
    logger.info("teacher: encoding %d queries and %d passages with the paired encoder", len(queries), len(docs))
    qb, db = enc.encode_queries(queries), enc.encode_documents(docs)
    qi = {t: i for i, t in enumerate(queries)}
    di = {t: i for i, t in enumerate(docs)}
    out = np.zeros((len(prepared), 2, 1 + len(prepared[0][1])), dtype=np.float32)
    for n, (ex, negs, _) in enumerate(prepared):
        rows = [di[t] for t in [ex.positive, *negs]]
        q = qi[ex.query]
        out[n, 0] = db.dense[rows] @ qb.dense[q]
        out[n, 1] = (db.sparse[rows] @ qb.sparse[q].T).toarray().ravel()
    return out


def _run_teacher(prepared: list[tuple[TrainExample, list[str], list[str | None]]], path: str) -> np.ndarray:
    """``(N, 2, 1 + n_neg)`` scores from a TREC run file (``qid Q0 docid rank score tag``), both rows."""
    scores: dict[tuple[str, str], float] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ConfigError(f"{path}:{lineno}: a run line needs 6 columns (qid Q0 docid rank score tag)")
            try:
                scores[(parts[0], parts[2])] = float(parts[4])
            except ValueError:
                raise ConfigError(f"{path}:{lineno}: score {parts[4]!r} is not a number") from None
    out = np.zeros((len(prepared), 2, 1 + len(prepared[0][1])), dtype=np.float32)
    for n, (ex, _, neg_ids) in enumerate(prepared):
        for j, did in enumerate([ex.positive_id, *neg_ids]):
            key = (str(ex.query_id), str(did))
            if ex.query_id is None or did is None or key not in scores:
                raise ConfigError(f"teacher run {path} has no score for query {ex.query_id!r}, document {did!r} "
                                  "(distilling from a run needs examples with ids, e.g. from mine-negatives)")
            out[n, :, j] = scores[key]
    return out


# ----------------------------------------------------------------------------- checkpoints


def _latest_checkpoint(root: Path) -> Path | None:
    folder = root / CHECKPOINTS
    if not folder.is_dir():
        return None
    found = [(int(p.name.split("-")[1]), p) for p in folder.glob("step-*")
             if p.name.split("-")[1].isdigit() and (p / STATE_FILE).is_file()]
    return max(found)[1] if found else None


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# settings that may change between a run and its resumption without changing what is trained
_RESUMABLE_CHANGES = {"output_dir", "checkpoint_every", "keep_checkpoints", "log_every", "device", "data", "amp"}


def _check_resume(saved: dict[str, Any] | None, config: TrainConfig, latest: Path) -> None:
    """Refuse to resume a checkpoint written with different training settings."""
    if saved is None:
        logger.warning("%s records no training settings; resuming without checking them", latest)
        return
    current = json.loads(json.dumps(config.to_dict()))  # same JSON normalisation as the saved copy
    diff = sorted(k for k in set(saved) | set(current)
                  if k not in _RESUMABLE_CHANGES and saved.get(k) != current.get(k))
    if diff:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in diff)
        raise ConfigError(f"cannot resume {latest}: it was trained with other settings ({detail}); "
                          "use another output folder")


def _save_checkpoint(root: Path, step: int, model: Any, optim: Any, sched: Any, scaler: Any,
                     history: list[dict[str, Any]], keep: int, config: TrainConfig) -> Path:
    import torch

    folder = root / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step}"
    tmp = folder / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optim.state_dict(),
                "scheduler": sched.state_dict(), "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": _rng_state(), "history": json.dumps(history),
                "config": json.dumps(config.to_dict())}, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep:
        old = sorted((int(p.name.split("-")[1]), p) for p in folder.glob("step-*") if p.name.split("-")[1].isdigit())
        for _, p in old[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
    logger.debug("checkpoint written: %s", final)
    return final


# ----------------------------------------------------------------------------- training


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from .._version import __version__

    return {"hybridret": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def _param_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(config: TrainConfig, examples: Sequence[TrainExample], *, resume: bool = False) -> Path:
    """Train a :class:`~hybridret.train.model.HybridModel` on ``examples``; returns the model folder
    (``config.output_dir``, loadable by ``JointEncoder`` -- or its ``query/`` and ``document/``
    sub-folders with separate towers).

    Checkpoints go to ``output_dir/checkpoints/step-N`` every ``checkpoint_every`` steps (the
    ``keep_checkpoints`` newest are kept). ``resume=True`` continues from the newest one.

    Raises:
        MissingDependencyError: torch or transformers is not installed (the ``torch`` extra).
    """
    from ..encoders.backends import require_torch

    require_torch("training (hybridret.train)")
    import torch
    from tqdm.auto import tqdm

    from ..encoders._hf import pick_device
    from .model import HybridModel

    if not examples:
        raise ConfigError("no training examples")
    out = Path(config.output_dir)
    latest = _latest_checkpoint(out)
    if latest is not None and not resume:
        raise ConfigError(f"{out} already holds checkpoints; pass resume=True (--resume) or use another folder")
    device = pick_device(config.device)
    use_amp = bool(config.amp) and device.startswith("cuda")
    torch.manual_seed(config.seed)
    # HybridModel's own loader; it passes trust_remote_code=False to transformers
    model = HybridModel.from_pretrained(config.model, shared=config.shared,  # trust_remote_code=False inside
                                        projection_dim=config.projection_dim, max_length=config.max_length,
                                        device=device)
    prepared = _prepare(examples, config.n_negatives, config.seed)
    teacher = None
    if config.teacher == "paired":
        teacher = torch.from_numpy(_paired_teacher(prepared, config.max_length, device))
    elif config.teacher is not None:
        teacher = torch.from_numpy(_run_teacher(prepared, config.teacher))

    optim = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr)
    warm, total = config.warmup_steps, config.steps

    def schedule(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return max(0.0, (total - s) / max(1, total - warm))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, schedule)
    scaler = torch.amp.GradScaler("cuda") if use_amp else None
    step = 0
    history: list[dict[str, Any]] = []
    if latest is not None:
        state = torch.load(latest / STATE_FILE, map_location=device, weights_only=True)
        _check_resume(json.loads(state["config"]) if state.get("config") else None, config, latest)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"])
        step = int(state["step"])
        history = json.loads(state["history"])
        logger.info("resuming from %s (step %d of %d)", latest, step, total)

    batches = _Batches(len(prepared), config.batch_size, config.seed)
    group = 1 + config.n_negatives
    bar = tqdm(total=total, initial=step, desc="train", unit="step",
               disable=not logging.getLogger("hybridret").isEnabledFor(logging.INFO))
    window: dict[str, list[float]] = {}
    started = time.perf_counter()
    seen = 0
    model.train()
    try:
        while step < total:
            ramp = 1.0 if config.flops_warmup_steps == 0 else min(1.0, (step / config.flops_warmup_steps) ** 2)
            optim.zero_grad(set_to_none=True)
            parts: dict[str, float] = {}
            for micro in range(config.grad_accum):
                idx = batches(step * config.grad_accum + micro)
                items = [prepared[i] for i in idx]
                queries = [ex.query for ex, _, _ in items]
                docs = [t for ex, negs, _ in items for t in [ex.positive, *negs]]
                # a copy of a query's positive elsewhere in the batch is not a negative for it
                positives = {q: {ex.positive for ex, _, _ in items if ex.query == q} for q in queries}
                mask = torch.tensor([[j != i * group and docs[j] in positives[q] for j in range(len(docs))]
                                     for i, q in enumerate(queries)], device=device)
                with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=use_amp):
                    qd, qs = model.encode(queries, "query")
                    dd, ds = model.encode(docs, "document")
                terms = {
                    "dense": config.dense_weight * info_nce(qd, dd, config.temperature, mask=mask),
                    "sparse": config.sparse_weight * info_nce(qs, ds, config.sparse_temperature, mask=mask),
                    "flops": ramp * (config.flops_query * flops(qs) + config.flops_doc * flops(ds)),
                }
                if teacher is not None:
                    t = teacher[idx].to(device)
                    sd = (qd.float().unsqueeze(1) * dd.float().view(len(idx), group, -1)).sum(-1)
                    ss = (qs.unsqueeze(1) * ds.view(len(idx), group, -1)).sum(-1)
                    terms["distill"] = config.distill_weight * (
                        margin_mse(sd[:, 0], sd[:, 1:], t[:, 0, 0], t[:, 0, 1:])
                        + margin_mse(ss[:, 0], ss[:, 1:], t[:, 1, 0], t[:, 1, 1:]))
                loss = sum(terms.values()) / config.grad_accum
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                for k, v in terms.items():
                    parts[k] = parts.get(k, 0.0) + float(v.detach()) / config.grad_accum
                parts["loss"] = parts.get("loss", 0.0) + float(loss.detach())
                with torch.no_grad():
                    parts["doc_terms"] = parts.get("doc_terms", 0.0) + float((ds > 0).sum(1).float().mean()) / config.grad_accum
                seen += len(idx)
            if scaler is not None:
                scaler.unscale_(optim)
            if config.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            if scaler is not None:
                scaler.step(optim)
                scaler.update()
            else:
                optim.step()
            sched.step()
            step += 1
            for k, v in parts.items():
                window.setdefault(k, []).append(v)
            if step % config.log_every == 0 or step == total:
                avg = {k: float(np.mean(v)) for k, v in window.items()}
                history.append({"step": step, "lr": float(sched.get_last_lr()[0]), **avg})
                window = {}
                logger.debug("step %d: %s", step, avg)
            rate = seen / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(loss=f"{parts['loss']:.3f}", ex_s=f"{rate:.1f}")
            bar.update(1)
            if step % config.checkpoint_every == 0 or step == total:
                _save_checkpoint(out, step, model, optim, sched, scaler, history, config.keep_checkpoints, config)
    finally:
        bar.close()
    model.eval()
    manifest = {
        "config": config.to_dict(), "steps": step, "seed": config.seed, "data": config.data,
        "examples": len(examples), "device": device, "amp": use_amp, "versions": _versions(),
        "final_losses": history[-1] if history else None, "history": history,
        "seconds_this_run": round(time.perf_counter() - started, 2),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    model.save(out, manifest=manifest)
    logger.info("trained %d steps; model written to %s", step, out)
    return out
