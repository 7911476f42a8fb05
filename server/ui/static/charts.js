"use strict";
// Small SVG line charts, built with DOM calls (no markup strings). Each chart keeps, in
// data-* attributes, the latest and largest value of each series it draws, so that a
// reader (a test, a screen reader's user) can tell what it shows without the pixels.
window.pagode = window.pagode || {};

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 460, HEIGHT = 120, PAD = 4;

pagode.CHARTS = [
  { id: "ttft", title: "TTFT", unit: "s", series: ["ttft_p50", "ttft_p99"] },
  { id: "itl", title: "Inter-token latency", unit: "s", series: ["itl_p50", "itl_p99"] },
  { id: "requests", title: "Requests running / waiting", unit: "", series: ["running", "waiting"] },
  { id: "kv", title: "KV-cache use", unit: "%", series: ["kv_usage"], scale: 100 },
  { id: "batch", title: "Decode batch size", unit: "", series: ["decode_batch"] },
  { id: "prefix", title: "Prefix-cache hit rate", unit: "%", series: ["prefix_hit_rate"], scale: 100 },
  { id: "tokens", title: "Output tokens/s", unit: "", series: ["out_tok_s"] },
  { id: "preemptions", title: "Preemptions per point", unit: "", series: ["preemptions"] },
];

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

function formatValue(value, unit, scale) {
  if (value === null || value === undefined) return "–";
  if (scale) value *= scale;
  if (unit === "s") return value < 1 ? (value * 1000).toFixed(0) + " ms" : value.toFixed(2) + " s";
  if (unit === "%") return value.toFixed(0) + "%";
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

pagode.buildCharts = function (container) {
  for (const spec of pagode.CHARTS) {
    const figure = document.createElement("figure");
    figure.className = "chart";
    figure.id = "chart-" + spec.id;
    const caption = document.createElement("figcaption");
    const title = document.createElement("span");
    title.textContent = spec.title;
    const legend = document.createElement("span");
    legend.className = "legend";
    caption.append(title, legend);
    const svg = svgElement("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": spec.title });
    figure.append(caption, svg);
    container.append(figure);
  }
};

// Draw every chart from `points` (oldest first) spanning `spanSeconds` up to the last one.
pagode.drawCharts = function (points, spanSeconds) {
  const end = points.length ? points[points.length - 1].t : 0;
  for (const spec of pagode.CHARTS) {
    const figure = document.getElementById("chart-" + spec.id);
    const svg = figure.querySelector("svg");
    const legend = figure.querySelector(".legend");
    const scale = spec.scale || 1;
    let top = 0;
    for (const name of spec.series) for (const p of points) if (p[name] != null) top = Math.max(top, p[name] * scale);
    const yMax = top > 0 ? top * 1.1 : 1;
    svg.replaceChildren(svgElement("line", { x1: 0, y1: HEIGHT - PAD, x2: WIDTH, y2: HEIGHT - PAD, class: "axis" }));
    legend.replaceChildren();
    svg.append(label(PAD, 12, formatValue(top > 0 ? yMax / scale : null, spec.unit, scale)),
      label(WIDTH - PAD, HEIGHT - 8, "now", "end"), label(PAD, HEIGHT - 8, "−" + formatSpan(spanSeconds)));
    spec.series.forEach((name, index) => {
      let path = "", run = 0, latest = null, largest = 0;
      for (const p of points) {
        if (p[name] == null) { run = 0; continue; }  // a gap: no requests in that interval
        const value = p[name] * scale;
        latest = value;
        largest = Math.max(largest, value);
        const x = WIDTH - (end - p.t) / spanSeconds * WIDTH;
        const y = HEIGHT - PAD - value / yMax * (HEIGHT - 2 * PAD);
        path += (run === 0 ? "M" : "L") + x.toFixed(1) + " " + y.toFixed(1);
        run += 1;
        if (run === 1) svg.append(svgElement("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 1.5, class: "dot s" + index }));
      }
      svg.append(svgElement("path", { d: path || "M0 0", class: "series s" + index }));
      figure.dataset[camel(name) + "Latest"] = latest === null ? "" : String(latest / scale);
      figure.dataset[camel(name) + "Max"] = String(largest / scale);
      const item = document.createElement("span");
      item.className = "s" + index;
      item.textContent = `${name.replace(/_/g, " ")} ${formatValue(latest, spec.unit)} (max ${formatValue(largest, spec.unit)})`;
      legend.append(item);
    });
  }
};

function label(x, y, text, anchor) {
  const element = svgElement("text", { x, y, class: "tick", "text-anchor": anchor || "start" });
  element.textContent = text;
  return element;
}

function formatSpan(seconds) {
  return seconds >= 3600 ? seconds / 3600 + " h" : seconds / 60 + " min";
}

function camel(name) {
  return name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
}
