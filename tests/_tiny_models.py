"""A tiny randomly initialised cross-encoder, built in a test (no weights can be installed here)."""

from __future__ import annotations

import json
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"


def tiny_cross_encoder(folder: Path) -> Path:
    """A randomly initialised BERT classifier with a word-level vocabulary, saved as safetensors."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    words = sorted({w.lower() for line in (SAMPLE / "corpus.jsonl").open()
                    for w in json.loads(line)["text"].replace(",", " ").replace(".", " ").split()})[:3000]
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tok = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(words) + 5, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256, num_labels=1)
    BertForSequenceClassification(cfg).eval().save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder
