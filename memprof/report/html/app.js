// memprof HTML report: draws the data blob (#memprof-data) with SVG. No network, no library.
// Every string from the recording goes in through textContent, never innerHTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("memprof-data").textContent);
  var NS = "http" + "://www.w3.org/2000/svg"; // the SVG namespace name, not a URL fetched
  var FAMILIES = [["gpu", "GPU: cuda_block ⊂ cuda_segment ⊂ cuda_driver, NVML"],
                  ["host", "Process: torch_cpu, native heap, RSS/PSS"],
                  ["kernel", "Kernel: slab, pages"], ["samples", "Other samples"]];
  var COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  var SPECIAL = {"-1": "layer", "-2": "other chains", "-3": "deeper frames", "-4": "no stack recorded"};
  var full = [0, Math.max(data.span.recording_end_ns - data.span.start_ns, 1)];
  var view = full.slice();

  // ---- helpers ---------------------------------------------------------------------------
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs, text) {
    var node = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], sign = n < 0 ? "-" : "", v = Math.abs(n), i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return sign + (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }
  function seconds(ns) {  // ns after the recording's start, as the axis shows it
    var s = ns / 1e9, span = (view[1] - view[0]) / 1e9;
    var digits = span < 0.01 ? 6 : span < 1 ? 4 : span < 100 ? 2 : 1;
    return s.toFixed(digits) + " s";
  }
  function valueText(series, v) { return series.kind === "layer" || /_bytes$/.test(series.name) ? bytes(v) : String(v); }
  function label(series) { return series.name + (series.device ? " " + series.device : ""); }
  function lastIndexAtOrBefore(t, times) {  // binary search: the point in effect at t, -1 before the first
    var lo = 0, hi = times.length - 1, found = -1;
    while (lo <= hi) { var mid = (lo + hi) >> 1; if (times[mid] <= t) { found = mid; lo = mid + 1; } else hi = mid - 1; }
    return found;
  }
  function niceTicks(lo, hi, count) {  // round values (1, 2, 5 × 10^k apart) covering [lo, hi]
    var raw = (hi - lo) / count;
    if (!(raw > 0)) return [lo];
    var mag = Math.pow(10, Math.floor(Math.log10(raw))), norm = raw / mag;
    var step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag, out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }
  var tooltip = document.getElementById("tooltip");
  function showTip(event, text) {
    tooltip.textContent = text; tooltip.hidden = false;
    tooltip.style.left = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 4) + "px";
    tooltip.style.top = (event.clientY + 14) + "px";
  }
  function hideTip() { tooltip.hidden = true; }

  // ---- header, warnings, metadata ----------------------------------------------------------
  function drawHeader() {
    document.getElementById("recording-name").textContent = data.recording;
    var box = document.getElementById("warnings");
    if (!data.warnings.length) return;
    var div = el("div", {"class": "warning", role: "alert"});
    div.appendChild(el("strong", {}, "This recording is incomplete or estimated:"));
    var ul = el("ul");
    data.warnings.forEach(function (w) { ul.appendChild(el("li", {}, w)); });
    div.appendChild(ul); box.appendChild(div);
  }
  function drawMeta() {
    var m = data.meta, dl = el("dl", {"class": "meta"});
    var rows = [["command", m.command ? m.command.join(" ") : "(attached)"], ["pid", m.pid], ["host", m.host],
      ["kernel", m.kernel], ["clock", m.clock], ["duration", seconds(full[1])], ["status", m.status],
      ["exit status", m.exit_status], ["memprof", m.memprof_version + " (format " + m.format_version + ")"],
      ["events lost", m.lost_events], ["frees skipped by the kernel", m.skipped_frees]];
    Object.keys(m.sources).forEach(function (name) {
      var s = m.sources[name];
      rows.push(["source " + name, (s.enabled ? "" : "off, ") + s.events + " events, " + s.lost + " lost" +
        (s.stack_sample_every > 1 ? ", one stack in " + s.stack_sample_every : "")]);
    });
    rows.forEach(function (r) { dl.appendChild(el("dt", {}, r[0])); dl.appendChild(el("dd", {}, r[1] === null ? "–" : r[1])); });
    document.getElementById("meta").appendChild(dl);
    drawNotes();
  }
  function drawNotes() {  // information on how it was recorded: the results hold as shown
    if (!(data.notes || []).length) return;
    var box = document.getElementById("meta"), ul = el("ul", {"class": "notes"});
    box.appendChild(el("h3", {}, "Notes"));
    data.notes.forEach(function (n) { ul.appendChild(el("li", {"class": "note"}, n)); });
    box.appendChild(ul);
  }

  // ---- timeline ---------------------------------------------------------------------------
  var charts = document.getElementById("charts");
  var MARGIN = {left: 74, right: 12, top: 8, bottom: 22}, HEIGHT = 190;

  function drawCharts() {
    charts.textContent = "";
    charts.setAttribute("data-t0", Math.round(view[0]));
    charts.setAttribute("data-t1", Math.round(view[1]));
    document.getElementById("zoom-range").textContent = seconds(view[0]) + " – " + seconds(view[1]);
    if (!data.series.length) { charts.appendChild(el("p", {"class": "empty"}, "No allocations or samples recorded.")); return; }
    data.stacks.forEach(function (st) { charts.appendChild(stackedChart(st)); });
    FAMILIES.forEach(function (f) {
      var members = data.series.filter(function (s) { return s.family === f[0]; });
      if (members.length) charts.appendChild(chart(f[1], members));
    });
  }

  // Layers of one device that do not nest, stacked: running sums drawn from the top one down,
  // each filled to the axis, so every band shows one layer and the top line their total.
  function stackedChart(st) {
    var sums = [], running = st.t.map(function () { return 0; });
    st.layers.forEach(function (name, i) {
      running = running.map(function (v, j) { return v + st.v[i][j]; });
      sums.push({name: name, device: st.device, kind: "layer", t: st.t, v: running, own: st.v[i]});
    });
    var title = st.device + ": " + st.layers.join(" + ") + ", stacked (these layers do not nest)";
    return chart(title, sums, true);
  }

  function chart(title, members, stacked) {
    var box = el("div", {"class": stacked ? "chart stacked" : "chart"}), width = Math.max(charts.clientWidth, 320);
    box.appendChild(el("h3", {}, title));
    var legend = el("div", {"class": "legend"});
    members.forEach(function (s, i) {
      var item = el("span"), swatch = el("i"); swatch.style.background = COLOURS[i % COLOURS.length];
      var peak = stacked ? Math.max.apply(null, s.own.concat([0])) : s.peak;
      item.appendChild(swatch); item.appendChild(document.createTextNode(label(s) + "  peak " + valueText(s, peak)));
      legend.appendChild(item);
    });
    box.appendChild(legend);
    var plot = {x0: MARGIN.left, x1: width - MARGIN.right, y0: HEIGHT - MARGIN.bottom, y1: MARGIN.top};
    var top = Math.max.apply(null, members.map(function (s) { return visibleMax(s); }).concat([1]));
    var x = function (t) { return plot.x0 + (t - view[0]) / (view[1] - view[0]) * (plot.x1 - plot.x0); };
    var y = function (v) { return plot.y0 - v / top * (plot.y0 - plot.y1); };
    var root = svg("svg", {viewBox: "0 0 " + width + " " + HEIGHT, height: HEIGHT});
    var clipId = "clip-" + Math.random().toString(36).slice(2);
    var clip = svg("clipPath", {id: clipId});
    clip.appendChild(svg("rect", {x: plot.x0, y: 0, width: plot.x1 - plot.x0, height: plot.y0}));
    root.appendChild(clip);
    drawAxes(root, plot, x, y, top, members);
    var layer = svg("g", {"clip-path": "url(#" + clipId + ")"});
    drawMarks(layer, plot, x);
    members.slice().reverse().forEach(function (s, back) {  // stacked: the total first, filled down to 0
      var i = members.length - 1 - back, colour = COLOURS[i % COLOURS.length], d = stepPath(s, x, y, plot);
      if (stacked) {
        layer.appendChild(svg("path", {"class": "band", fill: colour, d: d + "V" + plot.y0 + "H" + plot.x0 + "Z",
                                       "data-series": label(s)}));
      } else {
        layer.appendChild(svg("path", {"class": "series", d: d, stroke: colour, "data-series": label(s)}));
      }
    });
    root.appendChild(layer);
    interact(root, plot, members, x);
    box.appendChild(root);
    return box;
  }

  function visibleMax(s) {
    var best = 0, start = Math.max(lastIndexAtOrBefore(view[0], s.t), 0);
    for (var i = start; i < s.t.length && s.t[i] <= view[1]; i++) best = Math.max(best, s.v[i]);
    return best;
  }

  function stepPath(s, x, y, plot) {  // a step curve: each value holds until the next point
    var start = Math.max(lastIndexAtOrBefore(view[0], s.t), 0), d = "";
    for (var i = start; i < s.t.length; i++) {
      var px = Math.max(x(s.t[i]), plot.x0 - 1);
      d += (i === start ? "M" + px.toFixed(1) + "," + y(s.v[i]).toFixed(1)
                        : "H" + px.toFixed(1) + "V" + y(s.v[i]).toFixed(1));
      if (s.t[i] > view[1]) break;
    }
    d += "H" + Math.min(x(full[1]), plot.x1 + 1).toFixed(1);  // the last value holds to the end
    return d;
  }

  function drawAxes(root, plot, x, y, top, members) {
    var axis = svg("g", {"class": "axis"});
    niceTicks(view[0], view[1], 7).forEach(function (t) {
      axis.appendChild(svg("line", {x1: x(t), x2: x(t), y1: plot.y0, y2: plot.y0 + 4}));
      axis.appendChild(svg("text", {"class": "x-tick", x: x(t), y: HEIGHT - 6, "text-anchor": "middle"}, seconds(t)));
    });
    var asBytes = members.some(function (s) { return s.kind === "layer" || /_bytes$/.test(s.name); });
    var unit = asBytes ? Math.pow(1024, Math.max(0, Math.floor(Math.log(top) / Math.log(1024)))) : 1;
    niceTicks(0, top / unit, 4).map(function (v) { return v * unit; }).forEach(function (v) {
      axis.appendChild(svg("line", {x1: plot.x0, x2: plot.x1, y1: y(v), y2: y(v)}));
      axis.appendChild(svg("text", {x: plot.x0 - 6, y: y(v) + 4, "text-anchor": "end"}, asBytes ? bytes(v) : v));
    });
    root.appendChild(axis);
  }

  function drawMarks(g, plot, x) {
    var steps = data.steps.filter(function (m) { return m[0] >= view[0] && m[0] <= view[1]; });
    steps.forEach(function (m) {
      var line = svg("line", {"class": "step-mark", x1: x(m[0]), x2: x(m[0]), y1: plot.y1, y2: plot.y0});
      line.appendChild(svg("title", {}, "step " + m[1] + " at " + seconds(m[0])));
      g.appendChild(line);
    });
    var marks = (data.marks || []).filter(function (m) { return m[0] >= view[0] && m[0] <= view[1]; });
    marks.forEach(function (m) {  // memprof.mark("epoch 1"): named where few enough to read
      g.appendChild(svg("line", {"class": "user-mark", x1: x(m[0]), x2: x(m[0]), y1: plot.y1, y2: plot.y0}));
      if (marks.length <= 20) g.appendChild(svg("text", {"class": "user-mark-label", x: x(m[0]) + 3, y: plot.y1 + 23}, m[1]));
    });
    data.ooms.forEach(function (o) {
      if (o.t < view[0] || o.t > view[1]) return;
      g.appendChild(svg("line", {"class": "oom-mark", x1: x(o.t), x2: x(o.t), y1: plot.y1, y2: plot.y0}));
      g.appendChild(svg("text", {"class": "oom-label", x: x(o.t) + 3, y: plot.y1 + 11}, "OOM"));
    });
  }

  function interact(root, plot, members, x) {
    var overlay = svg("rect", {x: plot.x0, y: plot.y1, width: plot.x1 - plot.x0, height: plot.y0 - plot.y1,
                               fill: "transparent"});
    var hover = svg("line", {"class": "hover-line", y1: plot.y1, y2: plot.y0, visibility: "hidden"});
    var selection = svg("rect", {"class": "selection", y: plot.y1, height: plot.y0 - plot.y1, width: 0, visibility: "hidden"});
    root.appendChild(hover); root.appendChild(selection); root.appendChild(overlay);
    var toTime = function (event) {
      var box = root.getBoundingClientRect(), scale = box.width / root.viewBox.baseVal.width;
      var px = (event.clientX - box.left) / scale;
      return {px: px, t: view[0] + (px - plot.x0) / (plot.x1 - plot.x0) * (view[1] - view[0])};
    };
    var dragFrom = null;
    overlay.addEventListener("mousedown", function (e) { dragFrom = toTime(e); e.preventDefault(); });
    overlay.addEventListener("mousemove", function (e) {
      var at = toTime(e);
      hover.setAttribute("x1", at.px); hover.setAttribute("x2", at.px); hover.setAttribute("visibility", "visible");
      if (dragFrom) {
        selection.setAttribute("x", Math.min(dragFrom.px, at.px)); selection.setAttribute("width", Math.abs(at.px - dragFrom.px));
        selection.setAttribute("visibility", "visible");
      }
      showTip(e, tipText(at.t, members));
    });
    overlay.addEventListener("mouseleave", function () { hover.setAttribute("visibility", "hidden"); hideTip(); });
    overlay.addEventListener("mouseup", function (e) {
      var at = toTime(e), from = dragFrom; dragFrom = null;
      selection.setAttribute("visibility", "hidden");
      if (from && Math.abs(at.px - from.px) > 3) zoomNs(Math.min(from.t, at.t), Math.max(from.t, at.t));
    });
    overlay.addEventListener("wheel", function (e) {
      e.preventDefault();
      var at = toTime(e), factor = e.deltaY > 0 ? 1.25 : 0.8;
      zoomNs(at.t - (at.t - view[0]) * factor, at.t + (view[1] - at.t) * factor);
    }, {passive: false});
  }

  function tipText(t, members) {
    var lines = [seconds(t)];
    members.forEach(function (s) {
      var i = lastIndexAtOrBefore(t, s.t);
      lines.push(label(s) + ": " + (i < 0 ? "–" : valueText(s, (s.own || s.v)[i])));  // a band: its own bytes
    });
    data.ooms.forEach(function (o) {
      if (Math.abs(o.t - t) <= (view[1] - view[0]) / 200) lines.push("OOM " + o.layer + " " + o.device + " " + bytes(o.size_bytes));
    });
    (data.marks || []).forEach(function (m) {
      if (Math.abs(m[0] - t) <= (view[1] - view[0]) / 200) lines.push("mark: " + m[1]);
    });
    return lines.join("\n");
  }

  function zoomNs(t0, t1) {  // clamp to the recording, keep at least 1 µs visible
    t0 = Math.max(full[0], t0); t1 = Math.min(full[1], t1);
    if (!(t1 - t0 >= 1000)) { var mid = (t0 + t1) / 2; t0 = Math.max(full[0], mid - 500); t1 = Math.min(full[1], t0 + 1000); }
    view = [t0, t1];
    drawCharts();
  }

  // ---- leaks ------------------------------------------------------------------------------
  var KIND_LABELS = {held_at_end: "held at the end", grows_per_step: "grows per step", not_a_leak: "not a leak"};

  function drawLeaks() {
    var box = document.getElementById("leaks"), leaks = data.leaks, text = data.leaks_text || {};
    if (leaks.findings.length) box.appendChild(el("p", {"class": "leak-count"}, text.count));
    if (!leaks.findings.length) box.appendChild(el("p", {"class": "empty"}, "No leaks found."));
    if (text.unrecorded_heap) box.appendChild(el("p", {"class": "note"}, text.unrecorded_heap));
    if (text.min_age) box.appendChild(el("p", {"class": "note"}, text.min_age));
    leaks.findings.forEach(function (f) { box.appendChild(finding(f)); });
    if ((text.model_state || []).length) {  // apart from the findings, as `report leaks` prints it
      box.appendChild(el("h3", {"class": "model-state"}, text.model_state_heading));
      var totals = el("ul", {"class": "model-state"});
      text.model_state.forEach(function (line) { totals.appendChild(el("li", {}, line)); });
      box.appendChild(totals);
    }
    if (leaks.not_leaks.length) {
      box.appendChild(el("h3", {}, "Not leaks: memory held on purpose, " + text.not_leaks));
      leaks.not_leaks.forEach(function (f) { box.appendChild(finding(f)); });
    }
  }

  function finding(f) {
    var details = el("details", {"class": "finding"}), summary = el("summary");
    summary.appendChild(el("span", {"class": "badge " + f.kind}, KIND_LABELS[f.kind] || f.kind));
    var slope = f.slope_bytes_per_step === null ? "" : ", " + bytes(f.slope_bytes_per_step) + "/step";
    var confidence = f.confidence === null ? "" : ", " + (100 * f.confidence).toFixed(1) + "% confidence";
    summary.appendChild(document.createTextNode(" " + f.layer + ": " + bytes(f.live_bytes) + " in " + f.live_count +
      (f.live_count === 1 ? " allocation" : " allocations") + younger(f) + slope + confidence +
      (f.confirmed ? "" : ", unconfirmed") + (f.may_be_freed_unseen ? ", may be freed unseen" : "") + " — "));
    summary.appendChild(el("code", {"class": "chain-name"}, f.name));  // as the terminal names the chain
    summary.appendChild(el("div", {"class": "explanation"}, f.explanation));
    details.appendChild(summary);
    var list = el("ol", {"class": "chain"});
    f.stack.forEach(function (frame) { list.appendChild(frameItem(frame)); });
    if (!f.stack.length) list.appendChild(el("li", {"class": "empty"}, "no stack recorded"));
    details.appendChild(list);
    return details;
  }

  function younger(f) {  // what --min-age left out of this finding
    if (!f.younger_count) return "";
    return " (+ " + f.younger_count + " younger, " + bytes(f.younger_bytes) + ", not counted)";
  }

  function frameItem(frame) {
    var li = el("li", {"class": "kind-" + frame.kind});
    li.appendChild(el("span", {"class": "kind"}, {kernel: "k", native: "n", python: "py"}[frame.kind] || "?"));
    li.appendChild(el("span", {"class": "function"}, frame.function || "??"));
    var where = frame.file ? frame.file + (frame.line ? ":" + frame.line : "") : frame.module;
    if (where) li.appendChild(el("span", {"class": "where"}, where));
    return li;
  }

  // ---- icicle -----------------------------------------------------------------------------
  var atSelect = document.getElementById("flame-at"), layerSelect = document.getElementById("flame-layer");
  var focus = null, ROW = 18;

  function setupFlame() {
    [["end", "the end"], ["peak", "each layer's peak"]].forEach(function (o) {
      if (data.flames[o[0]]) atSelect.appendChild(el("option", {value: o[0]}, o[1]));
    });
    var flames = data.flames.end || [];
    flames.forEach(function (f) { layerSelect.appendChild(el("option", {value: f.layer}, f.layer)); });
    // Start on the first layer (outermost) that still holds bytes at the end.
    var held = flames.filter(function (f) { return f.root[1] > 0; })[0];
    if (held) layerSelect.value = held.layer;
    atSelect.addEventListener("change", function () { focus = null; drawFlame(); });
    layerSelect.addEventListener("change", function () { focus = null; drawFlame(); });
    drawFlame();
  }

  function currentFlame() {
    return (data.flames[atSelect.value] || []).filter(function (f) { return f.layer === layerSelect.value; })[0];
  }

  function nodeName(node, flame) {
    if (node[0] === -1) return flame.layer + " at " + seconds(flame.t) + " (" + flame.live_count + (flame.live_count === 1 ? " allocation)" : " allocations)");
    if (node[0] < 0) return SPECIAL[String(node[0])];
    var f = data.frames[node[0]];
    return (f[1] || "??") + (f[2] ? "  " + f[2] : "");
  }

  function drawFlame() {
    var box = document.getElementById("flame"), flame = currentFlame();
    box.textContent = "";
    if (!flame || !flame.root[1]) { box.appendChild(el("p", {"class": "empty"}, "Nothing live.")); return; }
    var start = focus || flame.root, width = Math.max(box.clientWidth, 320);
    var rows = [];
    layout(start, 0, 0, width / start[1], rows);
    var root = svg("svg", {viewBox: "0 0 " + width + " " + (ROW * (maxDepth(rows) + 1)), height: ROW * (maxDepth(rows) + 1)});
    rows.forEach(function (r) { root.appendChild(flameBox(r, flame)); });
    box.appendChild(root);
  }

  function layout(node, depth, x, scale, out) {
    var w = node[1] * scale;
    if (w < 0.5) return;
    out.push({node: node, depth: depth, x: x, w: w});
    var cx = x;
    node[2].forEach(function (child) { layout(child, depth + 1, cx, scale, out); cx += child[1] * scale; });
  }

  function maxDepth(rows) { return rows.reduce(function (m, r) { return Math.max(m, r.depth); }, 0); }

  function flameBox(r, flame) {
    var g = svg("g"), name = nodeName(r.node, flame), total = flame.root[1];
    var kind = r.node[0] >= 0 ? data.frames[r.node[0]][0] : null;
    var fill = {kernel: "var(--kernel)", native: "var(--native)", python: "var(--python)"}[kind] ||
               (r.node[0] === -1 ? "var(--layer)" : "var(--other)");
    var rect = svg("rect", {x: r.x, y: r.depth * ROW, width: r.w, height: ROW - 1, fill: fill});
    rect.appendChild(svg("title", {}, name + "\n" + bytes(r.node[1]) + " (" + (100 * r.node[1] / total).toFixed(1) + "%)"));
    rect.addEventListener("click", function () { focus = (r.depth === 0 ? null : r.node); drawFlame(); });
    g.appendChild(rect);
    var chars = Math.floor((r.w - 6) / 6.5);
    if (chars >= 3) {
      var text = name.length > chars ? name.slice(0, chars - 1) + "…" : name;
      g.appendChild(svg("text", {x: r.x + 3, y: r.depth * ROW + 13}, text));
    }
    return g;
  }

  // ---- GPU --------------------------------------------------------------------------------
  var EQUATION = [["used_nvml", "NVML used"], ["context_and_unseen", "  context and unseen"], ["driver", "driver (cuda_driver)"],
    ["not_pytorch", "  not PyTorch (NCCL, …)"], ["reserved", "reserved (cuda_segment)"], ["cached_free", "  cached free"],
    ["allocated", "allocated (cuda_block)"], ["requested", "  requested"], ["gpu_used", "GPU used, every process"]];

  function drawGpu() {
    var box = document.getElementById("gpu"), gpu = data.gpu;
    if (!gpu.devices.length) box.appendChild(el("p", {"class": "empty"}, "No GPU memory recorded."));
    gpu.notes.forEach(function (n) { box.appendChild(el("p", {"class": "note"}, n)); });
    gpu.devices.forEach(function (d) { box.appendChild(gpuDevice(d)); });
  }

  function gpuDevice(d) {
    var div = el("div", {"class": "gpu-device"});
    div.appendChild(el("h3", {}, d.device + (d.peak ? " at its peak (" + d.peak_of + "), " + seconds(d.peak.ts_ns - data.span.start_ns) : "")));
    var table = el("table"), peak = d.peak || {};
    EQUATION.forEach(function (term) {
      var tr = el("tr");
      tr.appendChild(el("th", {}, term[1]));
      tr.appendChild(el("td", {"class": "num"}, bytes(peak[term[0]])));
      tr.appendChild(el("td", {"class": "note"}, d.missing[term[0]] || ""));
      table.appendChild(tr);
    });
    div.appendChild(table);
    var frag = peak.fragmentation === null || peak.fragmentation === undefined ? "–" : (100 * peak.fragmentation).toFixed(1) + "%";
    var amp = d.amplification === null ? "–" : d.amplification.toFixed(2) + "×";
    div.appendChild(el("p", {}, "fragmentation " + frag + ", amplification (peak reserved / peak requested) " + amp));
    d.notes.forEach(function (n) { div.appendChild(el("p", {"class": "note"}, n)); });
    return div;
  }

  // ---- advice -------------------------------------------------------------------------------
  function drawAdvice() {
    var advice = data.advice;
    if (!advice || !advice.advice.length) return;  // no rule found its pattern: nothing to show
    document.getElementById("advice-section").hidden = false;
    var box = document.getElementById("advice");
    advice.advice.forEach(function (a, i) {
      var item = el("div", {"class": "advice", "data-rule": a.rule});
      item.appendChild(el("h3", {}, (i + 1) + ". " + a.title));
      var evidence = el("ul", {});
      a.evidence.forEach(function (line) { evidence.appendChild(el("li", {}, line)); });
      a.chains.forEach(function (c) { evidence.appendChild(el("li", {"class": "chain"}, "chain: " + c.name)); });
      a.modules.forEach(function (m) { evidence.appendChild(el("li", {"class": "chain"}, "module: " + m)); });
      item.appendChild(evidence);
      item.appendChild(el("p", {}, "Try: " + a.change));
      item.appendChild(el("p", {"class": "saving"}, "Saving: " + a.saving +
                          (a.saving_bytes ? " (" + bytes(a.saving_bytes) + ")" : "")));
      if (a.thresholds.length) {
        item.appendChild(el("p", {"class": "note"}, "Thresholds: " + a.thresholds.map(function (t) {
          return t.name + " = " + (t.unit === "bytes" ? bytes(t.value) : t.value + " " + t.unit) + " (" + t.meaning + ")";
        }).join("; ")));
      }
      box.appendChild(item);
    });
  }

  // ---- regions and the memory surface -------------------------------------------------------
  var CELL = {w: 112, h: 44}, AXIS = {left: 96, top: 48};
  var LIGHT = [255, 245, 235], DARK = [127, 39, 4];  // few bytes → many bytes, one hue, so the order reads at a glance

  function drawRegions() {
    var regions = data.regions;
    if (!regions || !regions.regions.length) return;  // no marks with numbers: nothing to show
    document.getElementById("regions-section").hidden = false;
    var box = document.getElementById("surface");
    (regions.surface_notes || []).forEach(function (n) { box.appendChild(el("p", {"class": "note"}, n)); });
    if (regions.surface) drawSurface(regions.surface, box);
    document.getElementById("regions").appendChild(regionsTable(regions));
  }

  function drawSurface(surface, box) {
    box.appendChild(el("h3", {}, "Memory surface: each layer's peak by " + surface.rows + " (rows) × " +
                                 surface.columns + " (columns)"));
    var select = el("select", {id: "surface-layer"}), plot = el("div", {id: "surface-plot"});
    surface.grids.forEach(function (g, i) { select.appendChild(el("option", {value: i}, gridName(g))); });
    var label = el("label", {}, "layer "); label.appendChild(select);
    box.appendChild(el("div", {"class": "toolbar"})).appendChild(label);
    box.appendChild(plot);
    var draw = function () {
      var grid = surface.grids[+select.value], values = [].concat.apply([], grid.bytes).filter(function (v) { return v !== null; });
      plot.textContent = "";
      plot.appendChild(heatmap(surface, grid));
      plot.appendChild(el("p", {"class": "note surface-scale"}, "lightest " + bytes(Math.min.apply(null, values)) +
                                                                  ", darkest " + bytes(Math.max.apply(null, values))));
    };
    select.addEventListener("change", draw);
    draw();
  }

  function gridName(g) { return g.layer + (g.device ? " " + g.device : ""); }

  // One rect per (row, column), coloured by its peak between the grid's lowest and highest,
  // the peak written in it; the column quantity's values on top, the row quantity's on the left.
  function heatmap(surface, grid) {
    var rows = surface.row_values.length, cols = surface.column_values.length;
    var width = AXIS.left + cols * CELL.w + 8, height = AXIS.top + rows * CELL.h + 8;
    var root = svg("svg", {viewBox: "0 0 " + width + " " + height, width: width, height: height, "class": "heatmap",
                           "data-layer": gridName(grid)});
    var values = [].concat.apply([], grid.bytes).filter(function (v) { return v !== null; });
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    root.appendChild(svg("text", {x: AXIS.left + cols * CELL.w / 2, y: 14, "text-anchor": "middle",
                                  "class": "axis-name"}, surface.columns + " →"));
    root.appendChild(svg("text", {x: 4, y: AXIS.top - 8, "class": "axis-name"}, surface.rows + " ↓"));
    surface.column_values.forEach(function (v, j) {
      root.appendChild(svg("text", {x: AXIS.left + (j + 0.5) * CELL.w, y: AXIS.top - 8, "text-anchor": "middle",
                                    "class": "column-value"}, v));
    });
    surface.row_values.forEach(function (v, i) {
      root.appendChild(svg("text", {x: AXIS.left - 10, y: AXIS.top + (i + 0.5) * CELL.h + 4, "text-anchor": "end",
                                    "class": "row-value"}, v));
      surface.column_values.forEach(function (w, j) { root.appendChild(cell(surface, grid, i, j, lo, hi)); });
    });
    return root;
  }

  function cell(surface, grid, i, j, lo, hi) {
    var v = grid.bytes[i][j], x = AXIS.left + j * CELL.w, y = AXIS.top + i * CELL.h;
    var g = svg("g"), share = v === null ? 0 : hi > lo ? (v - lo) / (hi - lo) : 1;
    var rgb = LIGHT.map(function (c, k) { return Math.round(c + (DARK[k] - c) * share); });
    var rect = svg("rect", {"class": "surface-cell", x: x, y: y, width: CELL.w, height: CELL.h,
                            fill: v === null ? "#ddd" : "rgb(" + rgb.join(",") + ")", "data-row": surface.row_values[i],
                            "data-column": surface.column_values[j], "data-bytes": v === null ? "" : v});
    rect.appendChild(svg("title", {}, surface.rows + " " + surface.row_values[i] + ", " + surface.columns + " " +
                                      surface.column_values[j] + ": " + (v === null ? "not run" : bytes(v))));
    g.appendChild(rect);
    var text = svg("text", {"class": "surface-value", x: x + CELL.w / 2, y: y + CELL.h / 2 + 4, "text-anchor": "middle"},
                   v === null ? "–" : bytes(v));
    text.style.fill = share > 0.55 ? "#fff" : "#111";  // readable on the dark cells and the light ones
    g.appendChild(text);
    return g;
  }

  function regionsTable(regions) {
    var table = el("table", {"class": "regions"}), head = el("tr");
    var keys = regions.regions[0].peaks.map(function (p) { return p.layer + (p.device ? " " + p.device : ""); });
    ["region", "label"].concat(regions.quantities, keys.map(function (k) { return "peak " + k; }), ["from", "for"])
      .forEach(function (name, k) { head.appendChild(el("th", {"class": k > 1 ? "num" : ""}, name)); });
    table.appendChild(head);
    regions.regions.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", {"class": "num"}, r.index));
      tr.appendChild(el("td", {}, r.label));
      regions.quantities.forEach(function (q) { tr.appendChild(el("td", {"class": "num"}, q in r.quantities ? r.quantities[q] : "–")); });
      r.peaks.forEach(function (p) {
        var td = el("td", {"class": "num"}, bytes(p.peak_bytes));
        var top = p.top_chains[0];
        if (top) td.title = "held most at the peak: " + bytes(top.live_bytes) + " " + top.name;
        tr.appendChild(td);
      });
      tr.appendChild(el("td", {"class": "num"}, seconds(r.start_ns - data.span.start_ns)));
      tr.appendChild(el("td", {"class": "num"}, ((r.end_ns - r.start_ns) / 1e9).toFixed(3) + " s"));
      table.appendChild(tr);
    });
    return table;
  }

  // ---- start ------------------------------------------------------------------------------
  window.memprof = {
    zoom: function (t0s, t1s) { zoomNs(t0s * 1e9, t1s * 1e9); },  // seconds after the recording's start
    reset: function () { view = full.slice(); drawCharts(); },
    range: function () { return [view[0] / 1e9, view[1] / 1e9]; },
    data: data
  };
  document.getElementById("zoom-reset").addEventListener("click", window.memprof.reset);
  drawHeader();
  drawCharts();
  drawLeaks();
  setupFlame();
  drawAdvice();
  drawRegions();
  drawGpu();
  drawMeta();
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { drawCharts(); drawFlame(); }, 150);
  });
}());
