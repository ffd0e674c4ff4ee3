// The page of `mage view`: runs' figures, and their meta-episodes call by call.
// Data arrives as scripts (data/site.js, data/index.js, data/chunk_NNNNN.js) so that the
// page works from a file as well as from a server. Every text is set with textContent.
"use strict";
(function () {
  const M = window.MAGE;
  const PAGE = 50;
  const state = { site: null, columns: [], rows: [], shown: [], page: 0, chunks: {}, waiting: {} };

  M.site = (site) => { state.site = site; };
  M.index = (columns, rows) => { state.columns = columns; state.rows = rows; };
  M.chunk = (n, items) => {
    state.chunks[n] = items;
    (state.waiting[n] || []).forEach((fn) => fn(items));
    delete state.waiting[n];
  };

  function col(row, name) { return row[state.columns.indexOf(name)]; }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function fmt(x, digits = 3) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    const s = Number(x).toFixed(digits);
    return x > 0 ? "+" + s : s;
  }

  function interval(est) {
    if (!est) return "–";
    return `${fmt(est.mean)} [${fmt(est.low)}, ${fmt(est.high)}]`;
  }

  // -- the runs' figures -------------------------------------------------------------

  function oracleLines(oracle) {
    if (!oracle) return {};
    const seats = Object.values(oracle).filter((o) => o && typeof o === "object");
    const mean = (key) => {
      const vals = seats.map((o) => o[key]).filter((v) => typeof v === "number");
      return vals.length ? vals.reduce((a, b) => a + b, 0) / vals.length : null;
    };
    const lines = {};
    if (mean("best_fixed") !== null) lines["best fixed (exact)"] = mean("best_fixed");
    const bayes = mean("bayes_last_hand");
    if (bayes !== null) lines["Bayes last episode (exact)"] = bayes;
    return lines;
  }

  function chart(target, title, xs, series, lines) {
    const width = Math.max(320, Math.min(720, target.clientWidth || 640));
    const names = Object.keys(series).filter((k) => series[k].some((v) => v !== null && v !== undefined));
    const colours = ["#1f6feb", "#d1242f", "#8250df", "#1a7f37", "#bf8700", "#57606a"];
    const data = [xs];
    const specs = [{}];
    names.forEach((name, i) => {
      data.push(series[name]);
      const points = name.startsWith("eval");
      specs.push({ label: name, stroke: colours[i % colours.length], width: points ? 0 : 1.5,
        points: { show: points, size: 7 }, spanGaps: !points });
    });
    Object.entries(lines || {}).forEach(([name, value], i) => {
      data.push(xs.map(() => value));
      specs.push({ label: name, stroke: "#57606a", dash: i ? [2, 4] : [8, 4], width: 1 });
    });
    const box = el("div", { class: "chart" });
    target.append(box);
    if (!xs.length || !window.uPlot) { box.append(el("p", { text: `${title}: no iterations logged` })); return; }
    new window.uPlot({ title, width, height: 240, scales: { x: { time: false } },
      axes: [{ label: "iteration" }, {}], series: specs }, data, box);
  }

  function rowsTable(rows, k) {
    const head = el("tr", {}, el("th", { text: "agent" }), el("th", { text: "n" }));
    for (let i = 1; i <= k; i++) head.append(el("th", { text: `ev@${i}` }));
    head.append(el("th", { text: `success@${k}` }));
    const body = el("tbody");
    for (const [agent, row] of Object.entries(rows)) {
      const iv = row.intervals || row; // a training report's rows, or mage eval's summaries
      const tr = el("tr", {}, el("td", { text: agent }), el("td", { text: row.n }));
      for (let i = 0; i < k; i++) tr.append(el("td", { text: interval((iv["ev@k"] || [])[i]) }));
      tr.append(el("td", { text: interval((iv["success@k"] || [])[k - 1]) }));
      body.append(tr);
    }
    return el("table", { class: "figures" }, el("thead", {}, head), body);
  }

  function decisionsTable(title, table) {
    if (!table) return null;
    const agents = Object.keys(table);
    const states = [...new Set(agents.flatMap((a) => Object.keys(table[a] || {})))];
    if (!states.length) return null;
    const head = el("tr", {}, el("th", { text: title }), ...agents.map((a) => el("th", { text: a })));
    const body = el("tbody");
    for (const s of states) {
      const tr = el("tr", {}, el("td", { text: title === "episode" ? String(Number(s) + 1) : s }));
      for (const a of agents) {
        const counts = (table[a] || {})[s] || {};
        const total = Object.values(counts).reduce((x, y) => x + y, 0);
        const cell = Object.entries(counts).sort((x, y) => y[1] - x[1])
          .map(([act, c]) => `${act} ${(c / total).toFixed(2)}`).join(" · ");
        tr.append(el("td", { text: total ? `${cell} (${total})` : "–" }));
      }
      body.append(tr);
    }
    return el("table", { class: "figures" }, el("thead", {}, head), body);
  }

  function renderRun(run) {
    const box = el("article", { class: "run" }, el("h2", { text: `${run.name} (${run.kind === "train" ? "training run" : "evaluation"})` }));
    document.getElementById("runs").append(box);
    if (run.kind === "train") {
      const c = run.curve;
      const k = c.k;
      const lines = oracleLines(run.oracle);
      chart(box, `ev by episode (training batches, evaluation points)`, c.iterations,
        { "ev@1": c.series["ev@1"], [`ev@${k}`]: c.series[`ev@${k}`], [`eval ev@${k}`]: c.series[`eval ev@${k}`] }, lines);
      chart(box, "success and invalid share (training batches)", c.iterations,
        { "success@1": c.series["success@1"], [`success@${k}`]: c.series[`success@${k}`], invalid: c.series.invalid }, {});
      if (run.rows && Object.keys(run.rows).length) {
        box.append(el("h3", { text: "Evaluation (95 % intervals)" }), rowsTable(run.rows, k));
      }
      if (Object.keys(lines).length) {
        box.append(el("p", { class: "oracle", text: Object.entries(lines).map(([n, v]) => `${n}: ${fmt(v, 4)}`).join(" · ") }));
      }
      if (run.verdicts) {
        const list = el("ul", { class: "verdicts" });
        for (const [name, v] of Object.entries(run.verdicts)) {
          if (!v || !v.last) continue;
          const other = v.other || v.first || v.untrained || v.best_fixed || {};
          list.append(el("li", { text: `${name}: last ${interval(v.last)} against ${typeof other === "number" ? fmt(other) : interval(other)}; apart: ${v.apart ? "yes" : "no"}` }));
        }
        box.append(list);
      }
      const d1 = decisionsTable("decision state", run.decisions);
      const d2 = decisionsTable("episode", run.decisions_by_episode);
      if (d1 || d2) box.append(el("h3", { text: "Answers by decision state and by episode" }));
      if (d1) box.append(d1);
      if (d2) box.append(d2);
    } else {
      const k = (run.conditions || {}).episodes || 1;
      const envs = [...new Set(Object.values(run.results || {}).flatMap((e) => Object.keys(e || {})))];
      for (const env of envs) {
        const rows = {};
        const byState = {};
        const byEpisode = {};
        for (const [agent, results] of Object.entries(run.results || {})) {
          const summary = (results || {})[env];
          if (!summary) continue;
          rows[agent] = summary;
          if (summary.decisions) byState[agent] = summary.decisions;
          if (summary.decisions_by_episode) byEpisode[agent] = summary.decisions_by_episode;
        }
        box.append(el("h3", { text: `${env} (95 % intervals)` }), rowsTable(rows, k));
        const d1 = decisionsTable("decision state", byState);
        const d2 = decisionsTable("episode", byEpisode);
        if (d1) box.append(d1);
        if (d2) box.append(d2);
      }
    }
  }

  // -- the list of meta-episodes -------------------------------------------------------

  const FILTERS = ["run", "source", "label", "iteration", "opponent", "seat", "outcome"];

  function runName(i) { return state.site.runs[i] ? state.site.runs[i].name : String(i); }

  function fillFilters() {
    const form = document.getElementById("filters");
    for (const name of FILTERS) {
      const select = form.elements[name];
      const values = [...new Set(state.rows.map((r) => col(r, name)))];
      values.sort((a, b) => (typeof a === "number" && typeof b === "number") ? a - b : String(a).localeCompare(String(b)));
      select.append(el("option", { value: "", text: "all" }));
      for (const v of values) {
        const text = name === "run" ? runName(v) : v === null ? "none (not a checkpoint)" : String(v);
        select.append(el("option", { value: String(v), text }));
      }
    }
    const update = () => { state.page = 0; applyFilters(); };
    form.addEventListener("input", update);
    form.addEventListener("change", update);
    form.addEventListener("submit", (e) => e.preventDefault());
  }

  function applyFilters() {
    const form = document.getElementById("filters");
    const wanted = {};
    for (const name of FILTERS) if (form.elements[name].value !== "") wanted[name] = form.elements[name].value;
    const seed = form.elements.seed.value.trim();
    state.shown = [];
    state.rows.forEach((row, id) => {
      for (const [name, value] of Object.entries(wanted)) if (String(col(row, name)) !== value) return;
      if (seed && String(col(row, "seed")) !== seed) return;
      state.shown.push(id);
    });
    renderList();
  }

  function renderList() {
    const body = document.querySelector("#list tbody");
    body.textContent = "";
    const pages = Math.max(1, Math.ceil(state.shown.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const slice = state.shown.slice(state.page * PAGE, (state.page + 1) * PAGE);
    for (const id of slice) {
      const row = state.rows[id];
      const rewards = (col(row, "rewards") || []).map((x) => fmt(x, 2)).join("  ");
      body.append(el("tr", { "data-id": id, class: "row", onclick: () => open(id, "pane-a") },
        el("td", { text: id }), el("td", { text: runName(col(row, "run")) }),
        el("td", { text: col(row, "label") }), el("td", { text: col(row, "opponent") }),
        el("td", { text: col(row, "seat") }), el("td", { text: col(row, "seed") }),
        el("td", { text: col(row, "rollout") }), el("td", { class: "num", text: rewards }),
        el("td", { text: col(row, "outcome") })));
    }
    document.getElementById("count").textContent = `${state.shown.length} of ${state.rows.length} meta-episodes`;
    document.getElementById("page").textContent = ` page ${state.page + 1} of ${pages} `;
  }

  // -- one meta-episode ----------------------------------------------------------------

  function load(id, done) {
    const n = Math.floor(id / state.site.chunk_size);
    const have = state.chunks[n];
    const pick = (items) => done(items.find((m) => m.id === id));
    if (have) return pick(have);
    const first = !state.waiting[n];
    (state.waiting[n] = state.waiting[n] || []).push(pick);
    if (first) {
      const script = document.createElement("script");
      script.src = `data/chunk_${String(n).padStart(5, "0")}.js`;
      document.body.append(script);
    }
  }

  function open(id, pane) {
    if (pane === "pane-a") {
      document.querySelectorAll("#list tr.open").forEach((tr) => tr.classList.remove("open"));
      const tr = document.querySelector(`#list tr[data-id="${id}"]`);
      if (tr) tr.classList.add("open");
    }
    load(id, (m) => { renderEpisode(m, pane); document.getElementById(pane).dataset.ready = String(id); });
  }

  function tokensView(call) {
    const box = el("div", { class: "response tokens" });
    call.tokens.forEach((tok, i) => {
      const lp = call.logprobs[i];
      const p = lp === undefined ? 1 : Math.exp(lp);
      box.append(el("span", { class: "tok", style: `background: rgba(209, 36, 47, ${(0.65 * (1 - p)).toFixed(3)})`,
        title: `p = ${p.toFixed(3)} (log-prob ${lp === undefined ? "–" : lp.toFixed(3)})`, text: tok }));
    });
    return box;
  }

  function promptView(prompt) {
    const details = el("details", { class: "prompt" }, el("summary", { text: "prompt" }));
    if (Array.isArray(prompt)) {
      for (const m of prompt) details.append(el("div", { class: `msg ${m.role}` }, el("b", { text: m.role + ": " }), m.content));
    } else details.append(el("pre", { text: prompt }));
    return details;
  }

  function callView(m, call, j) {
    const credit = el("div", { class: "credit" });
    const item = (name, value, cls) => credit.append(el("span", { class: cls, "data-value": value, text: `${name} ${fmt(value, 4)}` }));
    if (call.reward !== null && call.reward !== undefined) item("reward", call.reward, "reward");
    if ("advantage" in call) {
      item("return", call.ret, "ret");
      item("A_E", call.a_episode, "a-episode");
      item("A_S", call.a_step, "a-step");
      item("A", call.advantage, `adv ${call.advantage > 0 ? "pos" : call.advantage < 0 ? "neg" : ""}`);
    }
    return el("div", { class: `call ${call.kind}${call.invalid ? " invalid" : ""}`, "data-call": `${m.id}:${j}` },
      el("div", { class: "call-head" }, el("span", { class: "badge", text: call.node }),
        el("span", { class: "badge kind", text: call.kind }), `step ${call.step}`, call.invalid ? " · invalid" : ""),
      credit, promptView(call.prompt),
      call.tokens && call.tokens.length ? tokensView(call) : el("pre", { class: "response", text: call.response }));
  }

  function sameTask(m) {
    return state.rows.map((r, id) => [r, id]).filter(([r, id]) => id !== m.id && col(r, "run") === m.run
      && col(r, "seed") === m.seed && col(r, "rollout") === m.rollout && col(r, "opponent") === m.opponent
      && col(r, "seat") === m.seat && col(r, "source") === "eval").map(([, id]) => id);
  }

  function renderEpisode(m, paneId) {
    const pane = document.getElementById(paneId);
    pane.textContent = "";
    pane.dataset.id = m.id;
    const head = el("div", { class: "ep-head" },
      el("h3", { text: `#${m.id} ${runName(m.run)} · ${m.label}` }),
      el("p", { text: `${m.env} · opponent ${m.opponent} · seat ${m.seat} · task seed ${m.seed} · rollout ${m.rollout}` }));
    if (paneId === "pane-a") {
      head.append(el("button", { type: "button", class: "pin", text: "keep beside", onclick: () => renderEpisode(m, "pane-b") }));
      const others = sameTask(m);
      if (others.length) {
        const links = el("p", { class: "same" }, "same task: ");
        for (const id of others) links.append(el("a", { href: "#", "data-id": id, text: state.rows[id][state.columns.indexOf("label")],
          onclick: (e) => { e.preventDefault(); open(id, "pane-b"); } }), " ");
        head.append(links);
      }
    }
    pane.append(head);
    const calls = m.calls.map((c, j) => [c, j]);
    m.episodes.forEach((ep, k) => {
      const box = el("section", { class: "episode" },
        el("h4", { text: `episode ${k + 1}: ${ep.outcome} (reward ${fmt(ep.reward, 2)}${ep.payoff !== null ? `, payoff ${fmt(ep.payoff, 2)}` : ""})` }));
      for (const [c, j] of calls) if (c.episode === k) box.append(callView(m, c, j));
      pane.append(box);
    });
    const left = calls.filter(([c]) => c.episode >= m.episodes.length);
    if (left.length) {
      const box = el("section", { class: "episode" }, el("h4", { text: "after the last episode" }));
      for (const [c, j] of left) box.append(callView(m, c, j));
      pane.append(box);
    }
    if (m.reflections.length) {
      const list = el("ol", { class: "reflections" });
      for (const r of m.reflections) list.append(el("li", { text: r }));
      pane.append(el("h4", { text: "reflections kept" }), list);
    }
  }

  M.start = () => {
    if (!state.site) { document.body.prepend(el("p", { class: "error", text: "data/site.js did not load" })); return; }
    state.site.runs.forEach(renderRun);
    fillFilters();
    document.getElementById("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); renderList(); });
    document.getElementById("next").addEventListener("click", () => { state.page += 1; renderList(); });
    applyFilters();
    document.body.dataset.ready = "1";
  };
})();
