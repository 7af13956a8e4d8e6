// sleuth view: the page. No framework, no build step, no network but this server.
// Every text that comes from a run (model output, passages, questions, config) enters the document
// through text nodes (h() below), never as HTML.
"use strict";

const state = {
  info: null,          // /api/info
  src: 0,              // the directory shown
  metrics: [],         // metrics.jsonl rows of state.src
  metricsNext: 0,
  metricsGen: -1,
  extra: [],           // metric keys the user added as charts
  offset: 0,
  limit: 50,
  filters: {},
  selected: null,      // row number of the open trajectory
};

// ---------- DOM helpers ----------
function h(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "style") Object.assign(node.style, v);  // CSSOM: the page's CSP allows no style attributes
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}
const $ = (sel) => document.querySelector(sel);
const fmt = (v, d = 3) => (v === null || v === undefined || Number.isNaN(v)) ? "–" :
  (Number.isInteger(v) ? String(v) : Number(v).toFixed(d));

async function api(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const r = await fetch(path + (q.toString() ? "?" + q : ""));
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// ---------- routing: #view?key=value ----------
function route() {
  const [view, query] = (location.hash.slice(1) || "").split("?");
  return { view: view || "", params: new URLSearchParams(query || "") };
}
function go(view, params) {
  const q = new URLSearchParams(params || {}).toString();
  const hash = "#" + view + (q ? "?" + q : "");
  if (location.hash === hash) render(); else location.hash = hash;
}

// ---------- curves ----------
const COLORS = ["#2b6cd4", "#d4572b", "#1f9d6b", "#9b51e0", "#c7a000", "#e0457b", "#4aa3c8", "#7a7a7a"];
const CHARTS = [
  { id: "reward", title: "Reward", keys: ["reward/mean", "reward/em", "reward/f1", "reward/format"] },
  { id: "eval", title: "Eval EM (per data source)", match: /^eval\/([^/]+\/)?em$/ },
  { id: "searches", title: "Searches per sample", keys: ["rollout/searches_mean", "eval/searches"], match: /^eval\/[^/]+\/searches$/ },
  { id: "length", title: "Response length (tokens)", keys: ["rollout/response_tokens_mean"] },
  { id: "stop", title: "Stop reasons (share of trajectories)", derive: stopShares },
  { id: "kl", title: "KL", keys: ["algo/kl", "algo/approx_kl"] },
  { id: "entropy", title: "Entropy", keys: ["algo/entropy"] },
  { id: "clip", title: "Clip fraction", keys: ["algo/clipfrac", "algo/clipfrac_dual"] },
  { id: "loss", title: "Loss", keys: ["algo/loss", "sft/loss"] },
];

function stopShares(rows) {
  const keys = new Set();
  for (const r of rows) for (const k of Object.keys(r)) if (k.startsWith("rollout/stop/")) keys.add(k);
  const out = {};
  for (const k of keys) {
    const pts = [];
    for (const r of rows) {
      const n = r["rollout/trajectories"], v = r[k];
      if (typeof v === "number" && typeof n === "number" && n > 0) pts.push([r.step, v / n]);
    }
    if (pts.some(([, v]) => v > 0)) out[k.slice("rollout/stop/".length)] = pts;
  }
  return out;
}

function seriesOf(rows, key) {
  const pts = [];
  for (const r of rows) if (typeof r[key] === "number" && Number.isFinite(r[key]) && typeof r.step === "number") pts.push([r.step, r[key]]);
  return pts;
}

function chartSeries(def, rows, allKeys) {
  if (def.derive) return def.derive(rows);
  const keys = [...(def.keys || [])];
  if (def.match) for (const k of allKeys) if (def.match.test(k) && !keys.includes(k)) keys.push(k);
  const out = {};
  for (const k of keys) { const pts = seriesOf(rows, k); if (pts.length) out[k] = pts; }
  return out;
}

function niceTicks(lo, hi, n) {
  const span = hi - lo || 1, raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((st) => span / st <= n) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) out.push(+v.toPrecision(10));
  return out;
}

function drawChart(def, series) {
  const W = 460, H = 210, L = 46, R = 10, T = 8, B = 24;
  const names = Object.keys(series);
  let xs = [], ys = [];
  for (const k of names) for (const [x, y] of series[k]) { xs.push(x); ys.push(y); }
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R), Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": def.title, "data-chart": def.id });
  for (const t of niceTicks(y0, y1, 4)) {
    svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: Y(t), y2: Y(t) }));
    svg.append(s("text", { x: L - 4, y: Y(t) + 3, "text-anchor": "end" }, fmt(t, Math.abs(t) < 10 ? 3 : 1)));
  }
  for (const t of niceTicks(x0, x1, 6)) if (Number.isInteger(t)) svg.append(s("text", { x: X(t), y: H - 8, "text-anchor": "middle" }, t));
  svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  names.forEach((k, j) => {
    const pts = series[k];
    const color = COLORS[j % COLORS.length];
    if (pts.length === 1) svg.append(s("circle", { cx: X(pts[0][0]), cy: Y(pts[0][1]), r: 3.5, fill: color, class: "dot", "data-key": k }));
    else svg.append(s("polyline", { class: "series", stroke: color, "data-key": k, points: pts.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ") }));
  });
  const cursor = s("line", { class: "cursor", y1: T, y2: H - B, visibility: "hidden" });
  svg.append(cursor);
  const tip = h("div", { class: "tip", hidden: true });
  svg.addEventListener("mousemove", (ev) => {
    const box = svg.getBoundingClientRect();
    const x = x0 + ((ev.clientX - box.left) * W / box.width - L) / (W - L - R) * (x1 - x0);
    let best = null;
    for (const k of names) for (const [px] of series[k]) if (best === null || Math.abs(px - x) < Math.abs(best - x)) best = px;
    if (best === null) return;
    cursor.setAttribute("x1", X(best)); cursor.setAttribute("x2", X(best)); cursor.setAttribute("visibility", "visible");
    const lines = [`step ${best}`];
    for (const k of names) { const p = series[k].find(([px]) => px === best); if (p) lines.push(`${k}: ${fmt(p[1], 4)}`); }
    tip.textContent = lines.join("\n"); tip.hidden = false;
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; });
  const legend = h("div", { class: "legend" }, names.map((k, j) => h("span", {}, h("i", { style: { background: COLORS[j % COLORS.length] } }), k)));
  return h("div", { class: "chart", "data-chart": def.id }, h("h3", {}, def.title), svg, tip, legend);
}

function renderCurves() {
  const rows = state.metrics;
  const allKeys = new Set();
  for (const r of rows) for (const [k, v] of Object.entries(r)) if (typeof v === "number" && k !== "step") allKeys.add(k);
  const charts = $("#charts");
  charts.replaceChildren();
  const defs = CHARTS.concat(state.extra.map((k) => ({ id: "extra:" + k, title: k, keys: [k] })));
  for (const def of defs) {
    const series = chartSeries(def, rows, allKeys);
    if (Object.keys(series).length) charts.append(drawChart(def, series));
  }
  $("#charts-empty").hidden = rows.length > 0;
  const pick = $("#metric-pick");
  const have = new Set([...pick.options].map((o) => o.value));
  for (const k of [...allKeys].sort()) if (!have.has(k)) pick.append(h("option", { value: k }, k));
}

async function loadMetrics() {
  const out = await api("/api/metrics", { src: state.src, since: state.metricsNext });
  if (out.generation !== state.metricsGen) {  // the file was rewritten (a resumed run): start over
    state.metricsGen = out.generation;
    if (state.metricsNext) { state.metrics = []; state.metricsNext = 0; return loadMetrics(); }
  }
  state.metrics = state.metrics.concat(out.rows);
  state.metricsNext = out.next;
  return out.rows.length;
}

// ---------- trajectories ----------
function current() { return state.info.sources[state.src]; }

function fillFacets() {
  const f = current().facets, form = $("#filters");
  for (const [name, counts] of [["data_source", f.data_sources], ["stop_reason", f.stop_reasons]]) {
    const sel = form.elements[name], keep = sel.value;
    sel.replaceChildren(h("option", { value: "" }, "any"),
      ...Object.entries(counts).sort().map(([k, n]) => h("option", { value: k }, `${k} (${n})`)));
    sel.value = keep;
  }
}

function readFilters() {
  const out = {};
  for (const el of $("#filters").elements) if (el.name && el.value !== "") out[el.name] = el.value;
  return out;
}

function writeFilters(values) {
  for (const el of $("#filters").elements) if (el.name) el.value = values[el.name] || "";
}

// Each render of a pane counts itself; an answer that arrives after a newer request was made is dropped
// (a poll and a filter change, say, may answer out of order).
const latest = {};
async function fresh(pane, request) {
  const ticket = (latest[pane] = (latest[pane] || 0) + 1);
  const out = await request;
  return ticket === latest[pane] ? out : null;
}

async function renderList() {
  const body = $("#list tbody");
  const out = await fresh("list", api("/api/samples", { src: state.src, offset: state.offset, limit: state.limit, ...state.filters }));
  if (!out) return null;
  body.replaceChildren(...out.rows.map((r) => h("tr", {
      dataset: { i: r.i }, class: r.i === state.selected ? "selected" : "",
      onclick: () => go("trajectories", { ...state.filters, src: state.src, offset: state.offset, i: r.i }) },
    h("td", { class: "num" }, r.step ?? "–"), h("td", { class: "src", title: r.data_source }, r.data_source),
    h("td", { class: "q", title: r.question }, r.question), h("td", { class: "a", title: r.answer ?? "" }, r.answer ?? "–"),
    h("td", { class: "num" }, fmt(r.reward, 2)), h("td", { class: "num" }, fmt(r.em, 0)),
    h("td", { class: "num" }, r.searches), h("td", {}, r.stop_reason ?? "–"))));
  const end = Math.min(out.total, state.offset + out.rows.length);
  $("#page-info").textContent = out.total ? `${state.offset + 1}–${end} of ${out.total}` + (out.complete ? "" : ` (indexing: ${out.indexed_rows} rows so far)`) : (out.complete ? "no trajectories match" : "indexing…");
  $("#prev").disabled = state.offset === 0;
  $("#next").disabled = end >= out.total;
  return out;
}

function chip(text, kind) { return h("span", { class: "chip" + (kind ? " " + kind : "") }, text); }

function segmentBlock(seg) {
  const trained = seg.kind === "sampled";
  const role = seg.role || (trained ? "sampled" : "injected");  // files written before roles were recorded
  const label = trained ? `sampled · trained · ${seg.n_tokens ?? "?"} tokens`
    : (role === "injected" ? "" : role.replace("_", " ") + " · ") + `injected · not trained · ${seg.n_tokens ?? "?"} tokens`;
  return h("div", { class: `seg ${trained ? "sampled" : "injected"} ${role}`, dataset: { kind: seg.kind, role } },
    h("div", { class: "label" }, label), h("pre", {}, ...showNewlines(seg.text)));
}

// Newlines that open or close a segment are part of what the model saw: shown as ↵ marks, not as blank lines.
function showNewlines(text) {
  const m = /^(\n*)([\s\S]*?)(\n*)$/.exec(text || "");
  const mark = (n) => n ? h("span", { class: "nl", title: `${n} newline${n > 1 ? "s" : ""}` }, "↵".repeat(n)) : null;
  return [mark(m[1].length), m[2], mark(m[3].length)].filter((x) => x !== null && x !== "");
}

function searchesBlock(rec) {
  const out = [];
  const turns = Array.isArray(rec.turns_detail) ? rec.turns_detail : null;
  if (turns) {
    let n = 0;
    for (const t of turns) {
      if (t.action !== "search") continue;
      n += 1;
      if (t.executed === false) { out.push(h("div", { class: "search" }, h("span", { class: "query" }, `${n}. ${t.query ?? "(no query)"}`), " ", chip("not executed", "warn"))); continue; }
      const searches = t.searches || [{ query: t.query, passages: (t.passage_ids || []).map((id, j) => ({ id, title: (t.titles || [])[j], text: null })) }];
      for (const q of searches) {
        out.push(h("div", { class: "search" },
          h("div", {}, h("span", { class: "query" }, `${n}. ${q.query}`), t.error ? chip(t.error, "bad") : null),
          (q.passages || []).map((p, j) => h("details", { class: "passage" },
            h("summary", {}, h("span", { class: "pid" }, `#${j + 1} ${p.id}`), p.title || ""),
            h("pre", { class: "text" }, p.text ?? "(text not recorded in this file)")))));
      }
    }
  } else if (Array.isArray(rec.queries)) {
    rec.queries.forEach((q, j) => out.push(h("div", { class: "search" }, h("span", { class: "query" }, `${j + 1}. ${q}`), " ",
      h("span", { class: "pid" }, ((rec.passage_ids || [])[j] || []).join(", ")))));
  }
  return out.length ? out : [h("p", { class: "muted" }, "No searches.")];
}

function transcript(rec) {
  const segs = Array.isArray(rec.segments) ? rec.segments : null;
  const blocks = [];
  if (rec.prompt) blocks.push(h("details", { class: "seg injected prompt", dataset: { kind: "injected", role: "prompt" } },
    h("summary", { class: "label" }, `prompt · injected · not trained · ${rec.prompt.n_tokens} tokens`), h("pre", {}, rec.prompt.text)));
  if (segs) blocks.push(...segs.map(segmentBlock));
  else if (rec.response) blocks.push(h("div", { class: "seg" }, h("div", { class: "label" }, "response (this file has no segments: masks unknown)"), h("pre", {}, rec.response)));
  return blocks;
}

function stopKind(stop) { return stop === "answered" ? "good" : (stop ? "warn" : ""); }

function recordView(rec, i, src) {
  const sampled = (rec.segments || []).filter((x) => x.kind === "sampled").reduce((a, x) => a + (x.n_tokens || 0), 0);
  const injected = (rec.segments || []).filter((x) => x.kind !== "sampled").reduce((a, x) => a + (x.n_tokens || 0), 0);
  return h("div", { class: "record", dataset: { i } },
    h("h2", {}, rec.question ?? ""),
    h("div", {},
      chip(rec.data_source), rec.step !== undefined ? chip(`step ${rec.step}`) : null,
      rec.sample_index !== undefined ? chip(`sample ${rec.sample_index}`) : null,
      rec.reward !== undefined && rec.reward !== null ? chip(`reward ${fmt(rec.reward, 3)}`, rec.reward > 0 ? "good" : "") : null,
      chip(`EM ${fmt(rec.em, 0)}`, rec.em ? "good" : "bad"), chip(`F1 ${fmt(rec.f1, 2)}`),
      chip(rec.stop_reason ?? "no stop reason", stopKind(rec.stop_reason)), chip(`${rec.searches} searches`),
      rec.segments ? chip(`${sampled} sampled / ${injected} injected tokens`) : null),
    h("div", {}, h("b", {}, "gold: "), (rec.golden_answers || []).join(" | ")),
    h("div", {}, h("b", {}, "parsed answer: "), rec.answer ?? h("span", { class: "muted" }, "(none)")),
    h("div", { class: "muted" }, `id ${rec.question_id}`, " · ",
      h("a", { href: "#compare?" + new URLSearchParams({ qid: rec.question_id }) }, "this question across steps and directories")),
    h("h4", {}, "Searches"), searchesBlock(rec),
    h("h4", {}, "Transcript"),
    h("div", { class: "legend-masks" },
      h("span", {}, h("i", { class: "sw-sampled" }), "sampled (trained)"),
      h("span", {}, h("i", { class: "sw-info" }), "information (injected, not trained)"),
      h("span", {}, h("i", { class: "sw-injected" }), "other injected: prompt, nudge, corrective (not trained)")),
    transcript(rec));
}

async function renderDetail() {
  const pane = $("#detail");
  if (state.selected === null) { pane.replaceChildren(h("p", { class: "muted" }, "Pick a trajectory on the left.")); return; }
  const out = await fresh("detail", api("/api/sample", { src: state.src, i: state.selected }));
  if (out) pane.replaceChildren(recordView(out.record, out.i, state.src));
}

// ---------- compare ----------
async function renderPairs() {
  const box = $("#pairs");
  const n = state.info.sources.length;
  if (n < 2) { box.replaceChildren(h("p", { class: "muted" }, "Open two directories (sleuth view A B) to compare them question by question; one question's samples across steps are below.")); return; }
  const a = 0, b = state.src === 0 ? 1 : state.src;  // the first directory (a baseline) against the shown one
  const changed = box.dataset.changed === "1";
  const out = await fresh("pairs", api("/api/pairs", { a, b, changed, limit: 200 }));
  if (!out) return;
  const [na, nb] = [state.info.sources[a].name, state.info.sources[b].name];
  const toggle = h("label", {}, h("input", { type: "checkbox", id: "changed-only", checked: changed,
    onchange: (ev) => { box.dataset.changed = ev.target.checked ? "1" : "0"; renderPairs(); } }), " only questions whose EM changed");
  box.replaceChildren(h("div", {}, h("b", {}, `${na} → ${nb}: `), `${out.gained} gained, ${out.lost} lost, ${out.total} listed `, toggle),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "question"), h("th", {}, "source"), h("th", {}, `${na} answer`), h("th", {}, "EM"), h("th", {}, `${nb} answer`), h("th", {}, "EM"))),
      h("tbody", {}, out.rows.map((r) => h("tr", { onclick: () => go("compare", { qid: r.question_id }) },
        h("td", {}, r.question), h("td", {}, r.data_source), h("td", {}, r.a.answer ?? "–"), h("td", { class: "num" }, fmt(r.a.em, 0)),
        h("td", {}, r.b.answer ?? "–"), h("td", { class: "num" }, fmt(r.b.em, 0)))))));
}

async function renderCompare(qid) {
  const out$ = $("#compare-out");
  $("#compare-form").elements.qid.value = qid || "";
  if (!qid) { out$.replaceChildren(); return; }
  const out = await fresh("compare", api("/api/compare", { qid }));
  if (!out) return;
  const cols = [];
  for (const src of out.sources) for (const rec of src.records) {
    cols.push(h("div", { class: "col" }, h("h3", {}, `${src.name}` + (rec.step !== undefined ? ` · step ${rec.step}` : "") + (rec.sample_index !== undefined ? ` · sample ${rec.sample_index}` : "")),
      h("div", {}, chip(`EM ${fmt(rec.em, 0)}`, rec.em ? "good" : "bad"), rec.reward !== undefined && rec.reward !== null ? chip(`reward ${fmt(rec.reward, 3)}`) : null,
        chip(rec.stop_reason ?? "–", stopKind(rec.stop_reason)), chip(`${rec.searches} searches`)),
      h("div", {}, h("b", {}, "answer: "), rec.answer ?? "(none)"), transcript(rec)));
  }
  const total = out.sources.reduce((a, x) => a + x.total, 0);
  const first = out.sources.flatMap((x) => x.records)[0];
  out$.replaceChildren(...(cols.length ? cols : [h("p", { class: "muted" }, `No records of ${qid}.`)]));
  out$.prepend(h("div", { class: "col" }, h("h3", {}, first ? first.question : qid),
    h("div", {}, h("b", {}, "gold: "), first ? (first.golden_answers || []).join(" | ") : ""),
    h("p", { class: "muted" }, `${total} records of ${qid}` + (total > cols.length ? ` (first ${cols.length} shown)` : ""))));
}

// ---------- results & setting ----------
function renderSetting() {
  const src = current(), box = $("#setting-out");
  const parts = [h("h3", {}, `${src.name}: ${src.kind === "eval" ? "an eval directory" : "a run directory"}`), h("p", { class: "muted" }, src.path)];
  const sum = src.results && src.results.summary;
  if (sum) {
    const cols = ["n", "em", "cover_em", "f1", "searches", "retrieval_hit", "sampled_tokens"];
    const row = (name, r) => h("tr", {}, h("td", {}, name), cols.map((c) => h("td", { class: "num" }, fmt(r[c], c === "n" ? 0 : 3))),
      h("td", {}, Object.entries(r.stop_reasons || {}).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ")));
    parts.push(h("table", { id: "by-source" }, h("thead", {}, h("tr", {}, h("th", {}, "data source"), cols.map((c) => h("th", {}, c)), h("th", {}, "stop reasons"))),
      h("tbody", {}, Object.entries(sum.by_source || {}).map(([k, r]) => row(k, r)), row("all", sum))));
  }
  const prompts = src.results && src.results.prompt_mode;  // how the prompts were written (setting.json says what was asked)
  if (prompts) parts.push(h("p", {}, h("b", {}, "prompts: "), prompts));
  if (src.kind === "run") parts.push(h("p", {}, "Evaluate a checkpoint: ", h("span", { class: "cmd" }, `sleuth eval --model ${src.path} --out EVAL_DIR`)));
  if (src.config) parts.push(h("h4", {}, src.kind === "eval" ? "setting.json" : "config.yaml"), h("pre", {}, src.config));
  box.replaceChildren(...parts);
}

// ---------- frame ----------
function status() {
  const src = current();
  const bits = [`${src.samples} ${src.samples_file.replace(".jsonl", "")}`, `${state.metrics.length} metric rows`];
  if (!src.indexed) bits.push("indexing…");
  if (src.skipped_lines) bits.push(`${src.skipped_lines} unreadable lines skipped`);
  if (src.torn_tail) bits.push("last line incomplete (skipped)");
  if (src.error) bits.push(src.error);
  $("#status").textContent = bits.join(" · ");
}

async function loadInfo() {
  state.info = await api("/api/info");
  const pick = $("#src");
  if (pick.options.length !== state.info.sources.length) {
    pick.replaceChildren(...state.info.sources.map((x, k) => h("option", { value: k }, x.name)));
  }
  pick.value = String(state.src);
  pick.parentElement.hidden = state.info.sources.length < 2;
  fillFacets();
  status();
}

async function render() {
  const { view, params } = route();
  const name = ["curves", "trajectories", "compare", "setting"].includes(view) ? view : (current().kind === "eval" ? "trajectories" : "curves");
  if (params.has("src")) state.src = Math.min(Number(params.get("src")) || 0, state.info.sources.length - 1);
  $("#src").value = String(state.src);
  for (const v of ["curves", "trajectories", "compare", "setting"]) {
    $("#view-" + v).hidden = v !== name;
    $("#nav-" + v).classList.toggle("active", v === name);
  }
  document.body.dataset.view = name;
  if (name === "curves") renderCurves();
  else if (name === "trajectories") {
    state.filters = {};
    for (const [k, v] of params) if (!["src", "offset", "i"].includes(k)) state.filters[k] = v;
    writeFilters(state.filters);
    state.offset = Number(params.get("offset")) || 0;
    state.selected = params.has("i") ? Number(params.get("i")) : null;
    await renderList();
    await renderDetail();
  } else if (name === "compare") { await renderPairs(); await renderCompare(params.get("qid")); }
  else renderSetting();
  document.body.dataset.ready = "1";
}

async function poll() {
  try {
    const wasIndexed = state.info && current().indexed, wasRows = state.info && current().samples;
    await loadInfo();
    if (route().view === "trajectories" && (!wasIndexed || current().samples !== wasRows)) await renderList();
    const fresh = await loadMetrics();
    status();
    if (fresh && route().view === "curves") renderCurves();
  } catch (e) { $("#status").textContent = "server unreachable: " + e.message; }
}

async function main() {
  await loadInfo();
  await loadMetrics();
  status();
  $("#src").addEventListener("change", async (ev) => {
    state.src = Number(ev.target.value); state.metrics = []; state.metricsNext = 0; state.metricsGen = -1;
    await loadMetrics(); fillFacets(); status();
    go(route().view || "curves", { src: state.src });
  });
  $("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); go("trajectories", { ...readFilters(), src: state.src }); });
  $("#clear").addEventListener("click", () => go("trajectories", { src: state.src }));
  for (const sel of $("#filters").querySelectorAll("select")) sel.addEventListener("change", () => go("trajectories", { ...readFilters(), src: state.src }));
  $("#prev").addEventListener("click", () => go("trajectories", { ...state.filters, src: state.src, offset: Math.max(0, state.offset - state.limit) }));
  $("#next").addEventListener("click", () => go("trajectories", { ...state.filters, src: state.src, offset: state.offset + state.limit }));
  $("#metric-pick").addEventListener("change", (ev) => { const k = ev.target.value; if (k && !state.extra.includes(k)) state.extra.push(k); ev.target.value = ""; renderCurves(); });
  $("#compare-form").addEventListener("submit", (ev) => { ev.preventDefault(); go("compare", { qid: ev.target.elements.qid.value.trim() }); });
  window.addEventListener("hashchange", () => render().catch(showError));
  await render();
  setInterval(poll, 4000);
}

function showError(e) { $("#status").textContent = "error: " + e.message; }
main().catch(showError);
