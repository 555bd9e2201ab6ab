/* view_check.js: drives a `cedar view` page in headless Chromium through
 * playwright-core (tests/cli/view_browser.sh runs it).
 *
 *   node view_check.js PLAYWRIGHT_CORE_DIR CHROMIUM PAGE.html EXPECT.json SHOT.png
 *
 * EXPECT.json: {"lanes": [names], "events": N, "keys": [legend keys the
 * trace's tasks must show], "hover": true|false, "graph_crit": N|null}.
 * Checks, each failing with a message: the page loads with no console error
 * and no uncaught exception; the lanes are the trace's workers, in order;
 * every expected colour key is in the legend; for each mode present, a task
 * of that mode zoomed into view is drawn in that mode's colour (read back
 * from the canvas); hovering a task with the real mouse shows its layer,
 * chunk, positions, bytes and time; the graph's critical path is marked.
 * Prints one JSON line: {"load_ms": wall time from navigation to the first
 * draw, "timing_ms": its steps, "cpu": the renderer's CPU time (Chromium's
 * thread ticks) over the same span, "checked": [...]}: reported, never
 * asserted. Exit 1 on a failed check.
 */
'use strict';
const [pwDir, chromium, pagePath, expectPath, shotPath] = process.argv.slice(2);
const pw = require(pwDir);
const fs = require('fs');
const want = JSON.parse(fs.readFileSync(expectPath, 'utf8'));

function fail(msg) {
  console.error('FAIL: ' + msg);
  process.exit(1);
}

(async () => {
  const browser = await pw.chromium.launch({ executablePath: chromium, args: ['--no-sandbox', '--disable-gpu'] });
  const errors = [];
  const checked = [];
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    page.on('console', (m) => { if (m.type() === 'error') errors.push('console: ' + m.text()); });
    page.on('pageerror', (e) => errors.push('exception: ' + e.message));
    /* CPU time of the page's renderer (thread ticks), beside the wall time: on a
     * shared machine the wall time mostly measures the other processes. */
    const cdp = await page.context().newCDPSession(page);
    await cdp.send('Performance.enable', { timeDomain: 'threadTicks' });
    const metrics = async () => Object.fromEntries((await cdp.send('Performance.getMetrics')).metrics.map((m) => [m.name, m.value]));
    const m0 = await metrics();
    await page.goto('file://' + pagePath, { waitUntil: 'load', timeout: 60000 });
    await page.waitForFunction(() => window.cedarView && window.cedarView.ready, null, { timeout: 60000 });
    const m1 = await metrics();
    const cpu = { renderer_cpu_ms: Math.round(1e3 * (m1.ProcessTime - (m0.ProcessTime || 0))),
      main_thread_tasks_ms: Math.round(1e3 * (m1.TaskDuration - (m0.TaskDuration || 0))) };
    const info = await page.evaluate(() => ({
      loadMs: cedarView.loadMs, timing: cedarView.timing, n: cedarView.nEvents, lanes: cedarView.lanes.map((l) => l.name),
      legend: cedarView.legend.map((k) => k.key), graph: cedarView.graph
    }));
    if (info.n !== want.events) fail(`the page shows ${info.n} tasks, the trace has ${want.events}`);
    if (JSON.stringify(info.lanes) !== JSON.stringify(want.lanes))
      fail(`lanes ${JSON.stringify(info.lanes)}, expected ${JSON.stringify(want.lanes)}`);
    checked.push('lanes');
    for (const k of want.keys) if (!info.legend.includes(k)) fail(`legend lacks ${k}: ${info.legend}`);
    checked.push('legend');
    await page.screenshot({ path: shotPath, fullPage: true });
    if (fs.statSync(shotPath).size < 1000) fail('the screenshot is empty');
    checked.push('screenshot');

    /* Colours: one task per mode, zoomed in, with the arrows off; two pixels
     * above and below its label. */
    await page.click('#arrows');
    const modes = ['full', 'reindex', 'reuse', 'swa_only'].filter((m) => want.keys.includes(m));
    for (const m of modes) {
      const r = await page.evaluate((m) => {
        const e = cedarView.find((i) => cedarView.keyOf(i) === m);
        if (e < 0) return null;
        cedarView.zoomTo(e);
        const b = cedarView.box(e);
        const x = b.x + b.w / 2, p1 = cedarView.pixel(x, b.y + 3), p2 = cedarView.pixel(x, b.y + b.h - 3);
        return { e, b, color: cedarView.colorOf(e), px: p1 === p2 ? p1 : p1 + '/' + p2 };
      }, m);
      if (!r) fail(`no task of mode ${m} on the page`);
      if (r.b.w < 3) fail(`task ${r.e} of mode ${m} is ${r.b.w} px wide after zooming to it`);
      if (r.px !== r.color) fail(`task ${r.e} of mode ${m} is drawn ${r.px}, its colour is ${r.color}`);
    }
    if (modes.length) checked.push('colours ' + modes.join(','));
    await page.click('#arrows');

    /* Hover with the mouse over an attention task. */
    if (want.hover) {
      const t = await page.evaluate(() => {
        const e = cedarView.find((i, E, S) => S[E.op[i]] === 'attn' && E.layer[i] >= 0 && E.pos[i] >= 0);
        cedarView.zoomTo(e);
        const b = cedarView.box(e);
        return { e, b, ev: cedarView.event(e) };
      });
      await page.mouse.move(t.b.x + t.b.w / 2, t.b.y + t.b.h / 2);
      await page.waitForSelector('#tip', { state: 'visible', timeout: 5000 });
      const tip = await page.textContent('#tip');
      const hov = await page.evaluate(() => cedarView.hovered());
      if (hov !== t.e) fail(`hovering task ${t.e} selects ${hov}`);
      const ev = t.ev;
      /* textContent joins the cells: "layer3chunk2positions[0, 20) (20)bytes..." */
      const need = [ev.name, 'layer' + ev.layer, 'chunk' + ev.chunk, `positions[${ev.pos}, ${ev.pos + ev.n}) (${ev.n})`,
        'bytes' + (ev.bytes < 1024 ? ev.bytes + ' B' : ''), String(ev.bytes), 'time'];
      for (const s of need) if (!tip.includes(s)) fail(`the hover box lacks "${s}": ${tip}`);
      await page.mouse.move(2, 2);
      checked.push('hover');
      await page.evaluate(() => cedarView.reset());
    }
    if (want.graph_crit !== null && want.graph_crit !== undefined) {
      if (!info.graph || info.graph.crit !== want.graph_crit)
        fail(`graph critical path ${info.graph && info.graph.crit} nodes, expected ${want.graph_crit}`);
      const shown = await page.textContent('#graph-summary');
      if (!/critical path \(red\): \d+ nodes/.test(shown)) fail(`the graph summary: ${shown}`);
      checked.push('critical path');
    }
    if (errors.length) fail('the page logged errors: ' + errors.join(' | '));
    checked.push('no console errors');
    const tm = {};
    for (const k in info.timing) tm[k] = Math.round(info.timing[k]);
    console.log(JSON.stringify({ load_ms: Math.round(info.loadMs), timing_ms: tm, cpu, checked }));
  } finally {
    await browser.close();
  }
})().catch((e) => fail(String(e && e.stack || e)));
