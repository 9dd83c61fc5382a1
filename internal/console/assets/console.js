// kvindex console: shared helpers (no dependencies, no network but this server).
"use strict";
const KV = (() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const el = (tag, attrs = {}, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  };
  const fmtInt = (n) => (n ?? 0).toLocaleString("en-US");
  const fmtNum = (n, d = 1) => (n ?? 0).toFixed(d);
  const fmtPct = (f) => ((f ?? 0) * 100).toFixed(1) + "%";
  const fmtBytes = (b) => {
    const u = ["B", "KiB", "MiB", "GiB"]; let i = 0; b = b ?? 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return b.toFixed(i ? 1 : 0) + " " + u[i];
  };
  const fmtTime = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z";

  // Theme: follows the system unless the user picked one (kept in localStorage).
  function initTheme() {
    const saved = localStorage.getItem("kv-theme");
    if (saved) document.documentElement.dataset.theme = saved;
    const btn = $("#theme");
    if (!btn) return;
    const label = () => {
      const dark = document.documentElement.dataset.theme === "dark" ||
        (!document.documentElement.dataset.theme && matchMedia("(prefers-color-scheme: dark)").matches);
      btn.textContent = dark ? "Light mode" : "Dark mode";
      btn.setAttribute("aria-pressed", dark ? "true" : "false");
      return dark;
    };
    label();
    btn.addEventListener("click", () => {
      const dark = label();
      document.documentElement.dataset.theme = dark ? "light" : "dark";
      localStorage.setItem("kv-theme", document.documentElement.dataset.theme);
      label();
    });
  }

  // Admin token: typed by the operator, kept for this tab only, sent only on admin calls.
  const token = () => sessionStorage.getItem("kv-token") || "";
  function initToken(onChange) {
    const input = $("#token");
    if (!input) return;
    input.value = token();
    input.addEventListener("change", () => { sessionStorage.setItem("kv-token", input.value.trim()); onChange && onChange(); });
  }
  async function api(path, body, admin = false) {
    const opts = { method: body === undefined ? "GET" : "POST", headers: {} };
    if (body !== undefined) { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
    if (admin && token()) opts.headers["Authorization"] = "Bearer " + token();
    const resp = await fetch(path, opts);
    const text = await resp.text();
    let data; try { data = JSON.parse(text); } catch { data = text; }
    if (!resp.ok) throw new Error((data && data.error && (data.error.message || data.error)) || (resp.status + " " + text));
    return data;
  }

  // live subscribes to the server's SSE state stream; EventSource reconnects by itself.
  function live(url, onState) {
    const status = $("#live");
    const set = (t, cls) => { if (status) { status.textContent = t; status.className = "badge " + cls; } };
    const es = new EventSource(url);
    let n = 0;
    es.addEventListener("state", (ev) => {
      n++;
      document.body.dataset.updates = String(n);
      set("live", "ok");
      onState(JSON.parse(ev.data));
    });
    es.addEventListener("error", () => set("reconnecting", "warn"));
    return es;
  }

  // Table renders rows with sorting (header buttons), a filter and paging; it
  // keeps the user's sort, filter and page across live updates.
  class Table {
    constructor({ root, columns, key, pageSize = 25, label, actions }) {
      Object.assign(this, { root, columns, key, pageSize, actions, rows: [], page: 0, sort: columns[0].key, dir: 1, filter: "" });
      const id = root.id;
      this.filterInput = el("input", { type: "search", id: id + "-filter", placeholder: "filter", "aria-controls": id + "-table",
        oninput: (e) => { this.filter = e.target.value.toLowerCase(); this.page = 0; this.render(); } });
      this.count = el("span", { class: "muted", "aria-live": "polite", id: id + "-count" });
      this.table = el("table", { id: id + "-table", "aria-label": label });
      this.prev = el("button", { type: "button", text: "Previous", onclick: () => { this.page--; this.render(); } });
      this.next = el("button", { type: "button", text: "Next", onclick: () => { this.page++; this.render(); } });
      this.pageInfo = el("span", { class: "muted", id: id + "-page" });
      root.append(el("div", { class: "toolbar" }, el("label", { for: id + "-filter", text: "Filter" }), this.filterInput, this.count),
        el("div", { class: "scroll" }, this.table), el("div", { class: "pager", role: "navigation", "aria-label": label + " pages" }, this.prev, this.pageInfo, this.next));
    }
    set(rows) { this.rows = rows || []; this.render(); }
    render() {
      const cols = this.columns;
      const f = this.filter;
      let rows = f ? this.rows.filter((r) => cols.some((c) => String(r[c.key] ?? "").toLowerCase().includes(f))) : this.rows.slice();
      const c = cols.find((c) => c.key === this.sort);
      rows.sort((a, b) => {
        const x = a[this.sort], y = b[this.sort];
        const d = c && c.num ? (x ?? 0) - (y ?? 0) : String(x ?? "").localeCompare(String(y ?? ""));
        return d * this.dir || String(a[this.key]).localeCompare(String(b[this.key]));
      });
      const pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
      this.page = Math.min(Math.max(this.page, 0), pages - 1);
      const shown = rows.slice(this.page * this.pageSize, (this.page + 1) * this.pageSize);
      const head = el("tr", {}, ...cols.map((col) => el("th", {
        scope: "col", class: col.num ? "num" : null,
        "aria-sort": col.key === this.sort ? (this.dir > 0 ? "ascending" : "descending") : "none",
      }, el("button", { type: "button", text: col.label, onclick: () => {
        if (this.sort === col.key) this.dir = -this.dir; else { this.sort = col.key; this.dir = col.num ? -1 : 1; }
        this.page = 0;
        this.render();
        const again = this.table.querySelector(`th:nth-child(${cols.indexOf(col) + 1}) button`);
        if (again) again.focus(); // the header was redrawn: keep the keyboard where it was
      } }))), this.actions ? el("th", { scope: "col", text: "Actions" }) : null);
      const body = shown.map((r) => el("tr", { "data-key": r[this.key] }, ...cols.map((col) => {
        const v = col.fmt ? col.fmt(r[col.key], r) : r[col.key];
        return el("td", { class: col.num ? "num" : null, "data-col": col.key }, v instanceof Node ? v : String(v ?? ""));
      }), this.actions ? el("td", {}, this.actions(r)) : null));
      this.table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
      this.count.textContent = rows.length === this.rows.length ? `${rows.length} rows` : `${rows.length} of ${this.rows.length} rows`;
      this.pageInfo.textContent = `page ${this.page + 1} of ${pages}`;
      this.prev.disabled = this.page === 0;
      this.next.disabled = this.page >= pages - 1;
    }
  }

  const badge = (text) => el("span", { class: "badge " + text, text });
  // bar draws stacked segments [{cls, frac, label}] with a text alternative.
  const bar = (segs, label) => {
    const b = el("div", { class: "bar", role: "img", "aria-label": label });
    for (const s of segs) {
      const sp = el("span", { class: s.cls, title: s.label, "data-frac": String(s.frac) });
      sp.style.width = (Math.max(0, Math.min(1, s.frac)) * 100).toFixed(2) + "%";
      b.append(sp);
    }
    return b;
  };
  const setText = (id, v) => { const e = document.getElementById(id); if (e) e.textContent = v; };

  return { $, el, fmtInt, fmtNum, fmtPct, fmtBytes, fmtTime, initTheme, initToken, token, api, live, Table, badge, bar, setText };
})();
