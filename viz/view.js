/* view.js: the script of the page `cedar view` writes (inlined by
 * viz/view_html.c; the data is the JSON block #cedar-data).
 *
 * Draws, on canvases (one draw call per visible slice, never a DOM node per
 * event): the timeline with one lane per worker grouped by rank, a band of
 * prefill chunks above it, slices coloured by the layer's attention mode
 * (full, reindex, reuse, swa_only; other op groups by their op), the
 * critical path outlined, and dependency / transfer arrows between lanes;
 * the task graph laid out by level with the critical path in red; the
 * plan's layer table and buses. Hovering a slice or a graph node shows its
 * layer, chunk, positions, bytes and time.
 *
 * window.cedarView exposes what tests/cli/view_browser.sh checks (lanes,
 * legend, an event's box on screen, zooming to an event, the load time).
 */
(function () {
  'use strict';
  var tStart = performance.now();
  var D = JSON.parse(document.getElementById('cedar-data').textContent);
  var tParsed = performance.now();
  var E = D.ev, S = D.sym, N = E.n, LANES = D.lanes;

  var MODE_COLORS = { full: '#d62728', reindex: '#ff7f0e', reuse: '#2ca02c', swa_only: '#1f77b4' };
  var OP_COLORS = {
    moe: '#c5b0d5', embed: '#7f7f7f', head: '#525252', engram: '#17becf', engram_rows: '#9edae5',
    dec_kv: '#8c564b', keep_xe: '#bcbd22', replay_in: '#e7ba52', transfer: '#e377c2'
  };
  var OTHER = '#aaaaaa';

  /* ---- colours and legend ------------------------------------------------ */
  var keyOf = new Array(S.length), colorOfSym = {};
  function keyFor(mode, op) {
    if (MODE_COLORS[mode]) return mode;
    return OP_COLORS[op] ? op : (op || 'other');
  }
  function colorForKey(k) { return MODE_COLORS[k] || OP_COLORS[k] || OTHER; }
  var evKey = new Array(N), legendCount = {}, keyCache = new Map();
  for (var i = 0; i < N; i++) { /* one key per (mode, op) pair, computed once */
    var pair = E.mode[i] * S.length + E.op[i], k = keyCache.get(pair);
    if (k === undefined) { k = keyFor(S[E.mode[i]], S[E.op[i]]); keyCache.set(pair, k); }
    evKey[i] = k;
    legendCount[k] = (legendCount[k] || 0) + 1;
  }
  var legendKeys = Object.keys(legendCount).sort(function (a, b) {
    var ma = MODE_COLORS[a] ? 0 : 1, mb = MODE_COLORS[b] ? 0 : 1;
    return ma - mb || (a < b ? -1 : a > b ? 1 : 0);
  });

  /* ---- lanes: per lane and depth, event indices sorted by start ---------- */
  var rows = [], laneDepth = [];
  for (var l = 0; l < LANES.length; l++) { rows.push([]); laneDepth.push(1); }
  for (i = 0; i < N; i++) {
    var ln = E.lane[i], d = E.depth[i];
    while (rows[ln].length <= d) rows[ln].push([]);
    rows[ln][d].push(i);
    if (d + 1 > laneDepth[ln]) laneDepth[ln] = d + 1;
  }
  var tMin = Infinity, tMax = -Infinity;
  for (i = 0; i < N; i++) {
    if (E.ts[i] < tMin) tMin = E.ts[i];
    if (E.ts[i] + E.dur[i] > tMax) tMax = E.ts[i] + E.dur[i];
  }
  if (!(tMax > tMin)) tMax = tMin + 1;

  /* ---- prefill chunks: (request, phase, chunk) spans, packed into rows --- */
  var chunks = new Map(), chunkList = [], isPrefill = S.map(function (p) { return p.indexOf('prefill') === 0; });
  for (i = 0; i < N; i++) {
    if (!isPrefill[E.phase[i]] || E.chunk[i] < 0) continue;
    var ck = (E.request[i] * S.length + E.phase[i]) * 1048576 + E.chunk[i];
    var c = chunks.get(ck);
    if (!c) { c = { chunk: E.chunk[i], request: E.request[i], t0: E.ts[i], t1: E.ts[i] + E.dur[i], n: 0, pos: Infinity, end: -Infinity }; chunks.set(ck, c); chunkList.push(c); }
    if (E.ts[i] < c.t0) c.t0 = E.ts[i];
    if (E.ts[i] + E.dur[i] > c.t1) c.t1 = E.ts[i] + E.dur[i];
    if (E.pos[i] >= 0) { c.pos = Math.min(c.pos, E.pos[i]); c.end = Math.max(c.end, E.pos[i] + E.len[i]); }
    c.n++;
  }
  chunkList.sort(function (a, b) { return a.t0 - b.t0; });
  var chunkRowEnd = [];
  chunkList.forEach(function (c) {
    for (var r = 0; r < chunkRowEnd.length; r++) if (chunkRowEnd[r] <= c.t0) break;
    c.row = r; chunkRowEnd[r] = c.t1;
  });
  var nChunkRows = Math.min(chunkRowEnd.length, 6);

  /* ---- geometry ----------------------------------------------------------- */
  var LABEL = 170, ROW = 22, AXIS = 22, CROW = 14, PAD = 6;
  var chunkTop = AXIS, lanesTop = AXIS + (nChunkRows ? nChunkRows * CROW + PAD : 0);
  var laneY = [], y = lanesTop;
  for (l = 0; l < LANES.length; l++) {
    var newRank = l === 0 || LANES[l].rank !== LANES[l - 1].rank;
    if (newRank && l > 0) y += PAD;
    laneY.push(y);
    y += laneDepth[l] * ROW + 2;
  }
  var HEIGHT = y + 4;
  var view = { t0: tMin, t1: tMax };

  var canvas = document.getElementById('timeline'), ctx = canvas.getContext('2d');
  var dpr = window.devicePixelRatio || 1, WIDTH = 800;
  function resize() {
    WIDTH = Math.max(400, document.getElementById('tl-wrap').clientWidth);
    canvas.width = Math.round(WIDTH * dpr); canvas.height = Math.round(HEIGHT * dpr);
    canvas.style.width = WIDTH + 'px'; canvas.style.height = HEIGHT + 'px';
  }
  function xOf(t) { return LABEL + (t - view.t0) * (WIDTH - LABEL) / (view.t1 - view.t0); }
  function tOf(x) { return view.t0 + (x - LABEL) * (view.t1 - view.t0) / (WIDTH - LABEL); }

  /* first index in a sorted row whose slice ends at or after t */
  function firstEnding(row, t) {
    var a = 0, b = row.length;
    while (a < b) { var m = (a + b) >> 1, e = row[m]; if (E.ts[e] + E.dur[e] < t) a = m + 1; else b = m; }
    return a;
  }

  function fmtTime(us) {
    var a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(3) + ' s';
    if (a >= 1e3) return (us / 1e3).toFixed(3) + ' ms';
    return us.toFixed(a < 10 ? 2 : 1) + ' us';
  }
  function fmtBytes(b) {
    if (b < 0) return '-';
    if (b >= 1 << 20) return (b / 1048576).toFixed(2) + ' MiB (' + b + ' B)';
    if (b >= 1024) return (b / 1024).toFixed(1) + ' KiB (' + b + ' B)';
    return b + ' B';
  }

  function drawAxis() {
    var span = view.t1 - view.t0, step = Math.pow(10, Math.floor(Math.log10(span / 6)));
    if (span / step > 12) step *= 5; else if (span / step > 6) step *= 2;
    ctx.fillStyle = '#444'; ctx.font = '11px sans-serif'; ctx.textBaseline = 'middle';
    ctx.strokeStyle = '#eee'; ctx.lineWidth = 1;
    for (var t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      var x = Math.round(xOf(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, AXIS - 4); ctx.lineTo(x, HEIGHT); ctx.stroke();
      ctx.fillText(fmtTime(t - tMin), x + 2, AXIS / 2);
    }
  }

  function drawChunks() {
    if (!nChunkRows) return;
    ctx.font = '10px sans-serif'; ctx.textBaseline = 'middle';
    ctx.fillStyle = '#333'; ctx.fillText('prefill chunks', 4, chunkTop + CROW / 2);
    chunkList.forEach(function (c) {
      if (c.row >= nChunkRows || c.t1 < view.t0 || c.t0 > view.t1) return;
      var x0 = Math.max(LABEL, xOf(c.t0)), x1 = Math.min(WIDTH, xOf(c.t1)), yy = chunkTop + c.row * CROW;
      ctx.fillStyle = c.chunk % 2 ? '#dde6f0' : '#c6d4e4';
      ctx.fillRect(x0, yy + 1, Math.max(1, x1 - x0), CROW - 2);
      if (x1 - x0 > 24) { ctx.fillStyle = '#234'; ctx.fillText('c' + c.chunk, x0 + 3, yy + CROW / 2); }
    });
  }

  function drawLanes() {
    for (var l = 0; l < LANES.length; l++) {
      var y0 = laneY[l], h = laneDepth[l] * ROW;
      ctx.fillStyle = l % 2 ? '#fafafa' : '#f3f3f3';
      ctx.fillRect(0, y0, WIDTH, h);
      ctx.fillStyle = '#222'; ctx.font = '12px sans-serif'; ctx.textBaseline = 'middle';
      ctx.fillText('rank ' + LANES[l].rank + ' \u00b7 ' + LANES[l].name, 4, y0 + ROW / 2);
      for (var d = 0; d < rows[l].length; d++) {
        var row = rows[l][d], yy = y0 + d * ROW + 1, lastX = -1, lastKey = null;
        for (var k = firstEnding(row, view.t0); k < row.length; k++) {
          var e = row[k];
          if (E.ts[e] > view.t1) break;
          var x0 = Math.max(LABEL, xOf(E.ts[e])), x1 = Math.min(WIDTH, xOf(E.ts[e] + E.dur[e]));
          var w = x1 - x0;
          if (w < 1) { /* sub-pixel slices: one pixel column per colour */
            if (Math.floor(x0) === lastX && evKey[e] === lastKey) continue;
            lastX = Math.floor(x0); lastKey = evKey[e]; w = 1;
          }
          ctx.fillStyle = colorForKey(evKey[e]);
          ctx.fillRect(x0, yy, w, ROW - 2);
          if (E.crit[e]) { ctx.strokeStyle = '#000'; ctx.lineWidth = 1.5; ctx.strokeRect(x0 + 0.75, yy + 0.75, Math.max(0.5, w - 1.5), ROW - 3.5); }
          if (w > 40) {
            ctx.fillStyle = '#000'; ctx.font = '10px sans-serif';
            ctx.save(); ctx.beginPath(); ctx.rect(x0, yy, w, ROW - 2); ctx.clip();
            ctx.fillText(E.name[e], x0 + 2, yy + (ROW - 2) / 2); ctx.restore();
          }
        }
      }
    }
  }

  var arrowsDrawn = 0;
  function midY(e) { return laneY[E.lane[e]] + E.depth[e] * ROW + ROW / 2; }
  function drawArrows() {
    arrowsDrawn = 0;
    if (!document.getElementById('arrows').checked) return;
    var F = D.flows, max = 20000;
    for (var pass = 0; pass < 2; pass++) { /* dependencies, then transfers on top */
      for (var f = 0; f < F.length; f += 2) {
        var a = F[f], b = F[f + 1];
        var xfer = S[E.op[a]] === 'transfer' || S[E.op[b]] === 'transfer';
        if ((pass === 1) !== xfer) continue;
        var ta = E.ts[a] + E.dur[a], tb = E.ts[b];
        if (Math.max(ta, tb) < view.t0 || Math.min(ta, tb) > view.t1) continue;
        if (!xfer && arrowsDrawn >= max) continue;
        var x0 = xOf(ta), y0 = midY(a), x1 = xOf(tb), y1 = midY(b);
        ctx.strokeStyle = xfer ? '#c51b7d' : 'rgba(60,60,60,0.45)'; ctx.fillStyle = ctx.strokeStyle;
        ctx.lineWidth = xfer ? 2 : 1;
        ctx.beginPath(); ctx.moveTo(x0, y0); ctx.lineTo(x1, y1); ctx.stroke();
        var ang = Math.atan2(y1 - y0, x1 - x0), s = xfer ? 7 : 5;
        ctx.beginPath(); ctx.moveTo(x1, y1);
        ctx.lineTo(x1 - s * Math.cos(ang - 0.4), y1 - s * Math.sin(ang - 0.4));
        ctx.lineTo(x1 - s * Math.cos(ang + 0.4), y1 - s * Math.sin(ang + 0.4));
        ctx.closePath(); ctx.fill();
        arrowsDrawn++;
      }
    }
  }

  function draw() {
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, WIDTH, HEIGHT);
    drawLanes();
    drawAxis();
    drawChunks();
    drawArrows();
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, LABEL - 2, AXIS);
    ctx.fillStyle = '#444'; ctx.font = '11px sans-serif'; ctx.fillText('time since trace start', 4, AXIS / 2);
  }

  /* ---- hover ---------------------------------------------------------------- */
  function eventAt(px, py) {
    if (px < LABEL) return -1;
    for (var l = 0; l < LANES.length; l++) {
      var y0 = laneY[l];
      if (py < y0 || py >= y0 + laneDepth[l] * ROW) continue;
      var d = Math.floor((py - y0) / ROW), row = rows[l][d];
      if (!row) return -1;
      var t = tOf(px), tol = 3 * (view.t1 - view.t0) / (WIDTH - LABEL), best = -1, bestDist = Infinity;
      for (var k = firstEnding(row, t - tol); k < row.length; k++) {
        var e = row[k];
        if (E.ts[e] > t + tol) break;
        var dist = t < E.ts[e] ? E.ts[e] - t : t > E.ts[e] + E.dur[e] ? t - E.ts[e] - E.dur[e] : 0;
        if (dist < bestDist) { best = e; bestDist = dist; }
        if (dist === 0) break;
      }
      return best;
    }
    return -1;
  }
  function row(k, v) { return '<tr><td>' + k + '</td><td>' + v + '</td></tr>'; }
  function esc(s) { return String(s).replace(/[&<>"]/g, function (c) { return { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]; }); }
  function tipFor(e) {
    var h = '<b>' + esc(E.name[e]) + '</b><table>';
    h += row('op', esc(S[E.op[e]] || '-')) + row('mode', esc(S[E.mode[e]] || '-'));
    h += row('layer', E.layer[e] >= 0 ? E.layer[e] : '-') + row('chunk', E.chunk[e] >= 0 ? E.chunk[e] : '-');
    h += row('positions', E.pos[e] >= 0 ? '[' + E.pos[e] + ', ' + (E.pos[e] + E.len[e]) + ') (' + E.len[e] + ')' : '-');
    h += row('bytes', fmtBytes(E.bytes[e]));
    h += row('time', fmtTime(E.dur[e]) + ' at ' + fmtTime(E.ts[e] - tMin));
    if (E.flops[e] >= 0) h += row('flops', E.flops[e].toExponential(3));
    h += row('lane', 'rank ' + LANES[E.lane[e]].rank + ' \u00b7 ' + esc(LANES[E.lane[e]].name));
    h += row('phase', esc(S[E.phase[e]] || '-') + (E.request[e] >= 0 ? ', request ' + E.request[e] : ''));
    if (E.node[e] >= 0) h += row('node', E.node[e]);
    if (E.crit[e]) h += row('critical path', 'yes');
    return h + '</table>';
  }
  var tip = document.getElementById('tip'), hovered = -1;
  function showTip(html, cx, cy) {
    tip.innerHTML = html; tip.style.display = 'block';
    var w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.min(cx + 14, window.innerWidth - w - 4) + 'px';
    tip.style.top = (cy + 14 + h > window.innerHeight ? cy - h - 8 : cy + 14) + 'px';
  }
  function hideTip() { tip.style.display = 'none'; hovered = -1; }

  var drag = null;
  canvas.addEventListener('mousemove', function (ev) {
    var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
    if (drag) {
      var dt = (px - drag.x) * (view.t1 - view.t0) / (WIDTH - LABEL);
      view.t0 = drag.t0 - dt; view.t1 = drag.t1 - dt; draw(); return;
    }
    var e = eventAt(px, py);
    if (e < 0) { hideTip(); return; }
    hovered = e; showTip(tipFor(e), ev.clientX, ev.clientY);
  });
  canvas.addEventListener('mouseleave', hideTip);
  canvas.addEventListener('mousedown', function (ev) {
    var r = canvas.getBoundingClientRect();
    drag = { x: ev.clientX - r.left, t0: view.t0, t1: view.t1 };
  });
  window.addEventListener('mouseup', function () { drag = null; });
  canvas.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left;
    if (px < LABEL) return;
    var t = tOf(px), f = ev.deltaY > 0 ? 1.25 : 0.8;
    var span = Math.max((view.t1 - view.t0) * f, 1e-3);
    view.t0 = t - (t - view.t0) * span / (view.t1 - view.t0); view.t1 = view.t0 + span; draw();
  }, { passive: false });
  canvas.addEventListener('dblclick', function () { view.t0 = tMin; view.t1 = tMax; draw(); });
  document.getElementById('arrows').addEventListener('change', draw);

  /* ---- legend and summary --------------------------------------------------- */
  var leg = document.getElementById('legend');
  legendKeys.forEach(function (k) {
    var s = document.createElement('span');
    s.className = 'key'; s.dataset.key = k;
    s.innerHTML = '<span class="swatch" style="background:' + colorForKey(k) + '"></span>' + esc(k) +
      (MODE_COLORS[k] ? ' (mode)' : '') + ' <span class="hint">' + legendCount[k] + '</span>';
    leg.appendChild(s);
  });
  var ranks = {};
  LANES.forEach(function (L) { ranks[L.rank] = 1; });
  document.getElementById('summary').textContent = D.process + ': ' + N + ' tasks on ' + LANES.length +
    ' lanes (' + Object.keys(ranks).length + ' rank' + (Object.keys(ranks).length > 1 ? 's' : '') + '), ' +
    fmtTime(tMax - tMin) + ', ' + D.flows.length / 2 + ' cross-lane edges' +
    (D.ignored ? ', ' + D.ignored + ' events of other kinds not drawn' : '') + '.';

  /* ---- the task graph --------------------------------------------------------- */
  var G = D.graph, gPos = null, GX = 0, GY = 0;
  var gcanvas = document.getElementById('graph'), gctx = gcanvas.getContext('2d');
  function graphColor(k) {
    var nm = G.name[k], m = /^L(\d+)\.(\w+)/.exec(nm), op = m ? m[2] : nm.split(' ')[0];
    if (m && (op === 'attn' || op === 'dec_kv')) {
      var L = D.plan ? D.plan.layers[+m[1]] : null;
      if (L) return MODE_COLORS[L.mode] || OTHER;
      if (nodeEv && nodeEv[k] >= 0) return colorForKey(evKey[nodeEv[k]]);
    }
    return OP_COLORS[op] || OTHER;
  }
  var nodeEv = null;
  function drawGraph() {
    if (!G) {
      document.getElementById('graph-summary').textContent = 'No graph given (cedar view --graph FILE: the DOT of cedar run --dot).';
      gcanvas.style.display = 'none'; return;
    }
    var n = G.name.length, levels = 0, count = [];
    for (var k = 0; k < n; k++) { levels = Math.max(levels, G.level[k] + 1); count[G.level[k]] = (count[G.level[k]] || 0) + 1; }
    var maxc = Math.max.apply(null, count.filter(function (x) { return x; }));
    GX = Math.max(2, Math.min(46, 30000 / levels)); GY = Math.max(3, Math.min(18, 2400 / maxc)); /* canvases stop at 32767 px */
    var W = levels * GX + 20, H = maxc * GY + 20, at = [];
    gcanvas.width = Math.round(W * dpr); gcanvas.height = Math.round(H * dpr);
    gcanvas.style.width = W + 'px'; gcanvas.style.height = H + 'px';
    gPos = new Array(n);
    for (k = 0; k < n; k++) { var lv = G.level[k]; at[lv] = (at[lv] || 0); gPos[k] = [10 + lv * GX, 10 + at[lv]++ * GY]; }
    var onPath = {};
    for (k = 0; k + 1 < G.path.length; k++) onPath[G.path[k] + '>' + G.path[k + 1]] = 1;
    gctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    gctx.clearRect(0, 0, W, H);
    var bw = Math.max(4, GX * 0.6), bh = Math.max(3, GY * 0.7);
    for (var pass = 0; pass < 2; pass++) {
      for (var e = 0; e < G.edges.length; e += 2) {
        var a = G.edges[e], b = G.edges[e + 1], c = !!onPath[a + '>' + b];
        if ((pass === 1) !== c) continue;
        gctx.strokeStyle = c ? '#e00000' : 'rgba(0,0,0,0.12)'; gctx.lineWidth = c ? 2.5 : 1;
        gctx.beginPath(); gctx.moveTo(gPos[a][0] + bw, gPos[a][1] + bh / 2); gctx.lineTo(gPos[b][0], gPos[b][1] + bh / 2); gctx.stroke();
      }
    }
    for (k = 0; k < n; k++) {
      gctx.fillStyle = graphColor(k); gctx.fillRect(gPos[k][0], gPos[k][1], bw, bh);
      if (G.crit[k]) { gctx.strokeStyle = '#e00000'; gctx.lineWidth = 2; gctx.strokeRect(gPos[k][0], gPos[k][1], bw, bh); }
    }
    document.getElementById('graph-summary').textContent = n + ' nodes, ' + G.edges.length / 2 + ' edges, ' + levels +
      ' levels; critical path (red): ' + G.n_crit + ' nodes, ' +
      (G.measured ? fmtTime(G.crit_w) + ' of measured task time' : G.crit_w + ' nodes (the trace has no task of this graph)') + '.';
    G.bw = bw; G.bh = bh;
  }
  if (G) {
    nodeEv = new Array(G.name.length).fill(-1);
    var firstReq = null, firstTs = Infinity;
    for (i = 0; i < N; i++) if (S[E.phase[i]].indexOf('prefill') === 0 && E.ts[i] < firstTs) { firstTs = E.ts[i]; firstReq = E.request[i]; }
    for (i = 0; i < N; i++) {
      var nd = E.node[i];
      if (nd < 0 || nd >= nodeEv.length || E.request[i] !== firstReq || S[E.phase[i]].indexOf('prefill') !== 0) continue;
      if (nodeEv[nd] < 0 || E.ts[i] < E.ts[nodeEv[nd]]) nodeEv[nd] = i;
    }
  }
  gcanvas.addEventListener('mousemove', function (ev) {
    if (!gPos) return;
    var r = gcanvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
    var lv = Math.floor((px - 10) / GX), best = -1;
    for (var k = 0; k < gPos.length; k++)
      if (G.level[k] === lv && px >= gPos[k][0] && px <= gPos[k][0] + G.bw && py >= gPos[k][1] && py <= gPos[k][1] + G.bh) { best = k; break; }
    if (best < 0) { hideTip(); return; }
    if (nodeEv[best] >= 0) { showTip(tipFor(nodeEv[best]), ev.clientX, ev.clientY); return; }
    showTip('<b>' + esc(G.name[best]) + '</b><table>' + row('positions', G.a[best] >= 0 ? '[' + G.a[best] + ', ' + G.b[best] + ')' : '-') +
      row('level', G.level[best]) + row('critical path', G.crit[best] ? 'yes' : 'no') + '</table>', ev.clientX, ev.clientY);
  });
  gcanvas.addEventListener('mouseleave', hideTip);

  /* ---- the plan ------------------------------------------------------------------ */
  function drawPlan() {
    var P = D.plan, el = document.getElementById('plan');
    if (!P) { el.textContent = 'No plan given (cedar view --plan FILE).'; return; }
    var src = function (x) { return x >= 0 ? 'L' + x : '-'; };
    var h = '<p>' + esc(P.name) + ': ' + esc(P.description) + '. ' + (P.ced ? 'CED' : 'dense') + ' prefill, window ' +
      P.window + ', top-k ' + P.topk + ', decoder replay ' + P.replay_decoder + ', prefill chunk ' + P.chunk + '.</p>';
    h += '<div class="plan-cols"><table class="plan" id="layer-table"><tr><th>layer</th><th>region</th><th>mode</th><th>ratio</th>' +
      '<th>KV from</th><th>top-k from</th><th>pool from</th><th>candidates</th><th>engram</th></tr>';
    P.layers.forEach(function (L) {
      h += '<tr><td>L' + L.index + '</td><td>' + L.region + '</td><td><span class="mode-swatch" style="background:' +
        (MODE_COLORS[L.mode] || OTHER) + '"></span>' + L.mode + '</td><td>' + (L.ratio || '-') + '</td><td>' + src(L.kv) +
        '</td><td>' + src(L.topk) + '</td><td>' + src(L.pool) + '</td><td>' + L.cand + '</td><td>' + (L.engram ? 'yes' : '') + '</td></tr>';
    });
    h += '</table><table class="plan" id="bus-table"><tr><th>bus</th><th>writer</th><th>readers</th></tr>';
    P.buses.forEach(function (B) {
      h += '<tr><td>' + B.kind + '</td><td>L' + B.writer + '</td><td>' + B.readers.map(function (r) { return 'L' + r; }).join(' ') + '</td></tr>';
    });
    el.innerHTML = h + '</table></div>';
  }

  /* ---- start ------------------------------------------------------------------------ */
  var tPrep = performance.now();
  resize();
  draw();
  var tDrawn = performance.now();
  drawGraph();
  drawPlan();
  window.addEventListener('resize', function () { resize(); draw(); });

  window.cedarView = {
    loadMs: performance.now(),
    /* ms from navigation start: the script starts (the HTML parsed), the data parsed, indexed, drawn */
    timing: { script: tStart, parsed: tParsed, indexed: tPrep, drawn: tDrawn },
    nEvents: N,
    lanes: LANES.map(function (L) { return { name: L.name, rank: L.rank }; }),
    legend: legendKeys.map(function (k) { return { key: k, color: colorForKey(k), count: legendCount[k] }; }),
    keyOf: function (e) { return evKey[e]; },
    colorOf: function (e) { return colorForKey(evKey[e]); },
    find: function (pred) { for (var e = 0; e < N; e++) if (pred(e, E, S)) return e; return -1; },
    event: function (e) { return { name: E.name[e], lane: E.lane[e], layer: E.layer[e], chunk: E.chunk[e], pos: E.pos[e], n: E.len[e], bytes: E.bytes[e], ts: E.ts[e], dur: E.dur[e], mode: S[E.mode[e]], op: S[E.op[e]], crit: E.crit[e] }; },
    zoomTo: function (e) { var pad = Math.max(E.dur[e], 1); view.t0 = E.ts[e] - pad; view.t1 = E.ts[e] + E.dur[e] + pad; draw(); },
    reset: function () { view.t0 = tMin; view.t1 = tMax; draw(); },
    /* the event's box in client coordinates (visible part) */
    box: function (e) {
      var r = canvas.getBoundingClientRect(), x0 = Math.max(LABEL, xOf(E.ts[e])), x1 = Math.min(WIDTH, xOf(E.ts[e] + E.dur[e]));
      return { x: r.left + x0, y: r.top + laneY[E.lane[e]] + E.depth[e] * ROW + 1, w: x1 - x0, h: ROW - 2 };
    },
    laneBox: function (l) { var r = canvas.getBoundingClientRect(); return { x: r.left, y: r.top + laneY[l], w: WIDTH, h: laneDepth[l] * ROW }; },
    /* the colour drawn at client (x, y) on the timeline, as #rrggbb */
    pixel: function (cx, cy) {
      var r = canvas.getBoundingClientRect(), p = ctx.getImageData(Math.round((cx - r.left) * dpr), Math.round((cy - r.top) * dpr), 1, 1).data;
      return '#' + [p[0], p[1], p[2]].map(function (v) { return (v < 16 ? '0' : '') + v.toString(16); }).join('');
    },
    hovered: function () { return hovered; },
    arrowsDrawn: function () { return arrowsDrawn; },
    chunks: chunkList.length,
    graph: G ? { nodes: G.name.length, crit: G.n_crit, path: G.path, measured: G.measured } : null,
    ready: true
  };
  document.body.dataset.ready = '1';
})();
