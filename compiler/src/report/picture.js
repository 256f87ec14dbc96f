// The plan page's script (inlined by picture.rs; plain JavaScript, no libraries).
// Data: see page_data in picture.rs. Buffers: [provenance, kind, dtype, shape, bytes, start,
// end, offset, node, op, fused]; positions: [provenance, op, node]; strings by index.
(function () {
  "use strict";
  window.onerror = function (msg) {
    document.body.setAttribute("data-error", String(msg));
  };
  var D = JSON.parse(document.getElementById("plan-data").textContent);
  var S = D.strings, B = D.buffers, N = Math.max(D.positions, 1), K = D.kinds.length;
  var PROV = 0, KIND = 1, DT = 2, SH = 3, BY = 4, ST = 5, EN = 6, OFF = 7, NODE = 8, OP = 9, FU = 10;
  var PHASE_COL = ["#dbe8f6", "#f8dcdc", "#e0f0da"];
  var L = 78, R = 12;

  function human(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = b;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    return i ? v.toFixed(2) + " " + u[i] : b + " B";
  }
  function el(tag, text) { var e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; }
  function opLabel(p) {
    var o = D.ops[p];
    return o ? S[o[0]] + " (%" + o[2] + " " + S[o[1]] + ")" : "";
  }

  // Live bytes at each position, by kind (difference arrays, then prefix sums).
  var live = [], top = new Float64Array(N);
  for (var k = 0; k < K; k++) live.push(new Float64Array(N + 1));
  B.forEach(function (b) {
    live[b[KIND]][b[ST]] += b[BY];
    live[b[KIND]][Math.min(b[EN], N)] -= b[BY];
  });
  for (k = 0; k < K; k++) {
    for (var p = 1; p <= N; p++) live[k][p] += live[k][p - 1];
  }
  var maxLive = 1;
  for (p = 0; p < N; p++) {
    var t = 0;
    for (k = 0; k < K; k++) t += live[k][p];
    top[p] = t;
    if (t > maxLive) maxLive = t;
  }

  // The view: positions [x0, x1) across both charts; offsets [y0, y1) up the placement.
  var view = { x0: 0, x1: N, y0: 0, y1: Math.max(D.total, 1) };
  var selected = -1, tablePos = D.peak, sortKey = 4, sortDir = -1;
  var curve = document.getElementById("curve"), place = document.getElementById("placement");
  var tip = document.getElementById("tip");

  function setup(c) {
    var w = c.clientWidth || 1000;
    var dpr = window.devicePixelRatio || 1;
    if (!c._h) c._h = parseFloat(c.getAttribute("height"));
    c._w = w;
    c.width = Math.round(w * dpr); c.height = Math.round(c._h * dpr); c._dpr = dpr;
    c.style.height = c._h + "px";
    var g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return g;
  }
  function X(c, pos) { return L + (pos - view.x0) / (view.x1 - view.x0) * (c._w - L - R); }
  function posAt(c, x) { return view.x0 + (x - L) / (c._w - L - R) * (view.x1 - view.x0); }

  var CURVE_PLOT = 220; // curve height; below it the phase band and the layer names
  function drawCurve() {
    var g = setup(curve), W = curve._w, H = CURVE_PLOT, top0 = 18;
    g.clearRect(0, 0, W, curve._h);
    g.fillStyle = "#fafafa"; g.fillRect(L, top0, W - L - R, H);
    var sy = H / (maxLive * 1.05);
    var p0 = Math.max(0, Math.floor(view.x0)), p1 = Math.min(N, Math.ceil(view.x1));
    for (var p = p0; p < p1; p++) {
      var xa = X(curve, p), xb = X(curve, p + 1), y = top0 + H;
      xa = Math.max(xa, L); xb = Math.min(xb, W - R);
      for (var k = 0; k < K; k++) {
        var h = live[k][p] * sy;
        if (h <= 0) continue;
        g.fillStyle = D.colours[k];
        g.fillRect(xa, y - h, Math.max(xb - xa, 0.6), h);
        y -= h;
      }
    }
    // Axis labels.
    g.fillStyle = "#333"; g.font = "11px sans-serif"; g.textAlign = "right";
    for (var i = 0; i <= 4; i++) {
      var v = maxLive * 1.05 * i / 4;
      g.fillText(human(Math.round(v)), L - 4, top0 + H - v * sy + 4);
    }
    // The peak.
    var px = X(curve, D.peak + 0.5);
    if (px >= L && px <= W - R) {
      g.strokeStyle = "#d00"; g.lineWidth = 1.5;
      g.beginPath(); g.moveTo(px, top0); g.lineTo(px, top0 + H); g.stroke();
      g.fillStyle = "#d00"; g.textAlign = px > W / 2 ? "right" : "left";
      g.fillText("peak " + human(top[D.peak]) + " at position " + D.peak + ": " + opLabel(D.peak),
        px + (px > W / 2 ? -4 : 4), top0 - 5);
    }
    // The clicked position.
    if (tablePos !== D.peak) {
      var cx = X(curve, tablePos + 0.5);
      g.strokeStyle = "#333"; g.setLineDash([3, 3]);
      g.beginPath(); g.moveTo(cx, top0); g.lineTo(cx, top0 + H); g.stroke(); g.setLineDash([]);
    }
    // Phase bands and layer names along the axis.
    bands(g, D.phases, function (r) { return D.phase_names[r[2]]; }, function (r) { return PHASE_COL[r[2]]; }, top0 + H + 4, 16);
    bands(g, D.layers, function (r) { return S[r[2]]; }, function (r, j) { return j % 2 ? "#eeeeee" : "#f8f8f8"; }, top0 + H + 22, 16);
    g.fillStyle = "#333"; g.textAlign = "left";
    g.fillText("phase", 4, top0 + H + 16); g.fillText("layer", 4, top0 + H + 34);
    axis(g, curve, top0 + H + 52);
  }
  function bands(g, runs, label, colour, y, h) {
    g.font = "11px sans-serif"; g.textAlign = "center";
    runs.forEach(function (r, j) {
      var xa = Math.max(X(curve, r[0]), L), xb = Math.min(X(curve, r[1]), curve._w - R);
      if (xb <= xa) return;
      g.fillStyle = colour(r, j); g.fillRect(xa, y, xb - xa, h);
      var s = label(r);
      // A label that does not fit is shortened to its last part (`blocks.3` -> `3`).
      if (s && g.measureText(s).width + 4 >= xb - xa) s = s.split(".").pop();
      if (s && g.measureText(s).width + 4 < xb - xa) {
        g.fillStyle = "#333"; g.fillText(s, (xa + xb) / 2, y + h - 4);
      }
    });
  }
  function axis(g, c, y) {
    g.fillStyle = "#333"; g.font = "11px sans-serif"; g.textAlign = "center";
    for (var i = 0; i <= 8; i++) {
      var pos = view.x0 + (view.x1 - view.x0) * i / 8;
      g.fillText(String(Math.round(pos)), X(c, pos), y);
    }
  }

  function box(b) {
    var W = place._w, H = place._h - 40, top0 = 10;
    var xa = X(place, b[ST]), xb = X(place, b[EN]);
    if (xb - xa < 1) xb = xa + 1; // small buffers stay visible
    var sy = H / (view.y1 - view.y0);
    var ya = top0 + H - (b[OFF] + b[BY] - view.y0) * sy, yb = top0 + H - (b[OFF] - view.y0) * sy;
    if (yb - ya < 1) ya = yb - 1;
    return [xa, ya, xb, yb];
  }
  function drawPlacement() {
    var g = setup(place), W = place._w, H = place._h - 40, top0 = 10;
    g.clearRect(0, 0, W, place._h);
    g.fillStyle = "#fafafa"; g.fillRect(L, top0, W - L - R, H);
    g.save(); g.beginPath(); g.rect(L, top0, W - L - R, H); g.clip();
    B.forEach(function (b, i) {
      var r = box(b);
      if (r[2] < L || r[0] > W - R || r[3] < top0 || r[1] > top0 + H) return;
      g.fillStyle = D.colours[b[KIND]];
      g.fillRect(r[0], r[1], r[2] - r[0], r[3] - r[1]);
    });
    var sy = H / (view.y1 - view.y0);
    var by = top0 + H - (D.slab_base - view.y0) * sy;
    g.strokeStyle = "#555"; g.setLineDash([4, 3]);
    g.beginPath(); g.moveTo(L, by); g.lineTo(W - R, by); g.stroke(); g.setLineDash([]);
    var px = X(place, D.peak + 0.5);
    g.strokeStyle = "#d00"; g.lineWidth = 1.5;
    g.beginPath(); g.moveTo(px, top0); g.lineTo(px, top0 + H); g.stroke();
    if (selected >= 0) {
      var r = box(B[selected]);
      g.strokeStyle = "#000"; g.lineWidth = 2;
      g.strokeRect(r[0] - 2, r[1] - 2, r[2] - r[0] + 4, r[3] - r[1] + 4);
    }
    g.restore();
    g.fillStyle = "#333"; g.font = "11px sans-serif"; g.textAlign = "right";
    for (var i = 0; i <= 4; i++) {
      var v = view.y0 + (view.y1 - view.y0) * i / 4;
      g.fillText(human(Math.round(v)), L - 4, top0 + H - (v - view.y0) * sy + 4);
    }
    g.textAlign = "left"; g.fillStyle = "#555";
    g.fillText("slab", W - R - 30, by - 3);
    axis(g, place, top0 + H + 14);
    g.textAlign = "left"; g.fillStyle = "#555";
    g.fillText("schedule position (" + D.positions + " ops), byte offset up", L, top0 + H + 30);
  }

  function hit(x, y) {
    var best = -1, area = Infinity;
    B.forEach(function (b, i) {
      var r = box(b);
      if (x >= r[0] - 1 && x <= r[2] + 1 && y >= r[1] - 1 && y <= r[3] + 1) {
        var a = (r[2] - r[0]) * (r[3] - r[1]);
        if (a < area) { area = a; best = i; }
      }
    });
    return best;
  }
  function describe(i) {
    var b = B[i];
    var lines = [
      S[b[PROV]],
      "kind: " + D.kinds[b[KIND]],
      "type: " + S[b[DT]] + S[b[SH]] + "  (dtype " + S[b[DT]] + ")",
      "size: " + human(b[BY]) + " (" + b[BY] + " bytes)",
      "live: [" + b[ST] + ", " + b[EN] + ")",
      "offset: " + b[OFF] + " (" + human(b[OFF]) + ")",
      "node: %" + b[NODE] + " " + S[b[OP]]
    ];
    if (S[b[FU]]) lines.push("fused from: " + S[b[FU]]);
    return lines.join("\n");
  }

  function redraw() { drawCurve(); drawPlacement(); }

  function table() {
    var head = document.querySelector("#live thead"), body = document.querySelector("#live tbody");
    var cols = [["provenance", function (b) { return S[b[PROV]]; }],
      ["kind", function (b) { return D.kinds[b[KIND]]; }],
      ["dtype", function (b) { return S[b[DT]]; }],
      ["shape", function (b) { return S[b[SH]]; }],
      ["size", function (b) { return b[BY]; }],
      ["live", function (b) { return b[ST]; }],
      ["offset", function (b) { return b[OFF]; }],
      ["node", function (b) { return b[NODE]; }]];
    var rows = [];
    var total = 0;
    B.forEach(function (b, i) { if (b[ST] <= tablePos && tablePos < b[EN]) { rows.push(i); total += b[BY]; } });
    var f = cols[sortKey][1];
    rows.sort(function (a, c) {
      var x = f(B[a]), y = f(B[c]);
      return (x < y ? -1 : x > y ? 1 : a - c) * sortDir;
    });
    document.getElementById("tablehead").textContent = rows.length + " buffers live at position " + tablePos +
      (tablePos === D.peak ? " (the peak)" : "") + ", " + opLabel(tablePos) + ": " + human(total);
    head.textContent = "";
    var tr = el("tr");
    cols.forEach(function (c, j) {
      var th = el("th", c[0] + (j === sortKey ? (sortDir < 0 ? " \u25bc" : " \u25b2") : ""));
      th.onclick = function () { if (sortKey === j) sortDir = -sortDir; else { sortKey = j; sortDir = j >= 4 ? -1 : 1; } table(); };
      tr.appendChild(th);
    });
    head.appendChild(tr);
    body.textContent = "";
    rows.forEach(function (i) {
      var b = B[i], r = el("tr");
      if (i === selected) r.className = "sel";
      [S[b[PROV]], D.kinds[b[KIND]], S[b[DT]], S[b[SH]], human(b[BY]), "[" + b[ST] + ", " + b[EN] + ")", String(b[OFF]), "%" + b[NODE] + " " + S[b[OP]]]
        .forEach(function (v, j) { var td = el("td", v); if (j === 4 || j === 6) td.className = "num"; r.appendChild(td); });
      r.onclick = function () { select(i); };
      body.appendChild(r);
    });
  }
  function select(i) {
    selected = i;
    document.getElementById("details").textContent = i >= 0 ? describe(i) : "click a buffer for its details";
    redraw(); table();
  }

  // Zoom (wheel) and pan (drag) on both charts; click to pick.
  function zoomX(c, x, f) {
    var at = posAt(c, x), w = (view.x1 - view.x0) * f;
    w = Math.min(Math.max(w, 4), N);
    view.x0 = Math.min(Math.max(at - (at - view.x0) * w / (view.x1 - view.x0), 0), N - w);
    view.x1 = view.x0 + w;
  }
  function zoomY(y, f) {
    var H = place._h - 40, top0 = 10;
    var at = view.y0 + (top0 + H - y) / H * (view.y1 - view.y0), h = (view.y1 - view.y0) * f;
    h = Math.min(Math.max(h, 256), D.total);
    view.y0 = Math.min(Math.max(at - (at - view.y0) * h / (view.y1 - view.y0), 0), D.total - h);
    view.y1 = view.y0 + h;
  }
  [curve, place].forEach(function (c) {
    var drag = null;
    c.addEventListener("wheel", function (e) {
      e.preventDefault();
      var rect = c.getBoundingClientRect(), f = e.deltaY > 0 ? 1.25 : 0.8;
      if (e.shiftKey && c === place) zoomY(e.clientY - rect.top, f); else zoomX(c, e.clientX - rect.left, f);
      redraw();
    }, { passive: false });
    c.addEventListener("mousedown", function (e) {
      drag = { x: e.clientX, y: e.clientY, v: { x0: view.x0, x1: view.x1, y0: view.y0, y1: view.y1 }, moved: false };
    });
    window.addEventListener("mouseup", function (e) {
      if (!drag) return;
      var d = drag; drag = null;
      if (d.moved) return;
      var rect = c.getBoundingClientRect(), x = e.clientX - rect.left, y = e.clientY - rect.top;
      if (x < L) return;
      if (c === place) {
        var i = hit(x, y);
        var pos = Math.floor(posAt(c, x));
        tablePos = Math.min(Math.max(pos, 0), N - 1);
        select(i);
      } else {
        tablePos = Math.min(Math.max(Math.floor(posAt(c, x)), 0), N - 1);
        redraw(); table();
      }
    });
    c.addEventListener("mousemove", function (e) {
      var rect = c.getBoundingClientRect(), x = e.clientX - rect.left, y = e.clientY - rect.top;
      if (drag) {
        var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        if (drag.moved) {
          var w = drag.v.x1 - drag.v.x0, shift = -dx / (c._w - L - R) * w;
          view.x0 = Math.min(Math.max(drag.v.x0 + shift, 0), N - w); view.x1 = view.x0 + w;
          if (c === place) {
            var h = drag.v.y1 - drag.v.y0, up = dy / (place._h - 40) * h;
            view.y0 = Math.min(Math.max(drag.v.y0 + up, 0), D.total - h); view.y1 = view.y0 + h;
          }
          redraw();
        }
        tip.style.display = "none";
        return;
      }
      var text = "";
      if (x >= L) {
        if (c === place) {
          var i = hit(x, y);
          if (i >= 0) text = describe(i);
        } else {
          var p = Math.floor(posAt(c, x));
          if (p >= 0 && p < N) {
            text = "position " + p + ": " + opLabel(p) + "\nlive " + human(top[p]);
            for (var k = 0; k < K; k++) if (live[k][p] > 0) text += "\n  " + D.kinds[k] + ": " + human(live[k][p]);
          }
        }
      }
      if (text) {
        tip.textContent = text; tip.style.display = "block";
        tip.style.left = Math.min(e.clientX + 14, window.innerWidth - 360) + "px"; tip.style.top = (e.clientY + 14) + "px";
      } else tip.style.display = "none";
    });
    c.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  });
  document.getElementById("reset").onclick = function () {
    view = { x0: 0, x1: N, y0: 0, y1: Math.max(D.total, 1) }; redraw();
  };
  document.getElementById("gopeak").onclick = function () { tablePos = D.peak; redraw(); table(); };
  window.addEventListener("resize", redraw);

  var legend = document.getElementById("legend");
  D.kinds.forEach(function (name, k) {
    var s = el("span"), i = el("i");
    i.style.background = D.colours[k];
    s.appendChild(i); s.appendChild(document.createTextNode(name));
    legend.appendChild(s);
  });
  redraw();
  table();
  // `page.html#selftest` drives the page as a user would (zoom, pick the largest buffer at the
  // peak, sort the table) and records the outcome in data-selftest, for the headless check.
  if (location.hash === "#selftest") {
    var outcome = "ok";
    try {
      var before = view.x1 - view.x0;
      zoomX(curve, curve._w / 2, 0.5); redraw();
      if (!(view.x1 - view.x0 < before)) throw new Error("zooming did not narrow the view");
      var big = -1;
      B.forEach(function (b, i) {
        if (b[ST] <= D.peak && D.peak < b[EN] && (big < 0 || b[BY] > B[big][BY])) big = i;
      });
      var r = box(B[big]);
      var got = hit((r[0] + r[2]) / 2, (r[1] + r[3]) / 2);
      if (got !== big) throw new Error("hovering the largest buffer found " + got + ", not " + big);
      select(got);
      if (document.getElementById("details").textContent.indexOf(S[B[big][PROV]]) < 0) throw new Error("the details do not name the buffer");
      document.querySelector("#live thead th").onclick();
      var first = document.querySelector("#live tbody tr td");
      if (!first) throw new Error("the sorted table is empty");
      view = { x0: 0, x1: N, y0: 0, y1: Math.max(D.total, 1) }; select(-1);
    } catch (e) {
      outcome = "failed: " + e.message;
    }
    document.body.setAttribute("data-selftest", outcome);
  }
  document.body.setAttribute("data-ready", "1");
})();
