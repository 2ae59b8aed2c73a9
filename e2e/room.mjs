// The browser scenario of the demo page's room (driven by room_test.go):
//
//   node e2e/room.mjs <base url> <output dir>
//
// Browser contexts are people. Ann and ben sign in on the demo page, whose
// "who's here" panel joins and watches the room "demo": each sees the
// other there, with a live status and the count. Ben reloads his tab (the
// same device, back within the close grace): ann's panel never loses him.
// Ben closes his tab (no bye): ann sees him leave once the close grace
// (PRESENCED_CLOSE_GRACE_MS) has run out, not before. Guests then take the
// room into interval mode, and ann's panel follows it. Every wait polls the
// DOM with a deadline; nothing sleeps. Chromium is Debian's
// (PRESENCED_CHROMIUM, default /usr/bin/chromium); playwright-core never
// downloads a browser.

import { chromium } from "playwright-core";
import path from "node:path";

const [base, outDir] = process.argv.slice(2);
if (!base || !outDir) {
  console.error("usage: node e2e/room.mjs <base url> <output dir>");
  process.exit(2);
}
const grace = Number(process.env.PRESENCED_CLOSE_GRACE_MS || 5000);
const STEP = 5000; // a live change reaches a watcher well within this
const started = Date.now();
const log = (msg) => console.log(`${((Date.now() - started) / 1000).toFixed(2).padStart(6)}s  ${msg}`);

const browser = await chromium.launch({
  executablePath: process.env.PRESENCED_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
const problems = [];
let ann, ben;
const member = (id, status) => `#room-list li[data-user-id="${id}"]` + (status ? `[data-status="${status}"]` : "");

try {
  ann = await openPage("ann");
  ben = await openPage("ben");

  await signIn(ann, "ann");
  await see(ann, member("ann", "online"), STEP, "ann sees herself in the room");
  await see(ann, '#room-count[data-count="1"]', STEP, "ann's room counts 1");

  // Record every set of members ann's panel shows, to catch a false leave.
  await ann.evaluate(() => {
    const list = document.querySelector("#room-list");
    const ids = () => [...list.children].map((li) => li.dataset.userId).join(",");
    window.__room = [ids()];
    new MutationObserver(() => {
      if (window.__room.at(-1) !== ids()) window.__room.push(ids());
    }).observe(list, { childList: true });
  });

  await signIn(ben, "ben");
  await see(ann, member("ben", "online"), STEP, "ben signs in → ann sees him in the room");
  await see(ann, '#room-count[data-count="2"]', STEP, "ann's room counts 2");
  await see(ben, member("ann", "online"), STEP, "ben sees ann in the room");
  await see(ben, '#room-count[data-count="2"]', STEP, "ben's room counts 2");
  await expectText(ben, "#room-count", "2 here");
  await expectText(ben, `${member("ben")} .name`, "ben (you)");

  await ben.check('input[name=status][value="busy"]');
  await see(ann, member("ben", "busy"), STEP, "ben turns busy → ann's room shows him busy");

  // A reload is the same device back within the close grace: ann's panel
  // never shows the room without ben. His next change is causally after
  // anything the reload caused.
  await ben.reload();
  await see(ben, '#conn[data-state="open"]', STEP, "ben's reloaded tab reconnects");
  await see(ben, member("ann"), STEP, "ben's reloaded page shows the room again");
  await ben.check('input[name=status][value="away"]');
  await see(ann, member("ben", "away"), STEP, "ben turns away after the reload → ann sees it");
  await ann.screenshot({ path: path.join(outDir, "room.png"), fullPage: true });

  // Closing the tab sends no bye: ben leaves the room when the close grace
  // after his socket closed runs out.
  const closed = Date.now();
  await ben.close();
  await see(ann, '#room-count[data-count="1"]', grace + STEP, "ben closes his tab → ann's room counts 1 again");
  const took = Date.now() - closed;
  log(`  ben left ${took} ms after the tab closed (close grace ${grace} ms)`);
  if (took < grace * 0.8) problems.push(`ben left the room ${took} ms after closing, before his close grace of ${grace} ms ran out`);
  if (await ann.$(member("ben"))) problems.push("ann's room still lists ben after he left");

  const seen = await ann.evaluate(() => window.__room);
  const want = ["ann", "ann,ben", "ann"];
  if (JSON.stringify(seen) !== JSON.stringify(want)) {
    problems.push(`ann's panel showed the room as ${seen.map((s) => `[${s}]`).join(" → ")}; want ${want.map((s) => `[${s}]`).join(" → ")}`);
  } else {
    log(`ann saw the room as ${seen.map((s) => `[${s}]`).join(" → ")}`);
  }

  // The room grows past the server's -room-interval-above
  // (PRESENCED_ROOM_INTERVAL_ABOVE): it switches to interval mode, and
  // ann's panel follows its once-an-interval messages.
  const above = Number(process.env.PRESENCED_ROOM_INTERVAL_ABOVE || 0);
  if (above > 0) {
    for (let i = 0; i <= above; i++) await joinOverHTTP(`guest-${i}`);
    await see(ann, `#room-count[data-count="${above + 2}"]`, STEP, `${above + 1} guests join → the room switches to interval mode`);
    await joinOverHTTP("late-guest");
    await see(ann, `#room-count[data-count="${above + 3}"]`, STEP, "one more joins → ann's panel counts it from the interval's message");
    await see(ann, member("late-guest"), STEP, "and lists the late guest");
  }
} catch (err) {
  problems.push(err.message.split("\n").slice(0, 6).join("\n"));
  for (const p of [ann, ben]) {
    if (p && !p.isClosed()) {
      await p.screenshot({ path: path.join(outDir, `failure-room-${p.__name}.png`), fullPage: true }).catch(() => {});
      const state = await p
        .evaluate(() => ({
          connection: document.querySelector("#conn")?.textContent,
          room: [...document.querySelectorAll("#room-list li")].map((li) => li.innerText.replace(/\s+/g, " ")),
          count: document.querySelector("#room-count")?.textContent,
          note: document.querySelector("#room-note")?.textContent,
        }))
        .catch(() => null);
      console.error(`${p.__name}'s page: ${JSON.stringify(state)}`);
    }
  }
} finally {
  await browser.close();
}

if (problems.length) {
  for (const p of problems) console.error(`FAIL: ${p}`);
  process.exit(1);
}
log("ok");

// --- helpers ---

// joinOverHTTP brings user's device online and into the room over HTTP
// (the server runs -dev: no credentials).
async function joinOverHTTP(user) {
  for (const [path, body] of [
    ["/v1/heartbeat", { user_id: user, device_id: "d" }],
    ["/v1/rooms/demo/join", { user_id: user, device_id: "d" }],
  ]) {
    const r = await fetch(base + path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (!r.ok) throw new Error(`POST ${path} for ${user}: ${r.status} ${await r.text()}`);
  }
}

async function openPage(name) {
  const context = await browser.newContext({ viewport: { width: 720, height: 800 }, locale: "en-US" });
  const page = await context.newPage();
  page.__name = name;
  page.setDefaultTimeout(STEP);
  page.setDefaultNavigationTimeout(20000); // a loaded CI machine may be slow to serve the first page
  page.on("pageerror", (err) => problems.push(`${name}'s page threw: ${err.message}`));
  page.on("console", (msg) => {
    if (msg.type() === "error" || msg.type() === "warning") log(`[${name} console ${msg.type()}] ${msg.text()}`);
  });
  return page;
}

async function signIn(page, user) {
  await page.goto(base + "/");
  await page.fill("#user-id", user);
  await page.click('#signin-form button[type="submit"]');
  await see(page, '#conn[data-state="open"]', STEP, `${user} signs in`);
  await see(page, "#room:not([hidden])", STEP, `${user} sees the room's panel`);
}

// see waits until selector matches on page, or throws after timeout ms.
async function see(page, selector, timeout, what) {
  const t0 = Date.now();
  try {
    await page.waitForSelector(selector, { state: "attached", timeout });
  } catch {
    throw new Error(`${what}: ${selector} not there within ${timeout} ms on ${page.__name}'s page`);
  }
  log(`${what} (${Date.now() - t0} ms)`);
}

// expectText waits until the element's text contains want.
async function expectText(page, selector, want) {
  try {
    await page.waitForFunction(
      ([sel, w]) => document.querySelector(sel)?.textContent.includes(w),
      [selector, want],
      { timeout: STEP, polling: 100 },
    );
  } catch {
    const got = await page.textContent(selector).catch(() => null);
    throw new Error(`${page.__name}'s ${selector} shows ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  }
}
