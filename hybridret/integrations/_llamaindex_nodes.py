"""LlamaIndex nodes as hybridret documents, and back.

A node is written as ``{"id": node.node_id, "text": <its text>, "title": <its metadata as LlamaIndex
shows it to an embedding model>, "metadata": {**node.metadata, REF: ref_doc_id, NODE_KEY: <the rest
of the node as JSON>}}``. ``NODE_KEY`` holds everything else LlamaIndex keeps on a node (class,
relationships, excluded metadata keys, templates, character offsets), so the node read back is the
node written: same id, text, metadata, relationships. It is one string, so it adds a single
metadata column, never one per relationship field. Documents hybridret indexed itself (no
``NODE_KEY``) become :class:`TextNode` objects whose ``SOURCE`` is their ``parent_id`` (or the
configured reference field), so chunks of one document name it as ``node.ref_doc_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, CorpusFormatError
from ._common import require

require("llama_index.core", "llamaindex", "LlamaIndex")

from llama_index.core.schema import (  # noqa: E402
    BaseNode,
    Document,
    ImageNode,
    IndexNode,
    MetadataMode,
    Node,
    NodeRelationship,
    RelatedNodeInfo,
    TextNode,
)

__all__ = ["NODE_KEY", "REF_KEY", "node_to_entry", "stored_to_node"]

NODE_KEY = "_llamaindex"  # the node's LlamaIndex fields other than id, text and metadata (a JSON string)
REF_KEY = "parent_id"  # default metadata field of a node's ref_doc_id: the field hybridret's chunking uses
_CLASSES: dict[str, type[BaseNode]] = {c.class_name(): c for c in (TextNode, IndexNode, ImageNode, Document, Node)}
_NOT_STORED = {"id_", "embedding", "metadata", "text", "text_resource", "obj", "class_name"}
_MARK_ADDED = "ref_added"  # in NODE_KEY: the metadata field the store added ref_doc_id as (removed when read)


def ref_doc_id_of(node: BaseNode) -> str | None:
    """The document a node belongs to: its ``SOURCE`` node, or for a ``Document`` itself."""
    ref = node.ref_doc_id
    if ref is None and isinstance(node, Document):
        return node.node_id
    return None if ref is None else str(ref)


def node_to_entry(node: BaseNode, *, ref_key: str = REF_KEY, embed_metadata: bool = True) -> dict[str, Any]:
    """A hybridret document for ``node``: its text is what hybridret encodes and returns; with
    ``embed_metadata`` its metadata string (``MetadataMode.EMBED``: keys not in
    ``excluded_embed_metadata_keys``) is the title, encoded with the text as LlamaIndex embeds it."""
    if not isinstance(node, BaseNode):
        raise CorpusFormatError(f"expected LlamaIndex nodes (TextNode, Document, ...), got {type(node).__name__}")
    text = node.get_content(metadata_mode=MetadataMode.NONE)
    title = node.get_metadata_str(mode=MetadataMode.EMBED) if embed_metadata else ""
    if not (text or "").strip() and not title.strip():
        raise CorpusFormatError(f"node {node.node_id!r} has no text; hybridret indexes text (an image or "
                                "empty node cannot be searched)")
    meta = dict(node.metadata or {})
    for key in (NODE_KEY,):
        if key in meta:
            raise ConfigError(f"node {node.node_id!r}: metadata key {key!r} is reserved for the node's LlamaIndex "
                              "fields; rename it")
    extra = node.model_dump(mode="json", exclude=_NOT_STORED)
    extra["class_name"] = node.class_name()
    ref = ref_doc_id_of(node)
    if ref is not None:
        if ref_key in meta and meta[ref_key] != ref:
            raise ConfigError(f"node {node.node_id!r}: metadata field {ref_key!r} is {meta[ref_key]!r} but the "
                              f"node's ref_doc_id is {ref!r}; the store keeps ref_doc_id in {ref_key!r} "
                              "(choose another ref_doc_id_key, or rename the field)")
        if ref_key not in meta:
            meta[ref_key] = ref
            extra[_MARK_ADDED] = ref_key
    meta[NODE_KEY] = json.dumps(extra, ensure_ascii=False, separators=(",", ":"))
    entry: dict[str, Any] = {"id": node.node_id, "text": text, "metadata": meta}
    if title:
        entry["title"] = title
    return entry


def stored_to_node(doc_id: str, text: str, title: str, metadata: Mapping[str, Any] | None, *,
                   ref_key: str = REF_KEY) -> BaseNode:
    """The node a stored hybridret document holds: the one written by :func:`node_to_entry`, or a
    :class:`TextNode` for a document hybridret indexed itself (its title, if any, in the metadata
    as ``"title"``; its ``ref_key`` field, if a string, as its ``SOURCE``)."""
    meta = dict(metadata or {})
    raw = meta.pop(NODE_KEY, None)
    if not isinstance(raw, str):
        if title:
            meta.setdefault("title", title)
        relationships = {}
        ref = meta.get(ref_key)
        if isinstance(ref, str) and ref:
            relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=ref)
        return TextNode(id_=doc_id, text=text or "", metadata=meta, relationships=relationships)
    try:
        extra = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"document {doc_id!r}: its {NODE_KEY!r} metadata is not the JSON the LlamaIndex store "
                          f"writes ({exc})") from None
    added = extra.pop(_MARK_ADDED, None)
    if isinstance(added, str):
        meta.pop(added, None)
    cls = _CLASSES.get(str(extra.pop("class_name", "")), TextNode)
    node = cls.model_validate({**extra, "id_": doc_id, "metadata": meta})
    node.set_content(text or "")
    return node
