/* ale view: the page's lists (LLM calls, the agent's transcript, the timeline), built from the data
   in #ale-view-data. Everything in that data came from a bundle and is untrusted: it only ever
   reaches the page as text (textContent) or as numbers, never as markup, a URL or code. */
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("ale-view-data").textContent);
  var T = DATA.timeline;
  var N = T.seq.length;
  var PAGE = 100;
  var COLLAPSED_LINES = 12;
  var COLLAPSED_CHARS = 4000;

  // -- helpers ----------------------------------------------------------------------------------

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function add(parent, child) {
    parent.appendChild(child);
    return child;
  }

  function num(value) {
    if (value === null || value === undefined) return "";
    if (typeof value !== "number") return String(value);
    return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toLocaleString("en-US", { maximumFractionDigits: 2 });
  }

  function clock(us) {
    var abs = T.start_us + us;
    var date = new Date(Math.floor(abs / 1000));
    if (isNaN(date.getTime())) return "";
    return date.toISOString().slice(11, 23) + String(abs % 1000).padStart(3, "0");
  }

  function seconds(us) {
    return (us / 1e6).toFixed(3);
  }

  function shortTask(index) {
    return index < 0 ? "" : T.tasks[index];
  }

  function debounce(fn, ms) {
    var timer = null;
    return function () {
      if (timer !== null) clearTimeout(timer);
      timer = setTimeout(function () { timer = null; fn(); }, ms);
    };
  }

  /* A search box: apply(query) when typing pauses, or at once on Enter; never twice for one query
     (a search that ran on Enter does not run again when the pause comes, which would redraw the list). */
  function searchBox(input, apply) {
    var last = input.value.trim().toLowerCase();
    function run() {
      var q = input.value.trim().toLowerCase();
      if (q === last) return;
      last = q;
      apply(q);
    }
    input.addEventListener("input", debounce(run, 150));
    input.addEventListener("keydown", function (e) { if (e.key === "Enter") run(); });
    return function reset() { input.value = ""; last = ""; };
  }

  /* A text in a <pre>: the first COLLAPSED_LINES lines (or COLLAPSED_CHARS characters) and a button
     that shows the rest. */
  function collapsible(parent, text, what) {
    var lines = text.split("\n");
    var pre = add(parent, el("pre", "body"));
    var long = lines.length > COLLAPSED_LINES || text.length > COLLAPSED_CHARS;
    if (!long) {
      pre.textContent = text;
      return pre;
    }
    var head = lines.slice(0, COLLAPSED_LINES).join("\n");
    if (head.length > COLLAPSED_CHARS) head = head.slice(0, COLLAPSED_CHARS);
    pre.textContent = head;
    pre.dataset.collapsed = "true";
    var more = add(parent, el("button", "more", "Show all " + num(lines.length) + " " + what + " (" + num(text.length) + " characters)"));
    more.type = "button";
    more.setAttribute("aria-expanded", "false");
    more.addEventListener("click", function () {
      var open = pre.dataset.collapsed === "true";
      pre.textContent = open ? text : head;
      pre.dataset.collapsed = open ? "false" : "true";
      more.setAttribute("aria-expanded", open ? "true" : "false");
      more.textContent = open ? "Show the first " + COLLAPSED_LINES + " " + what : "Show all " + num(lines.length) + " " + what + " (" + num(text.length) + " characters)";
    });
    return pre;
  }

  // -- a paged list -----------------------------------------------------------------------------

  /* opts: body (tbody or ol), pager, count (elements), noun, total, filter() -> array of items,
     render(item, position) -> a node for body. */
  function PagedList(opts) {
    this.opts = opts;
    this.items = [];
    this.page = 0;
    this.buildPager();
  }

  PagedList.prototype.buildPager = function () {
    var self = this;
    var root = this.opts.pager;
    function button(label, name, go) {
      var b = add(root, el("button", "", label));
      b.type = "button";
      b.dataset.go = name;
      b.addEventListener("click", function () { self.show(go()); });
      return b;
    }
    this.first = button("« First", "first", function () { return 0; });
    this.prev = button("‹ Previous", "prev", function () { return self.page - 1; });
    var label = add(root, el("label", ""));
    label.appendChild(document.createTextNode("Page "));
    this.input = add(label, el("input", ""));
    this.input.type = "number";
    this.input.min = "1";
    this.input.addEventListener("change", function () { self.show((parseInt(self.input.value, 10) || 1) - 1); });
    this.of = add(label, el("span", ""));
    this.next = button("Next ›", "next", function () { return self.page + 1; });
    this.last = button("Last »", "last", function () { return self.pages() - 1; });
  };

  PagedList.prototype.pages = function () {
    return Math.max(1, Math.ceil(this.items.length / PAGE));
  };

  PagedList.prototype.refresh = function () {
    this.items = this.opts.filter();
    this.show(0);
  };

  PagedList.prototype.show = function (page) {
    var pages = this.pages();
    this.page = Math.min(Math.max(0, page), pages - 1);
    var body = this.opts.body;
    body.replaceChildren();
    var start = this.page * PAGE;
    var end = Math.min(this.items.length, start + PAGE);
    for (var j = start; j < end; j++) body.appendChild(this.opts.render(this.items[j], j));
    var count = this.opts.count;
    count.dataset.matching = String(this.items.length);
    count.dataset.total = String(this.opts.total);
    count.textContent = this.items.length === 0
      ? "No " + this.opts.noun + " match (of " + num(this.opts.total) + ")."
      : "Showing " + num(start + 1) + "–" + num(end) + " of " + num(this.items.length) + " matching " + this.opts.noun + " (of " + num(this.opts.total) + ").";
    this.input.value = String(this.page + 1);
    this.input.max = String(pages);
    this.of.textContent = " of " + num(pages);
    this.first.disabled = this.prev.disabled = this.page === 0;
    this.next.disabled = this.last.disabled = this.page >= pages - 1;
  };

  /* Shows the page holding position j and returns the node rendered for it. */
  PagedList.prototype.reveal = function (j) {
    this.show(Math.floor(j / PAGE));
    return this.opts.body.children[j - this.page * PAGE] || null;
  };

  // -- the timeline -----------------------------------------------------------------------------

  /* What is never shown as itself (as view_model.visible does in Python): C0 controls but tab and
     newline, DEL, C1 controls, bidirectional overrides. JSON.stringify writes C0 controls as \u
     escapes already. */
  var SPECIAL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

  function shown(text) {
    return text.replace(SPECIAL, function (ch) {
      var code = ch.charCodeAt(0);
      if (code < 0x20) return String.fromCharCode(0x2400 + code);
      if (code === 0x7f) return "\u2421";
      return "\u27e8U+" + code.toString(16).toUpperCase().padStart(4, "0") + "\u27e9";
    });
  }

  /* An event's data as text: a text event's text, a cut detail as it is, else the data as JSON. */
  function detailText(i, indent) {
    var d = T.detail[i];
    if (d === null) return T.text[i];
    if (typeof d === "string") return shown(d);
    return shown(JSON.stringify(d, null, indent ? 2 : 0));
  }

  var lowered = null; // lower-cased kind, text and data of every event, made on the first search

  function eventHaystack(i) {
    if (lowered === null) {
      lowered = new Array(N);
      for (var k = 0; k < N; k++) {
        lowered[k] = (T.kinds[T.kind[k]] + "\n" + T.text[k] + (T.detail[k] === null ? "" : "\n" + detailText(k, false))).toLowerCase();
      }
    }
    return lowered[i];
  }

  var tlFilter = { producers: {}, kind: -1, phase: -1, task: -2, query: "", order: "time" };
  var resetFind = function () {};
  var producerBoxes = Array.prototype.slice.call(document.querySelectorAll("input.tl-producer"));
  producerBoxes.forEach(function (box) { tlFilter.producers[box.value] = box.checked; });

  function timelineItems() {
    var out = [];
    var order = tlFilter.order === "time" ? T.by_time : null;
    var q = tlFilter.query;
    for (var j = 0; j < N; j++) {
      var i = order ? order[j] : j;
      if (!tlFilter.producers[T.producer[i]]) continue;
      if (tlFilter.kind >= 0 && T.kind[i] !== tlFilter.kind) continue;
      if (tlFilter.phase >= 0 && T.phase[i] !== tlFilter.phase) continue;
      if (tlFilter.task !== -2 && T.task[i] !== tlFilter.task) continue;
      if (q && eventHaystack(i).indexOf(q) < 0) continue;
      out.push(i);
    }
    return out;
  }

  function toggleDetail(row, button, i) {
    var next = row.nextSibling;
    if (next && next.classList && next.classList.contains("detail")) {
      next.remove();
      button.setAttribute("aria-expanded", "false");
      return null;
    }
    var tr = el("tr", "detail");
    var td = add(tr, el("td", ""));
    td.colSpan = 8;
    var head = add(td, el("p", "muted"));
    head.textContent = "seq " + T.seq[i] + " · " + T.producers[T.producer[i]] + " · " + T.kinds[T.kind[i]] +
      (T.detail[i] === null ? " · text" : " · data");
    add(td, el("pre", "data", detailText(i, true)));
    row.after(tr);
    button.setAttribute("aria-expanded", "true");
    return tr;
  }

  function timelineRow(i) {
    var tr = el("tr", "row");
    tr.dataset.i = String(i);
    var first = add(tr, el("td", ""));
    var open = add(first, el("button", "open", T.seq[i]));
    open.type = "button";
    open.setAttribute("aria-expanded", "false");
    open.setAttribute("aria-label", "event " + T.seq[i] + ": show its data");
    open.addEventListener("click", function () { toggleDetail(tr, open, i); });
    add(tr, el("td", "when", clock(T.time_us[i])));
    add(tr, el("td", "when", seconds(T.time_us[i])));
    var producer = add(tr, el("td", ""));
    add(producer, el("span", "lane lane-" + Math.min(T.producer[i], 5), T.producers[T.producer[i]]));
    add(tr, el("td", "", T.kinds[T.kind[i]]));
    add(tr, el("td", "", T.phases[T.phase[i]]));
    add(tr, el("td", "", shortTask(T.task[i])));
    var text = add(tr, el("td", "text", T.text[i].length > 400 ? T.text[i].slice(0, 400) + "…" : T.text[i]));
    text.title = T.text[i].slice(0, 2000);
    return tr;
  }

  var timeline = new PagedList({
    body: document.querySelector("#tl-table tbody"),
    pager: document.getElementById("tl-pager"),
    count: document.getElementById("tl-count"),
    noun: "events",
    total: N,
    filter: timelineItems,
    render: timelineRow,
  });

  function fillSelect(select, names, column, keep) {
    var counts = new Array(names.length).fill(0);
    for (var i = 0; i < N; i++) if (column[i] >= 0) counts[column[i]]++;
    names.forEach(function (name, index) {
      if (!counts[index] && !keep) return;
      var option = add(select, el("option", "", name + " (" + num(counts[index]) + ")"));
      option.value = String(index);
    });
  }

  function bindTimelineFilters() {
    var kind = document.getElementById("tl-kind");
    var phase = document.getElementById("tl-phase");
    var task = document.getElementById("tl-task");
    var order = document.getElementById("tl-order");
    var find = document.getElementById("tl-find");
    fillSelect(kind, T.kinds, T.kind, false);
    fillSelect(phase, T.phases, T.phase, false);
    fillSelect(task, T.tasks, T.task, true);
    producerBoxes.forEach(function (box) {
      box.addEventListener("change", function () { tlFilter.producers[box.value] = box.checked; timeline.refresh(); });
    });
    kind.addEventListener("change", function () { tlFilter.kind = parseInt(kind.value, 10); timeline.refresh(); });
    phase.addEventListener("change", function () { tlFilter.phase = parseInt(phase.value, 10); timeline.refresh(); });
    task.addEventListener("change", function () { tlFilter.task = parseInt(task.value, 10); timeline.refresh(); });
    order.addEventListener("change", function () { tlFilter.order = order.value; timeline.refresh(); });
    resetFind = searchBox(find, function (q) { tlFilter.query = q; timeline.refresh(); });
  }

  function mark(row) {
    if (!row) return;
    document.querySelectorAll("#tl-table tr.marked").forEach(function (r) { r.classList.remove("marked"); });
    row.classList.add("marked");
    row.scrollIntoView({ block: "center" });
  }

  /* The first listed event at or after wall time us. */
  function jumpToTime(us) {
    var items = timeline.items;
    for (var j = 0; j < items.length; j++) {
      if (T.time_us[items[j]] >= us) { mark(timeline.reveal(j)); return; }
    }
    if (items.length) mark(timeline.reveal(items.length - 1));
  }

  /* Event i in the timeline, every filter cleared, its data open. */
  function reveal(i) {
    producerBoxes.forEach(function (box) { box.checked = true; tlFilter.producers[box.value] = true; });
    ["tl-kind", "tl-phase"].forEach(function (id) { document.getElementById(id).value = "-1"; });
    document.getElementById("tl-task").value = "-2";
    resetFind();
    tlFilter.kind = tlFilter.phase = -1;
    tlFilter.task = -2;
    tlFilter.query = "";
    timeline.refresh();
    var j = timeline.items.indexOf(i);
    if (j < 0) return;
    var row = timeline.reveal(j);
    if (row) {
      var button = row.querySelector("button.open");
      if (button.getAttribute("aria-expanded") !== "true") toggleDetail(row, button, i);
      mark(row);
    }
  }

  // -- the lanes --------------------------------------------------------------------------------

  var LEFT = 170;
  var LANE = 22;

  function lanesInUse() {
    var seen = new Array(T.producers.length).fill(0);
    for (var i = 0; i < N; i++) seen[T.producer[i]]++;
    var lanes = [];
    seen.forEach(function (count, index) { if (count) lanes.push(index); });
    return lanes;
  }

  function drawLanes() {
    var canvas = document.getElementById("lanes");
    var lanes = lanesInUse();
    var height = LANE * lanes.length + 26;
    canvas.style.height = height + "px";
    var width = canvas.clientWidth || 800;
    var ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    var ctx = canvas.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    var css = getComputedStyle(document.documentElement);
    var plot = Math.max(10, width - LEFT - 10);
    var span = 1;
    for (var i = 0; i < N; i++) if (T.time_us[i] > span) span = T.time_us[i];
    var laneOf = {};
    lanes.forEach(function (p, row) { laneOf[p] = row; });
    var buckets = new Int32Array(lanes.length * plot);
    var most = 1;
    for (i = 0; i < N; i++) {
      var at = laneOf[T.producer[i]] * plot + Math.min(plot - 1, Math.floor(T.time_us[i] / span * (plot - 1)));
      if (++buckets[at] > most) most = buckets[at];
    }
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    lanes.forEach(function (p, row) {
      var y = row * LANE + 4;
      var colour = css.getPropertyValue("--lane-" + Math.min(p, 5)).trim() || "#1d4ed8";
      ctx.fillStyle = "#111827";
      ctx.fillText(T.producers[p], 6, y + LANE / 2 - 2);
      ctx.fillStyle = colour;
      for (var x = 0; x < plot; x++) {
        var count = buckets[row * plot + x];
        if (!count) continue;
        ctx.globalAlpha = 0.25 + 0.75 * Math.log(1 + count) / Math.log(1 + most);
        ctx.fillRect(LEFT + x, y, 1, LANE - 6);
      }
      ctx.globalAlpha = 1;
    });
    var started = T.kinds.indexOf("task_started");
    ctx.strokeStyle = "#4b5563";
    ctx.fillStyle = "#4b5563";
    for (i = 0; i < N; i++) {
      if (T.kind[i] !== started) continue;
      var tx = LEFT + Math.floor(T.time_us[i] / span * (plot - 1)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(tx, 0);
      ctx.lineTo(tx, lanes.length * LANE + 4);
      ctx.stroke();
    }
    var axis = lanes.length * LANE + 16;
    ctx.fillText("0 s", LEFT, axis);
    var end = seconds(span) + " s";
    ctx.fillText(end, LEFT + plot - ctx.measureText(end).width, axis);
    canvas.dataset.span = String(span);
    canvas.dataset.plot = String(plot);
  }

  function bindLanes() {
    var canvas = document.getElementById("lanes");
    canvas.addEventListener("click", function (e) {
      var rect = canvas.getBoundingClientRect();
      var x = e.clientX - rect.left - LEFT;
      var plot = parseFloat(canvas.dataset.plot || "1");
      var span = parseFloat(canvas.dataset.span || "1");
      jumpToTime(Math.max(0, x) / Math.max(1, plot - 1) * span);
    });
    window.addEventListener("resize", debounce(drawLanes, 200));
  }

  // -- the transcript ---------------------------------------------------------------------------

  var TR = DATA.transcript;
  var entryCount = TR.event.length;
  var entryLowered = null;

  function entryText(k) {
    var lines = TR.lines[k];
    if (lines !== null) return lines.map(function (i) { return T.text[i]; }).join("\n");
    return TR.body[k];
  }

  function entryHaystack(k) {
    if (entryLowered === null) {
      entryLowered = new Array(entryCount);
      for (var j = 0; j < entryCount; j++) entryLowered[j] = (TR.title[j] + "\n" + entryText(j)).toLowerCase();
    }
    return entryLowered[k];
  }

  var trQuery = "";

  function transcriptItems() {
    var q = trQuery;
    var out = [];
    for (var k = 0; k < entryCount; k++) if (!q || entryHaystack(k).indexOf(q) >= 0) out.push(k);
    return out;
  }

  function transcriptEntry(k) {
    var i = TR.event[k];
    var lines = TR.lines[k];
    var producer = T.producers[T.producer[i]];
    var kind = T.kinds[T.kind[i]];
    var cls = lines !== null ? "output " + (kind.indexOf("stderr") >= 0 ? "stderr" : "stdout")
      : producer === "trusted_harness" ? "harness" : producer === "trusted_network_proxy" ? "gateway" : "agent";
    var li = el("li", cls);
    li.dataset.kind = kind;
    var head = add(li, el("div", "head"));
    add(head, el("strong", "", lines !== null ? kind + " · " + num(lines.length) + (lines.length === 1 ? " line" : " lines") : kind));
    add(head, el("span", "when", clock(T.time_us[i]) + " (+" + seconds(T.time_us[i]) + " s)"));
    if (T.task[i] >= 0) add(head, el("span", "", shortTask(T.task[i])));
    var go = add(head, el("button", "", "seq " + T.seq[i] + " in the timeline"));
    go.type = "button";
    go.addEventListener("click", function () { reveal(i); });
    if (lines !== null) {
      collapsible(li, entryText(k), "lines");
    } else {
      if (TR.title[k] && TR.title[k] !== kind) add(li, el("div", "title", TR.title[k]));
      if (TR.body[k]) collapsible(li, TR.body[k], "lines");
    }
    return li;
  }

  var transcript = new PagedList({
    body: document.getElementById("tr-list"),
    pager: document.getElementById("tr-pager"),
    count: document.getElementById("tr-count"),
    noun: "entries",
    total: entryCount,
    filter: transcriptItems,
    render: transcriptEntry,
  });
  searchBox(document.getElementById("tr-find"), function (q) { trQuery = q; transcript.refresh(); });

  // -- the gateway's calls ----------------------------------------------------------------------

  var calls = DATA.llm;
  var llmTable = document.getElementById("llm-table");
  var llm = null;

  var llmQuery = "";

  function llmItems() {
    var decision = document.getElementById("llm-decision").value;
    var q = llmQuery;
    var out = [];
    calls.forEach(function (c, k) {
      if (decision && c.decision !== decision) return;
      if (q && (c.request_id + "\n" + c.model + "\n" + c.path + "\n" + c.reason + "\n" + c.upstream).toLowerCase().indexOf(q) < 0) return;
      out.push(k);
    });
    return out;
  }

  function llmRow(k) {
    var c = calls[k];
    var tr = el("tr", "row " + (c.decision === "denied" ? "denied" : "allowed"));
    tr.dataset.i = String(c.event);
    var first = add(tr, el("td", ""));
    var open = add(first, el("button", "open", c.request_id || "#" + T.seq[c.event]));
    open.type = "button";
    open.setAttribute("aria-expanded", "false");
    open.addEventListener("click", function () {
      var next = tr.nextSibling;
      if (next && next.classList && next.classList.contains("detail")) {
        next.remove();
        open.setAttribute("aria-expanded", "false");
        return;
      }
      var detail = el("tr", "detail");
      var td = add(detail, el("td", ""));
      td.colSpan = 12;
      add(td, el("pre", "data", detailText(c.event, true)));
      tr.after(detail);
      open.setAttribute("aria-expanded", "true");
    });
    add(tr, el("td", "when", clock(T.time_us[c.event])));
    [c.method, c.path, c.model, c.status, c.decision + (c.reason ? " (" + c.reason + ")" : ""),
      num(c.input_tokens), num(c.output_tokens), num(c.cached_input_tokens), num(c.duration_ms), num(c.ttfb_ms)]
      .forEach(function (value) { add(tr, el("td", "", value)); });
    return tr;
  }

  if (llmTable) {
    llm = new PagedList({
      body: llmTable.querySelector("tbody"),
      pager: document.getElementById("llm-pager"),
      count: document.getElementById("llm-count"),
      noun: "calls",
      total: calls.length,
      filter: llmItems,
      render: llmRow,
    });
    document.getElementById("llm-decision").addEventListener("change", function () { llm.refresh(); });
    searchBox(document.getElementById("llm-find"), function (q) { llmQuery = q; llm.refresh(); });
  }

  // -- start ------------------------------------------------------------------------------------

  bindTimelineFilters();
  bindLanes();
  drawLanes();
  timeline.refresh();
  transcript.refresh();
  if (llm) llm.refresh();
  document.documentElement.dataset.ready = "true";
})();
