// Drives Debian's Chromium (playwright-core) through a live cluster's chat page, as a user would:
//   node chat_check.mjs URL KEY MODEL SCREENSHOT.png
// 1. an answer streams in and names the peer that served it;
// 2. Stop ends a long answer: the text stops growing, and no peer runs a stream after it;
// 3. the peer serving a long answer is killed (SIGKILL; the page's own peer is never the one):
//    the answer completes and the page shows the failover (two peers);
// 4. the dashboard then shows that peer down (counted apart, drawn grey), not as a live peer.
// Prints a JSON summary; exit status 0 when every check passed, 1 otherwise.
import { check, checks, launch } from "./common.mjs";

const [url, key, model, shot] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${key}` };
const getJson = async (path) => (await fetch(`${url}${path}`, { headers: auth })).json();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const browser = await launch();
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 1200 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${url}/chat#key=${encodeURIComponent(key)}`);
  await page.waitForFunction(() => document.querySelectorAll("#model option").length > 0,
                             null, { timeout: 30000 });
  const options = await page.$$eval("#model option", (os) => os.map((o) => o.textContent));
  check("the model list comes from /v1/models", options.includes(model), options.join(","));
  const self = (await getJson("/status")).node.id;

  // Sends `text` with `max` tokens; returns the new assistant message's locator.
  const send = async (text, max) => {
    await page.fill("#max", String(max));
    await page.fill("#input", text);
    const before = await page.locator(".msg.assistant").count();
    await page.click("#send");
    await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant").length > n,
                               before);
    return page.locator(".msg.assistant").nth(before);
  };
  const done = async (msg, ms) => page.waitForFunction((el) => el.dataset.done === "1",
                                                       await msg.elementHandle(), { timeout: ms });

  // 1. A short answer.
  const first = await send("Once upon a time", 16);
  await done(first, 60000);
  const text1 = await first.locator(".text").textContent();
  const meta1 = await first.locator(".meta").textContent();
  check("an answer streams in", text1.length > 0, JSON.stringify(text1.slice(0, 40)));
  check("it names the peer that served it", /served by [0-9a-f]{8}/.test(meta1), meta1);
  check("it ended at max tokens", (await first.getAttribute("data-finish")).startsWith("length"),
        await first.getAttribute("data-finish"));

  // 2. Stop.
  const long = await send("Tell me a long story", 1500);
  await page.waitForFunction((el) => el.querySelector(".text").textContent.length >= 40,
                             await long.elementHandle(), { timeout: 60000 });
  await page.click("#stop");
  await done(long, 10000);
  const stoppedAt = (await long.locator(".text").textContent()).length;
  await sleep(1500);
  const later = (await long.locator(".text").textContent()).length;
  check("Stop ends the answer", (await long.getAttribute("data-finish")) === "stopped" &&
        later === stoppedAt, `${stoppedAt} -> ${later}`);
  let running = -1;
  for (let k = 0; k < 50 && running !== 0; ++k) {
    const docs = await getJson("/cluster");
    running = Object.values(docs).reduce((n, d) => n + ((d && d.serving && d.serving.streams)
      ? d.serving.streams.length : 0), 0);
    if (running !== 0) await sleep(200);
  }
  check("and its peer stops generating (no stream runs on any peer)", running === 0, running);

  // 3. Failover: kill the peer serving a long answer (never this page's own peer).
  let killed = "", fail = null;
  for (let attempt = 0; attempt < 6 && !killed; ++attempt) {
    const msg = await send(`A long story, take ${attempt}`, 1200);
    await page.waitForFunction((el) => el.dataset.nodes && el.querySelector(".text").textContent.length >= 20,
                               await msg.elementHandle(), { timeout: 60000 });
    const serving = (await msg.getAttribute("data-nodes")).split(",")[0];
    if (serving === self) {  // served by the page's peer: try another request id
      await page.click("#stop");
      await done(msg, 10000);
      continue;
    }
    const docs = await getJson("/cluster");
    const pid = docs[serving] && docs[serving].node && docs[serving].node.pid;
    if (!pid) { check("the serving peer's pid is in /cluster", false, serving); break; }
    process.kill(pid, "SIGKILL");
    killed = serving;
    fail = msg;
  }
  check("a long answer was served by a peer other than the page's", killed !== "", killed);
  if (fail) {
    await done(fail, 120000);
    const nodes = (await fail.getAttribute("data-nodes")).split(",");
    const meta = await fail.locator(".meta").textContent();
    // (Sampled text: the model may end it before max tokens, after the failover.)
    const finish = await fail.getAttribute("data-finish");
    check("the answer completes after its peer was killed",
          (finish.startsWith("length") || finish === "stop") && !/error|failed/i.test(meta), meta);
    check("the page shows the failover from the killed peer to another",
          nodes.length >= 2 && nodes[0] === killed && nodes[nodes.length - 1] !== killed &&
          meta.includes("failover"), meta);
    await page.screenshot({ path: shot, fullPage: true });

    // 4. The dashboard shows the killed peer down.
    await page.goto(`${url}/#key=${encodeURIComponent(key)}`);
    await page.waitForFunction(() => /1 down/.test(document.querySelector("#peer-count")?.textContent ?? ""),
                               null, { timeout: 30000 }).catch(() => {});
    const count = await page.textContent("#peer-count").catch(() => "");
    check("the dashboard counts the killed peer down, not live", count === "2 peers, 1 down", count);
    const fills = await page.$$eval("#graph circle", (cs) => cs.map((c) => c.getAttribute("fill")));
    check("and draws it grey", fills.filter((f) => f === "#c9ced6").length === 1, fills.join(","));
  }
  check("the pages raised no script error", errors.length === 0, errors.join("; "));
} catch (e) {
  check("the checks ran to the end", false, e.message);
} finally {
  await browser.close();
}
failed = checks.some((c) => !c.ok);
console.log(JSON.stringify({ ok: !failed, checks }));
process.exit(failed ? 1 : 0);
