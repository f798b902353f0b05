"""The trainable dual hybrid encoder: each tower gives a dense and a SPLADE sparse vector.

A tower is a ``*ForMaskedLM`` backbone. Its dense vector is the mean of the last hidden states
(optionally through a linear projection), L2-normalised; its sparse vector is
``max_tokens log(1 + relu(MLM logits))`` with special and punctuation tokens masked out -- the
exact computation of :class:`hybridret.encoders.JointEncoder`, so a saved tower encodes the same
at inference time.

With ``shared=True`` queries and documents go through one tower. Otherwise there are two towers,
saved as ``query/`` and ``document/`` sub-folders of the output folder, each a ``*ForMaskedLM``
folder of its own; ``JointEncoder(output_folder)`` recognises the layout and encodes queries with
``query/`` and documents with ``document/`` (``JointEncoder(folder / "document")`` gives one side).

This module imports torch when imported; ``hybridret.train`` loads it lazily.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..encoders._hf import mean_pool, pick_device
from ..encoders.backends import require_torch
from ..encoders.dense import normalise
from ..encoders.joint import PROJECTION_FILE
from ..encoders.splade import sparse_vocab_mask, splade_weights
from ..errors import EncoderError, ModelNotFoundError
from ..models import LOAD_LOCK, resolve_model

try:
    import torch
except ImportError:  # a clear error naming the extra (MissingDependencyError), not a bare ModuleNotFoundError
    require_torch("training (hybridret.train)")
    raise

__all__ = ["HybridModel", "HybridTower", "MANIFEST_FILE", "SEPARATE_TOWERS"]

logger = logging.getLogger("hybridret.train")

MANIFEST_FILE = "training.json"
SEPARATE_TOWERS = ("query", "document")


def _load_backbone(path: str, name: str) -> torch.nn.Module:
    """A ``*ForMaskedLM`` model from ``path``; a plain encoder gets a fresh MLM head tied to its
    word embeddings."""
    with LOAD_LOCK:  # transformers' loading is not thread-safe
        return _load_backbone_unlocked(path, name)


def _load_backbone_unlocked(path: str, name: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except OSError as exc:
        raise ModelNotFoundError(f"could not load model {name!r} from {path}: {exc}") from exc
    except ValueError as exc:  # e.g. a folder that needs its own code (never run)
        raise EncoderError(f"model {name!r} at {path} cannot be loaded: {exc}") from exc
    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForMaskedLM") for a in archs):
        return AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=False)
    logger.info("%s is a plain encoder (%s): adding a new masked-LM head tied to its word embeddings",
                name, ", ".join(archs) or "unknown architecture")
    config.tie_word_embeddings = True
    try:
        mlm = AutoModelForMaskedLM.from_config(config)
        encoder = AutoModel.from_pretrained(path, trust_remote_code=False)
    except ValueError as exc:
        raise EncoderError(f"model {name!r} has no masked-LM variant: {exc}") from exc
    result = mlm.base_model.load_state_dict(encoder.state_dict(), strict=False)
    if result.missing_keys:
        raise EncoderError(f"{name}: encoder weights do not fit the masked-LM body; missing {result.missing_keys[:5]}")
    dropped = [k for k in result.unexpected_keys if not k.startswith("pooler.")]
    if dropped:
        logger.warning("%s: weights not used by the masked-LM body: %s", name, dropped[:5])
    out_emb, in_emb = mlm.get_output_embeddings(), mlm.get_input_embeddings()
    if out_emb.weight is not in_emb.weight:
        out_emb.weight = in_emb.weight
    _calibrate_new_head(mlm, in_emb.weight)
    arch = type(mlm).__name__
    mlm.config.architectures = [arch]
    return mlm


NEW_HEAD_BIAS = 4.0  # initial decoder bias = -NEW_HEAD_BIAS * ||embedding||: ~30 terms/query, ~250/passage


def _calibrate_new_head(mlm: torch.nn.Module, embeddings: torch.Tensor) -> None:
    """Start a new MLM head near "each position predicts its own and similar tokens", and sparse.

    A random transform layer gives random terms and a bias of 0 makes every one of the ~30k terms
    active. With an identity transform the logits are LayerNorm(h) . e_v, which already ranks the
    text's own tokens and near-synonyms first (measured on MiniLM: "holes" -> hole, forms,
    horizons); a bias of -4 ||e_v|| keeps about 30 terms per query and 250 per passage.
    """
    transform = getattr(getattr(getattr(mlm, "cls", None), "predictions", None), "transform", None)
    dense = getattr(transform, "dense", None)
    with torch.no_grad():
        if isinstance(dense, torch.nn.Linear) and dense.in_features == dense.out_features:
            dense.weight.copy_(torch.eye(dense.in_features, dtype=dense.weight.dtype))
            dense.bias.zero_()
        bias = getattr(mlm.get_output_embeddings(), "bias", None)
        if bias is not None:
            bias.copy_(-NEW_HEAD_BIAS * embeddings.norm(dim=1))


class HybridTower(torch.nn.Module):
    """One ``*ForMaskedLM`` backbone giving ``(dense, sparse)`` vectors per text."""

    def __init__(self, backbone: torch.nn.Module, keep: np.ndarray, projection_dim: int | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = int(backbone.config.hidden_size)
        self.projection = torch.nn.Linear(hidden, projection_dim) if projection_dim else None
        out_size = backbone.get_output_embeddings().weight.shape[0]
        keep = np.concatenate([keep, np.zeros(max(0, out_size - keep.shape[0]), dtype=bool)])[:out_size]
        self.register_buffer("keep", torch.from_numpy(keep.astype(np.float32)), persistent=False)

    @property
    def vocab_size(self) -> int:
        return int(self.keep.shape[0])

    @property
    def dense_dim(self) -> int:
        return int(self.projection.out_features) if self.projection is not None else int(self.backbone.config.hidden_size)

    def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        vec = mean_pool(out.hidden_states[-1], attention_mask)
        if self.projection is not None:
            vec = self.projection(vec.float())
        dense = normalise(vec)
        sparse = splade_weights(out.logits, attention_mask, self.keep)
        return dense, sparse

    def save(self, folder: Path, tokenizer: Any) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        proj = folder / PROJECTION_FILE
        if self.projection is not None:
            state = {k: v.detach().cpu().contiguous() for k, v in self.projection.state_dict().items()}
            torch.save(state, proj)
        elif proj.exists():
            proj.unlink()


class HybridModel(torch.nn.Module):
    """Dual hybrid encoder: a query tower and a document tower (one shared tower by default).

    Build with :meth:`from_pretrained`; :meth:`encode` maps texts to ``(dense, sparse)`` tensors
    and :meth:`save` writes a folder for :class:`hybridret.encoders.JointEncoder`.
    """

    def __init__(self, towers: dict[str, HybridTower], tokenizer: Any, *, max_length: int = 256,
                 source: str | None = None) -> None:
        super().__init__()
        if set(towers) not in ({"shared"}, set(SEPARATE_TOWERS)):
            raise EncoderError(f"towers must be 'shared' or 'query' + 'document', got {sorted(towers)}")
        self.towers = torch.nn.ModuleDict(towers)
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.source = source

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, shared: bool | None = None,  # loads with trust_remote_code=False
                        projection_dim: int | None = None, max_length: int = 256,
                        device: str | None = None) -> HybridModel:
        """Load a ``*ForMaskedLM`` checkpoint, a plain encoder (a new tied MLM head is added), or a
        folder written by :meth:`save` (its projection and its tower layout are kept).

        ``shared`` ``None`` keeps a saved layout (default shared); ``True``/``False`` forces one,
        copying a shared tower into two. ``projection_dim`` adds a new dense projection to towers
        that have none.
        """
        from transformers import AutoTokenizer

        root = Path(str(name_or_path)).expanduser()
        if all((root / t / "config.json").is_file() for t in SEPARATE_TOWERS):
            paths = {t: str(root / t) for t in SEPARATE_TOWERS}
        else:
            paths = {"shared": resolve_model(name_or_path)}
        if shared is None:
            shared = "shared" in paths
        with LOAD_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(next(iter(paths.values())), trust_remote_code=False)
        keep = sparse_vocab_mask(tokenizer)
        towers: dict[str, HybridTower] = {}
        for tname, path in paths.items():
            tower = HybridTower(_load_backbone(path, str(name_or_path)), keep, None)
            proj = Path(path) / PROJECTION_FILE
            if proj.is_file():
                state = torch.load(proj, map_location="cpu", weights_only=True)
                out_dim, in_dim = state["weight"].shape
                tower.projection = torch.nn.Linear(in_dim, out_dim, bias="bias" in state)
                tower.projection.load_state_dict(state)
            elif projection_dim:
                tower.projection = torch.nn.Linear(int(tower.backbone.config.hidden_size), projection_dim)
            towers[tname] = tower
        if shared and "shared" not in towers:
            logger.warning("%s has separate towers; using the document tower for both", name_or_path)
            towers = {"shared": towers["document"]}
        elif not shared and "shared" in towers:
            import copy

            towers = {"query": towers["shared"], "document": copy.deepcopy(towers["shared"])}
        model = cls(towers, tokenizer, max_length=max_length, source=str(name_or_path))
        return model.to(pick_device(device))

    # -- properties -----------------------------------------------------------------------------
    @property
    def shared(self) -> bool:
        return "shared" in self.towers

    @property
    def query_tower(self) -> HybridTower:
        return self.towers["shared" if self.shared else "query"]  # type: ignore[return-value]

    @property
    def document_tower(self) -> HybridTower:
        return self.towers["shared" if self.shared else "document"]  # type: ignore[return-value]

    @property
    def vocab_size(self) -> int:
        return self.query_tower.vocab_size

    @property
    def dense_dim(self) -> int:
        return self.query_tower.dense_dim

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # -- encoding -------------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """``(input_ids, attention_mask)`` on the model's device, cut to ``max_length`` tokens
        (keeping the closing special token, as the inference encoders do)."""
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def forward(self, input_ids: Any, attention_mask: Any, side: str = "query") -> tuple[Any, Any]:
        """``(dense (B, d), sparse (B, V))`` through the query or the document tower."""
        if side not in ("query", "document"):
            raise EncoderError(f"side must be 'query' or 'document', got {side!r}")
        tower = self.query_tower if side == "query" else self.document_tower
        return tower(input_ids, attention_mask)

    def encode(self, texts: Sequence[str], side: str = "query") -> tuple[Any, Any]:
        """Tokenise and encode texts (with gradients unless called under ``torch.no_grad``)."""
        ids, mask = self.tokenize(texts)
        return self(ids, mask, side)

    # -- saving ---------------------------------------------------------------------------------
    def save(self, folder: str | Path, *, manifest: dict[str, Any] | None = None) -> Path:
        """Write a folder that :class:`~hybridret.encoders.JointEncoder` loads directly (shared tower),
        or ``query/`` and ``document/`` sub-folders that it loads each (separate towers), plus
        ``training.json`` when ``manifest`` is given."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        if self.shared:
            self.query_tower.save(out, self.tokenizer)
        else:
            for name in SEPARATE_TOWERS:
                self.towers[name].save(out / name, self.tokenizer)  # type: ignore[operator]
        if manifest is not None:
            body = {"towers": "shared" if self.shared else list(SEPARATE_TOWERS), **manifest}
            tmp = out / (MANIFEST_FILE + ".tmp")
            tmp.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
            tmp.replace(out / MANIFEST_FILE)
        return out
