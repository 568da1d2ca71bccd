// ngcx dashboard: swap the page's live parts when its event stream says something changed, draw the
// deployment page's charts with uPlot (vendor/), run actions with the page's CSRF token. No framework.
"use strict";

const csrf = document.querySelector('meta[name="ngcx-csrf"]').content;

async function refresh() {
  const res = await fetch(location.pathname + location.search, {headers: {"X-Fragment": "1"}});
  const doc = new DOMParser().parseFromString(await res.text(), "text/html");
  for (const fresh of doc.querySelectorAll("[data-live]")) {
    const old = document.getElementById(fresh.id);
    if (old && old.innerHTML !== fresh.innerHTML) { old.replaceWith(fresh); }
  }
  bindActions();
}

function listen() {
  const mark = document.getElementById("live-mark");
  const source = new EventSource(document.body.dataset.events);
  source.addEventListener("open", () => mark.classList.remove("off"));
  source.addEventListener("error", () => mark.classList.add("off"));
  let first = true;
  source.addEventListener("change", () => { if (!first) { refresh(); } first = false; });
  source.addEventListener("point", (e) => charts && charts.add(JSON.parse(e.data)));
}

// ------------------------------------------------------------------ actions (stop / start / destroy)

function bindActions() {
  for (const button of document.querySelectorAll("button.act")) {
    if (button.dataset.bound) { continue; }
    button.dataset.bound = "1";
    button.addEventListener("click", () => confirmThen(button.dataset.verb, button.dataset.ref));
  }
}

function confirmThen(verb, ref) {
  const dialog = document.getElementById("confirm");
  dialog.querySelector(".verb").textContent = verb;
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") { return; }
    const res = await fetch(`/api/deployments/${ref}/${verb}`, {method: "POST", headers: {"X-NGCX-CSRF": csrf}});
    if (!res.ok) { alertLine((await res.json()).error || `HTTP ${res.status}`); }
    refresh();
  };
  dialog.showModal();
}

function alertLine(text) {
  const banner = document.getElementById("problem");
  banner.textContent = text;
  banner.classList.remove("hidden");
}

// ------------------------------------------------------------------ charts

const SERIES = {
  rps: [["req/s", "#2f6fdf"]], latency: [["p50", "#2f6fdf"], ["p99", "#d9480f"], ["mean", "#868e96"]],
  queue_ms: [["queue", "#7048e8"]],
  batch: [["batch", "#0c8599"]], errors: [["errors/s", "#e03131"]], gpu_util: [["GPU %", "#2b8a3e"]],
  gpu_mem_gb: [["GB", "#5c940d"]], gpu_power_w: [["W", "#e8590c"]],
};
const FIELDS = {latency: ["p50_ms", "p99_ms", "mean_ms"]};
const GPU = ["gpu_util", "gpu_mem_gb", "gpu_power_w"];   // shown once a point carries NVML's figures
const WINDOW_S = 300;

class Charts {
  constructor(root) {
    this.root = root;
    this.data = {};
    this.plots = {};
    for (const fig of root.querySelectorAll("figure.chart")) {
      const key = fig.dataset.key;
      this.data[key] = [[], ...SERIES[key].map(() => [])];
      const opts = {width: 380, height: 170, legend: {show: true},
                    series: [{}, ...SERIES[key].map(([label, stroke]) => ({label, stroke, width: 2, spanGaps: false}))],
                    axes: [{}, {size: 50}], scales: {x: {time: true}}};
      this.plots[key] = new uPlot(opts, this.data[key], fig);
    }
  }

  add(point) {
    for (const key of Object.keys(this.plots)) {
      const cols = this.data[key];
      cols[0].push(point.t);
      (FIELDS[key] || [key]).forEach((field, i) => cols[i + 1].push(point[field] ?? null));
      while (cols[0].length && cols[0][0] < point.t - WINDOW_S) { cols.forEach((c) => c.shift()); }
      this.plots[key].setData(cols);
    }
    if (point.gpu_util != null) { this.root.classList.add("gpu"); }
    this.root.dataset.points = String(this.data.rps ? this.data.rps[0].length : 0);
    this.root.dataset.lastRps = String(point.rps ?? "");
    this.root.dataset.lastMeanMs = String(point.mean_ms ?? "");
  }
}

let charts = null;

async function startCharts() {
  const root = document.getElementById("charts");
  if (!root || typeof uPlot === "undefined") { return; }
  charts = new Charts(root);
  const res = await fetch(`/api/deployments/${root.dataset.ref}/points`);
  if (res.ok) { for (const point of (await res.json()).points) { charts.add(point); } }
}

// ------------------------------------------------------------------ logs

async function tailLogs() {
  const pre = document.getElementById("logs");
  if (!pre || pre.textContent === "(not running)") { return; }
  const res = await fetch(pre.dataset.src);
  pre.textContent = await res.text() || "(no lines yet)";
  pre.scrollTop = pre.scrollHeight;
  setTimeout(tailLogs, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  bindActions();
  startCharts().then(listen);
  tailLogs();
});
