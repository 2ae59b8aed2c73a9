// The browser scenario of the end-to-end test (driven by browser_test.go):
//
//   node e2e/browser.mjs <base url> <output dir> [control url]
//
// Browser contexts are people. Alice signs in and watches bob and carol;
// bob signs in, turns busy, invisible, online again, reloads his tab, and
// closes it. Alice's page must show each of these within a deadline, never
// a false offline, and bob offline within the ttl (PRESENCED_TTL_MS) of
// closing the tab. Then, given a control URL, the server restarts: alice's
// page must reconnect and re-subscribe by itself, and see carol sign in.
// Last, erin's client renews her 2 s tokens through a token function
// while alice watches: alice must see no change.
// Every wait polls the DOM with a deadline; nothing sleeps. Chromium is
// Debian's (PRESENCED_CHROMIUM, default /usr/bin/chromium); playwright-core
// never downloads a browser.

import { chromium } from "playwright-core";
import path from "node:path";

const [base, outDir, control] = process.argv.slice(2);
if (!base || !outDir) {
  console.error("usage: node e2e/browser.mjs <base url> <output dir>");
  process.exit(2);
}
const ttl = Number(process.env.PRESENCED_TTL_MS || 30000);
const STEP = 5000; // a live change reaches a watcher well within this
const started = Date.now();
const log = (msg) => console.log(`${((Date.now() - started) / 1000).toFixed(2).padStart(6)}s  ${msg}`);

const browser = await chromium.launch({
  executablePath: process.env.PRESENCED_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
const problems = [];
let alice, bob, carol;

try {
  alice = await openPage("alice");
  bob = await openPage("bob");

  await signIn(alice, "alice");
  // Heartbeat timers also run in a worker (background tabs throttle page timers).
  await until(() => alice.workers().some((w) => w.url().endsWith("/static/presence-timer.js")), STEP, "the timer worker runs");
  await alice.fill("#add-id", "bob");
  await alice.press("#add-id", "Enter");
  const row = '#contact-list li[data-user-id="bob"]';
  await see(alice, `${row}[data-status="offline"]`, STEP, "alice sees bob (never seen) offline");
  await expectText(alice, `${row} .seen`, "never seen");
  await alice.fill("#add-id", "carol");
  await alice.press("#add-id", "Enter");
  const carolRow = '#contact-list li[data-user-id="carol"]';
  await see(alice, `${carolRow}[data-status="offline"]`, STEP, "alice sees carol (never seen) offline");

  // Record every status alice's page shows for bob, to catch flaps.
  await alice.evaluate((sel) => {
    const li = document.querySelector(sel);
    window.__bobStatuses = [li.dataset.status];
    new MutationObserver(() => {
      const s = li.dataset.status;
      if (window.__bobStatuses.at(-1) !== s) window.__bobStatuses.push(s);
    }).observe(li, { attributes: true, attributeFilter: ["data-status"] });
  }, row);

  await signIn(bob, "bob");
  await see(alice, `${row}[data-status="online"]`, STEP, "bob signs in → alice sees online");

  await see(bob, "#status-hint[hidden]", STEP, "the invisible hint is hidden while bob is online");
  await bob.fill("#status-text", "in a meeting");
  await bob.check('input[name=status][value="busy"]');
  await see(alice, `${row}[data-status="busy"]`, STEP, "bob sets busy → alice sees busy");
  await see(bob, "#status-hint[hidden]", STEP, "the invisible hint stays hidden when bob is busy");
  await expectText(alice, `${row} .text`, "in a meeting");

  await bob.check('input[name=status][value="invisible"]');
  await see(alice, `${row}[data-status="offline"]`, STEP, "bob goes invisible → alice sees offline");
  await see(bob, '#me-dot[data-status="invisible"]', STEP, "bob sees himself invisible");
  await see(bob, "#status-hint:not([hidden])", STEP, "the invisible hint shows while bob is invisible");
  await expectText(alice, `${row} .seen`, "last seen just now");

  await bob.fill("#status-text", "");
  await bob.check('input[name=status][value="online"]');
  await see(alice, `${row}[data-status="online"]`, STEP, "bob goes online → alice sees online");

  // A reload is the same device coming back: no offline in between. Bob's
  // next change is causally after anything the reload caused, so once
  // alice sees it she has seen any false offline too.
  await bob.reload();
  await see(bob, '#conn[data-state="open"]', STEP, "bob's reloaded tab reconnects, still signed in");
  await bob.check('input[name=status][value="away"]');
  await see(alice, `${row}[data-status="away"]`, STEP, "bob sets away after the reload → alice sees away");
  await bob.check('input[name=status][value="online"]');
  await see(alice, `${row}[data-status="online"]`, STEP, "bob back online");
  await bob.screenshot({ path: path.join(outDir, "bob.png"), fullPage: true });

  // Closing the tab sends no bye: the device ends when its ttl runs out.
  const closed = Date.now();
  await bob.close();
  await see(alice, `${row}[data-status="offline"]`, ttl + 5000, "bob closes his tab → alice sees offline");
  const took = Date.now() - closed;
  log(`  offline ${took} ms after the tab closed (ttl ${ttl} ms)`);
  // No goodbye on close: the departure is found by absence, one ttl after
  // the last beat (beats come every ttl/2, +10%: at least 0.45 ttl after
  // the close), not at once.
  if (took < ttl * 0.4) problems.push(`bob read offline ${took} ms after closing, before his ttl ran out: did the tab say bye?`);
  await expectText(alice, `${row} .seen`, "last seen just now");

  const seen = await alice.evaluate(() => window.__bobStatuses);
  const want = ["offline", "online", "busy", "offline", "online", "away", "online", "offline"];
  if (JSON.stringify(seen) !== JSON.stringify(want)) {
    problems.push(`alice's page showed bob as ${seen.join(" → ")}; want ${want.join(" → ")}`);
  } else {
    log(`alice saw bob ${seen.join(" → ")}`);
  }

  if (control) {
    const t0 = Date.now();
    const res = await fetch(`${control}/restart`, { method: "POST" });
    if (!res.ok) throw new Error(`restarting presenced: ${res.status} ${await res.text()}`);
    log(`presenced restarted (${Date.now() - t0} ms)`);
    carol = await openPage("carol");
    await signIn(carol, "carol");
    // Only a page that reconnected and subscribed again hears of carol.
    await see(alice, `${carolRow}[data-status="online"]`, 15000, "alice's page reconnects by itself → sees carol online");
    await see(alice, '#conn[data-state="open"]', STEP, "alice is connected again");
    await see(alice, `${row}[data-status="offline"]`, STEP, "bob still offline after the restart");
    await carol.fill("#status-text", "back in 5");
    await carol.check('input[name=status][value="away"]');
    await see(alice, `${carolRow}[data-status="away"]`, STEP, "carol sets away → alice sees away");

    // Signing out is an explicit bye: offline at once, not after the ttl.
    const t1 = Date.now();
    await carol.click("#signout");
    await see(carol, "#signin:not([hidden])", STEP, "carol signs out");
    await see(alice, `${carolRow}[data-status="offline"]`, STEP, "carol signs out → alice sees offline");
    if (Date.now() - t1 > ttl * 0.6) problems.push(`carol read offline ${Date.now() - t1} ms after signing out: no bye?`);
  }

  // A client token instead of a bare user id (the way production signs in).
  const token = process.env.PRESENCED_E2E_TOKEN; // for user "dave"
  if (token) {
    const dave = await openPage("dave");
    await dave.goto(base + "/");
    await dave.click("details summary");
    await dave.fill("#token", token);
    await dave.click('#signin-form button[type="submit"]');
    await see(dave, '#conn[data-state="open"]', STEP, "dave signs in with a token");
    await expectText(dave, "#me-name", "dave");
    await expectText(dave, "#conn", "Connected as dave");
    // The token has no rooms claim: the room's panel says so, nothing else does.
    await expectText(dave, "#room-note", 'does not let you into the room "demo"');
    if (await dave.textContent("#add-error")) problems.push(`dave's page shows a contacts error: ${await dave.textContent("#add-error")}`);
    await alice.fill("#add-id", "dave");
    await alice.press("#add-id", "Enter");
    await see(alice, '#contact-list li[data-user-id="dave"][data-status="online"]', STEP, "alice sees dave online");
    await dave.close();
  }

  // A token the server refuses: the page stops retrying and says why.
  {
    const mallory = await openPage("mallory");
    await mallory.goto(base + "/");
    await mallory.click("details summary");
    await mallory.fill("#token", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtYWxsb3J5In0.forged");
    await mallory.click('#signin-form button[type="submit"]');
    await expectText(mallory, "#signin-error", "refused the token");
    await see(mallory, '#conn[data-state="closed"]', STEP, "a refused token stops the retries");
    await mallory.close();
  }

  // Tokens that expire: erin's client asks a function for a token before
  // every connection (the control URL mints 2 s tokens, as an app's
  // backend would); the server closes her socket at each expiry (4003) and
  // she comes back with a fresh token as the same device, which alice
  // never sees.
  if (control) {
    const erinRow = '#contact-list li[data-user-id="erin"]';
    await alice.fill("#add-id", "erin");
    await alice.press("#add-id", "Enter");
    await see(alice, `${erinRow}[data-status="offline"]`, STEP, "alice sees erin (never seen) offline");
    await alice.evaluate((sel) => {
      const li = document.querySelector(sel);
      window.__erinStatuses = [li.dataset.status];
      new MutationObserver(() => {
        const s = li.dataset.status;
        if (window.__erinStatuses.at(-1) !== s) window.__erinStatuses.push(s);
      }).observe(li, { attributes: true, attributeFilter: ["data-status"] });
    }, erinRow);
    const erin = await openPage("erin");
    // The page's backend: a function of the page that this script answers
    // (the demo page's CSP lets it connect to its own origin only).
    await erin.exposeFunction("mintToken", async () => {
      const res = await fetch(`${control}/token?user=erin&ttl=2s`);
      if (!res.ok) throw new Error(`token: HTTP ${res.status} ${await res.text()}`);
      return (await res.text()).trim();
    });
    await erin.goto(base + "/");
    await erin.evaluate(async () => {
      const { PresenceClient } = await import("/static/presence.js");
      const e = (window.__erin = { tokens: 0, expiries: 0, devices: [], state: "" });
      const client = new PresenceClient({
        token: async () => {
          e.tokens++;
          return window.mintToken();
        },
      });
      client.addEventListener("welcome", (ev) => e.devices.push(ev.detail.device_id));
      client.addEventListener("state", (ev) => {
        e.state = ev.detail.state;
        if (ev.detail.code === 4003) e.expiries++;
      });
      window.__erinClient = client;
      client.start();
    });
    await see(alice, `${erinRow}[data-status="online"]`, STEP, "erin connects with a token from a function → alice sees online");
    await until(
      () => erin.evaluate(() => window.__erin.expiries >= 2 && window.__erin.state === "open"),
      15000,
      "erin's socket is closed at its token's expiry (4003) twice, and renewed each time",
    );
    const erinState = await erin.evaluate(() => window.__erin);
    if (erinState.tokens < 3 || new Set(erinState.devices).size !== 1 || erinState.devices.length < 3) {
      problems.push(`erin's renewals: ${JSON.stringify(erinState)}; want 3 tokens or more and one device throughout`);
    }
    await erin.evaluate(() => window.__erinClient.setStatus("busy"));
    await see(alice, `${erinRow}[data-status="busy"]`, STEP, "erin sets busy after the renewals → alice sees busy");
    // busy is causally after the renewals: a false offline would be in the list.
    const seenErin = await alice.evaluate(() => window.__erinStatuses);
    const wantErin = ["offline", "online", "busy"];
    if (JSON.stringify(seenErin) !== JSON.stringify(wantErin)) {
      problems.push(`alice's page showed erin as ${seenErin.join(" → ")} while she renewed her token; want ${wantErin.join(" → ")}`);
    } else {
      log(`alice saw erin ${seenErin.join(" → ")} through ${erinState.expiries} token renewals`);
    }
    await erin.close();
  }

  await alice.screenshot({ path: path.join(outDir, "watcher.png"), fullPage: true });
  log(`screenshots in ${outDir}`);
} catch (err) {
  problems.push(err.message.split("\n").slice(0, 6).join("\n"));
  for (const p of [alice, bob, carol]) {
    if (p && !p.isClosed()) {
      await p.screenshot({ path: path.join(outDir, `failure-${p.__name}.png`), fullPage: true }).catch(() => {});
      const state = await p
        .evaluate(() => ({
          connection: document.querySelector("#conn")?.textContent,
          contacts: [...document.querySelectorAll("#contact-list li")].map((li) => li.innerText.replace(/\s+/g, " ")),
          errors: [...document.querySelectorAll(".error")].map((e) => e.textContent).filter(Boolean),
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

async function openPage(name) {
  const context = await browser.newContext({ viewport: { width: 720, height: 640 }, locale: "en-US" });
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
  await see(page, "#contacts:not([hidden])", STEP, `${user} sees the contact list`);
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

// until polls cond every 50 ms until it holds, or throws after timeout ms.
async function until(cond, timeout, what) {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeout) throw new Error(`${what}: not within ${timeout} ms`);
    await new Promise((r) => setTimeout(r, 50));
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
