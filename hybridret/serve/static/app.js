// The hybridret search page: plain DOM, no framework, nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const SNIPPET_CHARS = 600;
const EXPANSION_FLOOR = 0.05;  // = hybridret.search.snippets.EXPANSION_FLOOR (tests/test_expansion_terms.py checks)

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function fmt(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  const a = Math.abs(x);
  return a >= 100 ? x.toFixed(1) : a >= 10 ? x.toFixed(2) : x.toFixed(3);
}

// Does a word of the text contain one of the matched (non-expansion) sparse terms?
// Terms are word pieces: "bread", or "##ing" (a continuation of a word).
function wordMatches(word, terms) {
  const w = word.toLowerCase().normalize("NFD").replace(/[\u0300-\u036f]/g, "");
  for (const t of terms) {
    if (t.startsWith("##")) {
      const piece = t.slice(2);
      if (piece.length >= 3 && w.length > piece.length && w.endsWith(piece)) return true;
    } else if (w === t || (t.length >= 4 && w.startsWith(t))) {
      return true;
    }
  }
  return false;
}

// The text as DOM nodes, matched terms wrapped in <mark> (built with text nodes: no HTML injection).
function highlighted(text, terms) {
  const frag = document.createDocumentFragment();
  const parts = text.split(/([\p{L}\p{N}]+)/u);
  for (let i = 0; i < parts.length; i++) {
    const part = parts[i];
    if (!part) continue;
    if (i % 2 === 1 && terms.length && wordMatches(part, terms)) frag.appendChild(el("mark", null, part));
    else frag.appendChild(document.createTextNode(part));
  }
  return frag;
}

// A snippet's text with the given [start, end) spans wrapped in <mark> (text nodes only).
function marked(text, spans) {
  const frag = document.createDocumentFragment();
  let at = 0;
  for (const [a, b] of spans) {
    if (a < at || b > text.length) continue;
    if (a > at) frag.appendChild(document.createTextNode(text.slice(at, a)));
    frag.appendChild(el("mark", null, text.slice(a, b)));
    at = b;
  }
  if (at < text.length) frag.appendChild(document.createTextNode(text.slice(at)));
  return frag;
}

// A grouped result's group heading: the group's key, rank and score.
function renderGroup(group) {
  const li = el("li", "group");
  li.appendChild(el("span", "rank", group.rank + "."));
  li.appendChild(el("span", "title", String(group.key)));
  li.appendChild(el("span", "id", group.size + (group.size === 1 ? " chunk" : " chunks") + " · score " + fmt(group.score)));
  return li;
}

function barRow(name, value, max, cls) {
  const row = el("div", "bar-row");
  row.appendChild(el("span", "name", name));
  const bar = el("div", "bar " + cls);
  const fill = el("span");
  const frac = max > 0 && value !== null ? Math.max(0.02, Math.min(1, value / max)) : 0;
  fill.style.width = (frac * 100).toFixed(1) + "%";
  bar.appendChild(fill);
  row.appendChild(bar);
  row.appendChild(el("span", "val", fmt(value)));
  row.title = name + " score " + (value === null ? "n/a" : value);
  return row;
}

function renderHit(hit, maxima) {
  const li = el("li", "hit");
  li.dataset.id = hit.id;
  const head = el("div", "head");
  head.appendChild(el("span", "rank", hit.rank + "."));
  head.appendChild(el("span", "title", hit.title || hit.id));
  head.appendChild(el("span", "id", hit.id));
  if (typeof hit.relevance === "number") {  // calibrated: the probability that this hit is relevant
    const rel = el("span", "relevance", "relevance " + hit.relevance.toFixed(2));
    rel.title = "calibrated probability that this hit is relevant (0.5 = even odds)";
    head.appendChild(rel);
    if (hit.relevance < threshold()) li.classList.add("below");
  }
  li.appendChild(head);

  const body = el("div", "body");
  const terms = (hit.matched_terms || []);
  const p = el("p", "snippet");
  if (hit.snippets && hit.snippets.length) {
    // the server's snippet: the best window of the text, matched words decided at word level
    const s = hit.snippets[0];
    if (s.start > 0) p.appendChild(document.createTextNode("… "));
    p.appendChild(marked(s.text, s.highlights || []));
    if (hit.text && s.end < hit.text.length) p.appendChild(document.createTextNode(" …"));
  } else {
    const literal = terms.filter((m) => !m.expansion).map((m) => m.term.toLowerCase());
    let text = hit.text || "";
    if (text.length > SNIPPET_CHARS) text = text.slice(0, SNIPPET_CHARS).replace(/\s+\S*$/, "") + " …";
    p.appendChild(highlighted(text, literal));
  }
  body.appendChild(p);

  // expansion terms by contribution (query weight x document weight); those under EXPANSION_FLOOR of
  // the hit's learned-sparse score (hybridret.search.snippets.EXPANSION_FLOOR) are counted, not shown
  const expansion = terms.filter((m) => m.expansion).sort((a, b) => b.contribution - a.contribution);
  const shown = expansion.filter((m) => (m.share ?? 1) >= EXPANSION_FLOOR);
  const minor = expansion.length - shown.length;
  if (expansion.length) {
    const exp = el("div", "exp");
    exp.appendChild(el("span", "label", "expansion terms:"));
    for (const m of shown.slice(0, 12)) {
      const chip = el("span", "chip", m.term);
      chip.title = "contribution " + fmt(m.contribution) + " (" + Math.round(100 * (m.share ?? 0)) +
        "% of the sparse score; not in the text)";
      exp.appendChild(chip);
    }
    if (minor > 0 || shown.length > 12) {
      const more = minor + Math.max(0, shown.length - 12);
      const note = el("span", "minor", "+" + more + " minor");
      note.title = more + " more expansion terms, each under " + Math.round(100 * EXPANSION_FLOOR) +
        "% of the sparse score";
      exp.appendChild(note);
    }
    body.appendChild(exp);
  }
  const meta = Object.entries(hit.metadata || {});
  if (meta.length) {
    const box = el("div", "meta");
    box.appendChild(el("span", "label", "metadata:"));
    for (const [key, value] of meta.slice(0, 12)) {
      box.appendChild(el("span", "chip", key + ": " + (typeof value === "string" ? value : JSON.stringify(value))));
    }
    body.appendChild(box);
  }
  li.appendChild(body);

  const scores = el("div", "scores");
  scores.appendChild(barRow("fused", hit.score, maxima.fused, "fused"));
  for (const name of ["rerank", "dense", "sparse", "bm25"]) {
    if (name in (hit.scores || {})) scores.appendChild(barRow(name, hit.scores[name], maxima[name], name));
  }
  li.appendChild(scores);
  return li;
}

function threshold() {
  const t = Number($("threshold").value);
  return Number.isFinite(t) ? Math.min(Math.max(t, 0), 1) : 0.5;
}

function showAnswer(answerability) {
  // the query's answerability: below the threshold, the "nothing relevant found" state
  const box = $("answer");
  if (typeof answerability !== "number") { box.hidden = true; box.textContent = ""; return; }
  const low = answerability < threshold();
  box.className = low ? "answer none" : "answer";
  box.textContent = low
    ? "Nothing relevant found: answerability " + answerability.toFixed(2) + " (the probability that the index holds a "
      + "relevant document for this query) is below " + threshold().toFixed(2) + ". The closest hits are shown dimmed."
    : "answerability " + answerability.toFixed(2) + ": the index likely holds a relevant document for this query";
  box.hidden = false;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function search(event) {
  if (event) event.preventDefault();
  const query = $("q").value.trim();
  showError("");
  if (!query) { showError("Type a query first."); return; }
  const body = { query, k: Number($("k").value) || 10, method: $("method").value };
  const offset = Number($("offset").value) || 0;
  if (offset > 0) body.offset = offset;
  const groupBy = $("group-by").value.trim();
  if (groupBy) body.group_by = groupBy;
  if ($("rerank").checked) body.rerank = true;
  if ($("relevance").checked) body.relevance = true;
  const diversify = $("diversify").value.trim();
  if (diversify) {
    const lam = Number(diversify);
    if (!(lam >= 0 && lam <= 1)) { showError("diversify must be a number from 0 to 1 (1 = pure relevance)."); return; }
    body.diversify = lam;
  }
  const filter = $("filter").value.trim();
  if (filter) {
    try { body.filter = JSON.parse(filter); } catch (e) { showError("The filter is not valid JSON: " + e.message); return; }
  }
  const headers = { "Content-Type": "application/json" };
  const key = $("apikey").value.trim();
  if (key) headers.Authorization = "Bearer " + key;
  $("go").disabled = true;
  $("results").setAttribute("aria-busy", "true");
  try {
    let resp = await fetch("/search", { method: "POST", headers, body: JSON.stringify(body) });
    let data = await resp.json();
    if (!resp.ok && body.relevance && /calibration/.test((data.error && data.error.message) || "")) {
      // an index without a relevance calibration for its models: search without it, and say so
      delete body.relevance;
      $("relevance").checked = false;
      showError((data.error && data.error.message) + " (searched without relevance)");
      resp = await fetch("/search", { method: "POST", headers, body: JSON.stringify(body) });
      data = await resp.json();
    }
    showAnswer(resp.ok ? data.results[0].answerability : undefined);
    if (!resp.ok) {
      showError((data.error && data.error.message) || ("HTTP " + resp.status));
      $("results").replaceChildren();
      $("summary").textContent = "";
      return;
    }
    const hits = data.results[0].hits;
    const maxima = { fused: 0, dense: 0, sparse: 0, bm25: 0 };
    for (const h of hits) {
      maxima.fused = Math.max(maxima.fused, h.score || 0);
      for (const [n, v] of Object.entries(h.scores || {})) maxima[n] = Math.max(maxima[n] || 0, v);
    }
    const groups = data.results[0].groups;
    const items = [];
    if (groups) {  // the hits follow in group order: each group's heading, then its chunks
      let at = 0;
      for (const g of groups) {
        items.push(renderGroup(g));
        for (const h of hits.slice(at, at + g.size)) items.push(renderHit(h, maxima));
        at += g.size;
      }
    } else {
      for (const h of hits) items.push(renderHit(h, maxima));
    }
    $("results").replaceChildren(...items);
    const count = groups ? groups.length + " groups (" + hits.length + " chunks)" : hits.length + " hits";
    $("summary").textContent = count + " · " + data.resolved + " · " + data.took_ms.toFixed(1) + " ms";
  } catch (e) {
    showError("The server did not answer: " + e.message);
  } finally {
    $("go").disabled = false;
    $("results").removeAttribute("aria-busy");
  }
}

async function status() {
  try {
    const resp = await fetch("/health");
    const h = await resp.json();
    const where = h.commits ? Object.keys(h.commits).length + " shards" : "commit " + h.commit;
    const count = h.num_chunks
      ? h.num_documents.toLocaleString() + " documents (" + h.num_chunks.toLocaleString() + " chunks)"
      : h.num_docs.toLocaleString() + " documents";
    $("status").textContent = count + " · " + where;
  } catch (e) {
    $("status").textContent = "server unreachable";
  }
}

$("search-form").addEventListener("submit", search);
status();
