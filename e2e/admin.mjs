// The operator page's scenario of the end-to-end test (driven by
// admin_test.go):
//
//   node e2e/admin.mjs <base url> <output dir>
//
// with the node's API key in PRESENCED_API_KEY. The operator signs in at
// /admin with a wrong key (told so, nothing shown) and then the right one;
// sees this node listed and ready; sees the connection and online-user
// numbers move when bob signs in on the demo page in another browser, and
// the plots fill; asks why bob shows what he shows, as alice sees him,
// and who is in the demo page's room (bob); a
// reload keeps the sign-in (sessionStorage), signing out forgets the key.
// A screenshot of the page goes to <output dir>/admin.png. Every wait polls
// the DOM with a deadline; nothing sleeps.

import { chromium } from "playwright-core";
import path from "node:path";

const [base, outDir] = process.argv.slice(2);
const apiKey = process.env.PRESENCED_API_KEY;
if (!base || !outDir || !apiKey) {
  console.error("usage: PRESENCED_API_KEY=… node e2e/admin.mjs <base url> <output dir>");
  process.exit(2);
}
const STEP = 5000;
const started = Date.now();
const log = (msg) => console.log(`${((Date.now() - started) / 1000).toFixed(2).padStart(6)}s  ${msg}`);

const browser = await chromium.launch({
  executablePath: process.env.PRESENCED_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
const problems = [];

try {
  const op = await openPage("operator", { width: 1180, height: 1060 });
  await op.goto(base + "/admin");

  // A wrong key is refused, and said so.
  await op.fill("#api-key", "not-the-api-key");
  await op.click('#signin-form button[type="submit"]');
  await expectText(op, "#signin-error", "not this server's API key");
  await see(op, "#dash[hidden]", STEP, "a wrong key shows nothing");
  if (await op.evaluate(() => sessionStorage.getItem("presenced.admin.key")) !== null) {
    problems.push("a refused key was kept in sessionStorage");
  }

  // The right key signs in.
  await op.fill("#api-key", apiKey);
  await op.click('#signin-form button[type="submit"]');
  await see(op, "#dash:not([hidden])", STEP, "the right key signs in");
  await see(op, "#signin[hidden]", STEP, "the sign-in form is gone");
  await expectText(op, "#signin-error", "");
  await see(op, '#nodes li[data-self="true"][data-health="ready"]', STEP, "this node is listed, ready");
  await expectText(op, '#nodes li[data-self="true"] .detail', "gateway ok");
  await expectText(op, "#v-connections", "0");
  await expectText(op, "#v-online", "0");

  // bob signs in on the demo page: a WebSocket, an online user.
  const bob = await openPage("bob", { width: 720, height: 640 });
  await bob.goto(base + "/");
  await bob.fill("#user-id", "bob");
  await bob.click('#signin-form button[type="submit"]');
  await see(bob, '#conn[data-state="open"]', STEP, "bob signs in on the demo page");
  await bob.fill("#add-id", "alice");
  await bob.press("#add-id", "Enter");
  await see(bob, '#contact-list li[data-user-id="alice"]', STEP, "bob adds alice");
  await until(async () => (await op.textContent("#v-connections")) === "1", STEP, "the operator sees 1 connection");
  await until(async () => (await op.textContent("#v-online")) === "1", STEP, "the operator sees 1 online user");

  // The plots fill: one point a second, rates from the second on.
  const points = (id) => op.evaluate((i) => Number(document.getElementById(i).dataset.points || 0), id);
  await until(async () => (await points("plot-conns")) >= 4, 15000, "the connections plot has 4 points");
  await until(async () => (await points("plot-beats")) >= 3, 15000, "the heartbeats plot has 3 points");
  await until(async () => (await op.$$("#plot-conns polyline")).length >= 1, STEP, "the connections plot draws a line");
  await see(op, "#plot-bus text.none", STEP, "the bus plot says there is no bus");
  await until(async () => Number(await op.textContent("#v-beats")) > 0, 15000, "heartbeats/s above 0");

  // Why does bob show what he shows, to alice?
  await op.fill("#user-id", "bob");
  await op.fill("#viewer-id", "alice");
  await op.click('#user-form button[type="submit"]');
  await see(op, "#user-view:not([hidden])", STEP, "the user view opens");
  await expectText(op, "#user-status", "online");
  await expectText(op, "#user-reason", "a device was active");
  await until(async () => (await op.$$("#user-devices tr[data-device]")).length === 1, STEP, "bob's one device is listed");
  await expectText(op, "#user-status-vis", "everyone");
  await expectText(op, "#viewer-name", "alice");
  await expectText(op, "#viewer-status", "online");
  await expectText(op, "#viewer-why", "alice is not in bob's contact list");
  await expectText(op, "#viewer-relation", "other");
  // A bad id is refused with the server's reason.
  await op.fill("#user-id", "no spaces allowed");
  await op.fill("#viewer-id", "");
  await op.click('#user-form button[type="submit"]');
  await expectText(op, "#user-error", "user_id");
  await op.fill("#user-id", "bob");
  await op.fill("#viewer-id", "alice");
  await op.click('#user-form button[type="submit"]');
  await see(op, "#user-view:not([hidden])", STEP, "the user view again");
  // Who is in the demo page's room? bob, as alice sees him.
  await op.fill("#room-id", "demo");
  await op.fill("#room-viewer-id", "alice");
  await op.click('#room-form button[type="submit"]');
  await see(op, "#room-view:not([hidden])", STEP, "the room view opens");
  await expectText(op, "#room-count", "1 member");
  await see(op, '#room-members tr[data-user="bob"]', STEP, "bob is listed in the demo room");
  await expectText(op, '#room-members tr[data-user="bob"]', "online");
  await until(async () => (await points("plot-conns")) >= 8, 15000, "the plots have 8 points");
  // At a phone's width nothing lies outside the page or its cards.
  await op.setViewportSize({ width: 420, height: 900 });
  const over = await op.evaluate(() => {
    const out = [];
    const w = document.documentElement.clientWidth;
    if (document.documentElement.scrollWidth > w) out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
    for (const card of document.querySelectorAll(".card, .tile")) {
      if (card.closest("[hidden]")) continue;
      const box = card.getBoundingClientRect();
      for (const e of card.querySelectorAll("*")) {
        const r = e.getBoundingClientRect();
        if (r.width > 0 && (r.right > box.right + 1 || r.left < box.left - 1)) {
          out.push(`${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}.${e.className} lies outside its card`);
          break;
        }
      }
    }
    return out;
  });
  for (const o of over) problems.push(`at 420 px: ${o}`);
  // One time format on the page: no ISO stamps among the local ones.
  const iso = await op.evaluate(() =>
    [...document.querySelectorAll("#dash *")]
      .filter((e) => e.children.length === 0 && !e.closest("[hidden]"))
      .map((e) => e.textContent)
      .filter((t) => /\d{4}-\d\d-\d\dT\d\d:\d\d/.test(t)),
  );
  if (iso.length) problems.push(`ISO times beside local ones: ${JSON.stringify(iso)}`);
  await op.setViewportSize({ width: 1180, height: 1060 });
  const shot = path.join(outDir, "admin.png");
  await op.screenshot({ path: shot, fullPage: true });
  log(`screenshot: ${shot}`);

  // A reload signs in again from sessionStorage; signing out forgets the key.
  await op.reload();
  await see(op, "#dash:not([hidden])", STEP, "a reload keeps the sign-in");
  await see(op, '#nodes li[data-self="true"][data-health="ready"]', STEP, "the node again after the reload");
  await op.click("#signout");
  await see(op, "#dash[hidden]", STEP, "signing out hides the page");
  if (await op.evaluate(() => sessionStorage.getItem("presenced.admin.key")) !== null) {
    problems.push("signing out left the key in sessionStorage");
  }
} catch (err) {
  problems.push(err.message);
} finally {
  await browser.close();
}
if (problems.length) {
  for (const p of problems) console.error(`FAIL: ${p}`);
  process.exit(1);
}
log("operator page scenario passed");

async function openPage(name, viewport) {
  const context = await browser.newContext({ viewport, locale: "en-US", colorScheme: "light" });
  const page = await context.newPage();
  page.__name = name;
  page.setDefaultTimeout(STEP);
  page.setDefaultNavigationTimeout(20000);
  page.on("pageerror", (err) => problems.push(`${name}'s page threw: ${err.message}`));
  page.on("console", (msg) => {
    // The browser logs the refusals the scenario asks for (the wrong key's
    // 401, the bad user id's 400): expected.
    if (msg.type() === "error" && /Failed to load resource.*\b(400|401)\b/.test(msg.text())) return;
    if (msg.type() === "error" || msg.type() === "warning") problems.push(`${name}'s console ${msg.type()}: ${msg.text()}`);
  });
  return page;
}

async function see(page, selector, timeout, what) {
  const t0 = Date.now();
  try {
    await page.waitForSelector(selector, { state: "attached", timeout });
  } catch {
    throw new Error(`${what}: ${selector} not there within ${timeout} ms on ${page.__name}'s page`);
  }
  log(`${what} (${Date.now() - t0} ms)`);
}

async function until(cond, timeout, what) {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeout) throw new Error(`${what}: not within ${timeout} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
  log(`${what} (${Date.now() - t0} ms)`);
}

// expectText waits until the element's text contains want ("" : is empty).
async function expectText(page, selector, want) {
  try {
    await page.waitForFunction(
      ([sel, w]) => {
        const t = document.querySelector(sel)?.textContent;
        return t !== undefined && (w === "" ? t === "" : t.includes(w));
      },
      [selector, want],
      { timeout: STEP, polling: 100 },
    );
  } catch {
    const got = await page.textContent(selector).catch(() => null);
    throw new Error(`${page.__name}'s ${selector} shows ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  }
}
