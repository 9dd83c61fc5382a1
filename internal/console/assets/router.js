"use strict";
(() => {
  const { $, el, fmtInt, fmtNum, fmtPct, fmtTime, badge, setText } = KV;
  KV.initTheme();
  const workers = new KV.Table({
    root: $("#workers"), key: "id", label: "Workers", pageSize: 25,
    columns: [
      { key: "id", label: "Worker" },
      { key: "model", label: "Model" },
      { key: "role", label: "Role" },
      { key: "breaker", label: "Breaker", fmt: (v) => badge(v) },
      { key: "breaker_trips", label: "Trips", num: true, fmt: fmtInt },
      { key: "inflight", label: "In flight", num: true, fmt: fmtInt },
      { key: "prefill_tokens", label: "Prefill tokens", num: true, fmt: fmtInt },
      { key: "decode_blocks", label: "Decode blocks", num: true, fmt: fmtInt },
      { key: "served", label: "Served", num: true, fmt: fmtInt },
    ],
  });
  const recent = new KV.Table({
    root: $("#recent"), key: "seq", label: "Last decisions", pageSize: 10,
    columns: [
      { key: "seq", label: "#", num: true, fmt: (v) => String(v) },
      { key: "at", label: "Time", num: true, fmt: (v) => fmtTime(v) },
      { key: "policy", label: "Policy" },
      { key: "source", label: "Source" },
      { key: "model", label: "Model" },
      { key: "worker", label: "Worker", fmt: (v, d) => d.prefill_worker ? `${v} (prefill ${d.prefill_worker})` : v },
      { key: "overlap_blocks", label: "Captured", num: true, fmt: (v, d) => `${v} / ${d.prompt_blocks}` },
      { key: "available_overlap_blocks", label: "Available", num: true },
      { key: "cost", label: "Cost", num: true, fmt: (v) => fmtNum(v, 2) },
      { key: "candidates", label: "Candidates", num: true },
    ],
    actions: (d) => el("button", { type: "button", text: "Details", "aria-label": "Details of decision " + d.seq,
      onclick: async () => {
        try { $("#decision-detail").replaceChildren(renderDecision(await KV.api("/ui/api/decisions/" + d.seq), "Decision #" + d.seq)); }
        catch (e) { $("#decision-detail").replaceChildren(el("p", { class: "error", role: "alert", text: e.message })); }
      } }),
  });
  recent.sort = "seq"; recent.dir = -1;

  // renderDecision shows a /debug/route-shaped decision with every candidate's cost terms.
  function renderDecision(d, title) {
    const cands = (list, label) => {
      if (!list || !list.length) return null;
      const terms = Object.keys(list[0].terms || {});
      return el("div", { class: "scroll" }, el("table", { class: "candidates", "aria-label": label },
        el("thead", {}, el("tr", {}, ...["Worker", "Rank", "Role", "Cost", "Overlap", "GPU", "CPU", "Disk", "Source", "In flight", "Prefill", "Decode"]
          .concat(terms.map((t) => t.replaceAll("_", " "))).map((h, i) => el("th", { scope: "col", class: i >= 3 && i !== 8 ? "num" : null, text: h })))),
        el("tbody", {}, ...list.map((c) => el("tr", { "data-key": c.worker + "/" + c.dp_rank, class: c.worker === d.worker && c.dp_rank === d.dp_rank ? "chosen" : null },
          el("th", { scope: "row", text: c.worker + (c.worker === d.worker && c.dp_rank === d.dp_rank ? " (chosen)" : "") }),
          el("td", { class: "num", text: String(c.dp_rank) }), el("td", { text: c.role }),
          el("td", { class: "num", "data-col": "cost", text: fmtNum(c.cost, 2) }),
          ...[c.overlap_blocks, c.overlap_gpu_blocks, c.overlap_cpu_blocks, c.overlap_disk_blocks].map((v) => el("td", { class: "num", text: String(v) })),
          el("td", { text: c.overlap_source }),
          ...[c.inflight, c.active_prefill_tokens, c.active_decode_blocks].map((v) => el("td", { class: "num", text: String(v) })),
          ...terms.map((t) => el("td", { class: "num", "data-col": "term-" + t, text: fmtNum(c.terms[t], 2) })))))));
    };
    return el("div", { class: "decision" },
      el("h3", { text: title }),
      el("p", { class: "decision-summary", text: d.wait
        ? `${d.policy}: would wait in the admission queue: ${d.wait.reason}` +
          `${d.wait.held_for_earlier ? " (left to earlier requests: " + d.wait.held_for_earlier.join(", ") + ")" : ""}`
        : `${d.policy} → ${d.worker}#${d.dp_rank}${d.prefill_worker ? " (prefill " + d.prefill_worker + ")" : ""}, source ${d.source}` +
        `, ${d.overlap_blocks} of ${d.prompt_blocks} blocks captured (best available ${d.available_overlap_blocks}), cost ${fmtNum(d.cost, 2)}` +
        `${d.indexer_answered ? "" : ", indexer did not answer"}${d.reason ? ", " + d.reason : ""}` }),
      cands(d.candidates, "Candidates"), cands(d.prefill_candidates, "Prefill candidates"),
      d.excluded && d.excluded.length ? el("p", { class: "muted", text: "Excluded: " + d.excluded.map((x) => `${x.target.worker || x.target.Worker || JSON.stringify(x.target)} (${x.reason})`).join(", ") }) : null);
  }

  function render(s) {
    setText("policy", s.policy);
    const ix = $("#indexer");
    ix.textContent = !s.indexer ? "none" : s.indexer_up ? "up" : "down";
    ix.className = "badge " + (!s.indexer ? "" : s.indexer_up ? "ok" : "bad");
    setText("queue", fmtInt(s.queue_depth));
    workers.set(s.workers);
    const total = s.decisions.reduce((a, d) => a + d.count, 0) || 1;
    $("#decisions").replaceChildren(
      el("thead", {}, el("tr", {}, ...["Policy", "Source", "Decisions", "Share"].map((h, i) => el("th", { scope: "col", class: i === 2 ? "num" : null, text: h })))),
      el("tbody", {}, ...s.decisions.slice().sort((a, b) => b.count - a.count).map((d) => el("tr", { "data-key": d.policy + "/" + d.source },
        el("td", { text: d.policy }), el("td", { text: d.source }),
        el("td", { class: "num", "data-col": "count", text: fmtInt(d.count) }),
        el("td", {}, KV.bar([{ cls: "capt", frac: d.count / total, label: fmtPct(d.count / total) }], `${d.source}: ${fmtPct(d.count / total)} of decisions`))))));
    setText("hit-available", fmtInt(s.hit.available));
    setText("hit-captured", fmtInt(s.hit.captured));
    setText("hit-share", s.hit.available ? fmtPct(s.hit.captured / s.hit.available) : "—");
    const pts = s.hit_series.length === 1 ? [s.hit_series[0], { ...s.hit_series[0], at: s.hit_series[0].at + 1 }] : s.hit_series;
    const maxY = Math.max(1, ...pts.map((p) => p.available), ...pts.map((p) => p.captured));
    const t0 = pts.length ? pts[0].at : 0, span = Math.max(1, pts.length ? pts[pts.length - 1].at - t0 : 1);
    const line = (k) => pts.map((p) => `${((p.at - t0) / span * 600).toFixed(1)},${(118 - p[k] / maxY * 116).toFixed(1)}`).join(" ");
    $("#hit-line-avail").setAttribute("points", line("available"));
    $("#hit-line-capt").setAttribute("points", line("captured"));
    recent.set(s.recent);
    const dl = $("#models");
    if ([...dl.children].map((o) => o.value).join("\n") !== s.models.join("\n")) dl.replaceChildren(...s.models.map((m) => el("option", { value: m })));
    if (!$("#dry-model").value && s.models.length) $("#dry-model").value = s.models[0];
  }

  $("#dry").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setText("dry-error", "");
    const model = $("#dry-model").value.trim(), text = $("#dry-prompt").value;
    let body;
    try {
      switch (document.querySelector('input[name="dry-kind"]:checked').value) {
        case "raw": body = JSON.parse(text); break;
        case "completion": body = { model, prompt: text, max_tokens: 16 }; break;
        default: body = { model, messages: [{ role: "user", content: text }], max_tokens: 16 };
      }
      $("#dry-result").replaceChildren(renderDecision(await KV.api("/debug/route", body), "Dry-run decision"));
    } catch (e) {
      setText("dry-error", e.message);
    }
  });

  KV.live("/ui/api/events", render);
})();
