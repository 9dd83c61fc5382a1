"use strict";
(() => {
  const { $, el, fmtInt, fmtNum, fmtPct, fmtBytes, fmtTime, badge, bar, setText } = KV;
  KV.initTheme();
  let state = null;
  const num = (v) => (v === undefined || v === null ? "—" : String(v));
  const workers = new KV.Table({
    root: $("#workers"), key: "id", label: "Workers", pageSize: 25,
    columns: [
      { key: "id", label: "Worker" },
      { key: "model", label: "Model" },
      { key: "state", label: "State", fmt: (v) => badge(v) },
      { key: "gpu_blocks", label: "GPU blocks", num: true, fmt: fmtInt },
      { key: "cpu_blocks", label: "CPU blocks", num: true, fmt: fmtInt },
      { key: "disk_blocks", label: "Disk blocks", num: true, fmt: fmtInt },
      { key: "event_rate", label: "Batches/s", num: true, fmt: (v) => fmtNum(v) },
      { key: "last_seq", label: "Last seq", num: true, fmt: (v) => String(v) },
      { key: "gaps", label: "Gaps", num: true },
      { key: "replayed", label: "Replayed", num: true },
      { key: "resets", label: "Resets", num: true },
      { key: "lag_seconds", label: "Lag (s)", num: true, fmt: (v) => fmtNum(v, 2) },
    ],
    actions: (w) => KV.token() ? el("button", { type: "button", text: "Unregister", "aria-label": "Unregister " + w.id,
      onclick: async () => {
        if (!confirm("Unregister worker " + w.id + " and drop its blocks?")) return;
        try { await KV.api("/unregister", { worker_id: w.id }, true); setText("workers-msg", "unregistered " + w.id); }
        catch (e) { setText("workers-msg", "unregister " + w.id + ": " + e.message); }
      } }) : el("span", { class: "muted", text: "—" }),
  });
  KV.initToken(() => workers.render());

  function render(s) {
    state = s;
    setText("node-id", s.node_id);
    const c = s.cluster;
    setText("c-leader", c.leader || "none");
    setText("c-term", num(c.term));
    setText("c-commit", num(c.commit_index));
    setText("c-applied", num(c.applied_index));
    $("#members").replaceChildren(
      el("thead", {}, el("tr", {}, ...["Member", "Raft address", "Suffrage", "Role", "Applied", "Lag"].map((h, i) =>
        el("th", { scope: "col", class: i >= 4 ? "num" : null, text: h })))),
      el("tbody", {}, ...c.members.map((m) => el("tr", { "data-key": m.id },
        el("td", { text: m.id }), el("td", { text: m.raft_addr }), el("td", { text: m.suffrage }),
        el("td", {}, m.is_leader ? badge("leader") : el("span", { class: "muted", text: "follower" })),
        el("td", { class: "num", "data-col": "applied_index", text: String(m.applied_index) }),
        el("td", { class: "num", "data-col": "lag", text: String(m.lag) })))));
    $("#timeline").replaceChildren(...s.timeline.slice().reverse().map((t) =>
      el("li", {}, el("time", { datetime: new Date(t.at).toISOString(), text: fmtTime(t.at) }),
        ` term ${t.term}: ${t.leader || "no leader"}`)));
    const ix = s.index;
    setText("i-nodes", fmtInt(ix.nodes));
    setText("i-residencies", fmtInt(ix.residencies));
    setText("i-holders", fmtInt(ix.holders));
    setText("i-namespaces", fmtInt(ix.namespaces));
    setText("i-detached", fmtInt(ix.detached_blocks));
    setText("i-heap", fmtBytes(ix.heap_bytes));
    setText("i-applied", num(ix.applied_index));
    $("#i-counters").replaceChildren(...Object.keys(ix.counters || {}).sort().flatMap((k) =>
      [el("dt", { text: k.replaceAll("_", " ") }), el("dd", { text: fmtInt(ix.counters[k]) })]));
    workers.set(s.workers);
    const dl = $("#models");
    const have = [...dl.children].map((o) => o.value).join("\n");
    if (have !== s.models.join("\n")) dl.replaceChildren(...s.models.map((m) => el("option", { value: m })));
    const model = $("#try-model");
    if (!model.value && s.models.length) model.value = s.models[0];
  }

  function parseTokens(text) {
    const ids = text.trim().replace(/^\[|\]$/g, "").split(/[\s,]+/).filter(Boolean).map(Number);
    if (ids.some((n) => !Number.isInteger(n) || n < 0)) throw new Error("token ids must be non-negative integers");
    return ids;
  }

  $("#try").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setText("try-error", "");
    const body = { model: $("#try-model").value.trim() };
    const lora = $("#try-lora").value.trim();
    if (lora) body.lora_name = lora;
    const text = $("#try-prompt").value;
    try {
      switch (document.querySelector('input[name="kind"]:checked').value) {
        case "chat": body.messages = JSON.parse(text); break;
        case "tokens": body.token_ids = parseTokens(text); break;
        default: body.prompt = text;
      }
      renderTry(await KV.api("/ui/api/try", body));
    } catch (e) {
      setText("try-error", e.message);
    }
  });

  function renderTry(r) {
    const rows = r.workers.map((w) => el("tr", { "data-key": w.worker },
      el("th", { scope: "row", text: w.worker }),
      el("td", { class: "num", "data-col": "matched_blocks", text: String(w.matched_blocks) }),
      el("td", { class: "num", "data-col": "hit_rate", text: fmtPct(w.hit_rate) }),
      el("td", {}, bar([
        { cls: "gpu", frac: w.gpu_hit_rate, label: "GPU " + fmtPct(w.gpu_hit_rate) },
        { cls: "cpu", frac: w.cpu_hit_rate, label: "CPU " + fmtPct(w.cpu_hit_rate) },
        { cls: "disk", frac: w.disk_hit_rate, label: "disk " + fmtPct(w.disk_hit_rate) },
      ], `${w.worker}: GPU ${w.gpu_blocks}, CPU ${w.cpu_blocks}, disk ${w.disk_blocks} of ${r.total_blocks} blocks`)),
      el("td", { class: "num", text: `${w.gpu_blocks} / ${w.cpu_blocks} / ${w.disk_blocks}` })));
    const path = el("ol", { class: "path", "aria-label": "Block path: each block of the prompt and how many workers hold it" },
      ...r.path.map((b) => el("li", { class: b.holders ? "held" : null, title: `block ${b.block} ${b.key}: ${b.holders} worker(s)`,
        "data-holders": String(b.holders), text: b.holders ? String(b.holders) : "" })));
    $("#try-result").replaceChildren(
      el("p", { id: "try-summary", text: `${r.model}: ${r.prompt_tokens} tokens, ${r.total_blocks} blocks of ${r.block_size} tokens, at applied index ${r.applied_index}` }),
      el("p", { class: "legend" }, el("span", {}, el("i", { class: "gpu" }), "GPU"), el("span", {}, el("i", { class: "cpu" }), "CPU"), el("span", {}, el("i", { class: "disk" }), "disk")),
      el("div", { class: "scroll" }, el("table", { id: "try-table", "aria-label": "Matched blocks per worker" },
        el("thead", {}, el("tr", {}, ...["Worker", "Matched blocks", "Hit rate", "Hit rate per tier", "GPU / CPU / disk"].map((h, i) =>
          el("th", { scope: "col", class: i === 1 || i === 2 || i === 4 ? "num" : null, text: h })))),
        el("tbody", {}, ...rows))),
      el("h3", { text: "Block path" + (r.truncated ? " (first blocks only)" : "") }), path);
  }

  KV.live("/ui/api/events", render);
})();
