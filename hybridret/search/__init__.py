"""The read side: one search, from its request to its hits.

* :mod:`~hybridret.search.request`: :class:`SearchRequest`, every argument of a search checked once;
* :mod:`~hybridret.search.plan`: :func:`plan_search` -> :class:`SearchPlan` (pure data);
* :mod:`~hybridret.search.source`: where candidates come from (:class:`CandidateSource`, one snapshot);
* :mod:`~hybridret.search.run`: :func:`run_plan`, the executor and its stages (groups, reranking, pages),
  and the one assembly of :class:`~hybridret.types.Hits`;
* what the stages read: :mod:`~hybridret.search.grouping`, :mod:`~hybridret.search.rerank`,
  :mod:`~hybridret.search.snippets`, :mod:`~hybridret.search.relevance` (and its fitting,
  :mod:`~hybridret.search.calibrate`);
* :mod:`~hybridret.search.listing`: every document matching a filter;
* :mod:`~hybridret.search.searcher`: :class:`Searcher`, snapshots and encoders around all of it.

The modules are the package's inside; the public names are re-exported by :mod:`hybridret`
(``Searcher``, ``Reranker``, ``CrossEncoderReranker``) and :mod:`hybridret.fusion`. Importing this
package imports nothing (no numpy, FAISS or torch).
"""
