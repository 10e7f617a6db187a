// Drives Debian's Chromium (playwright-core) through a live cluster's dashboard:
//   node dashboard_check.mjs URL KEY LEADER PEERS SCREENSHOT.png API_URL MODEL
// Checks that the page draws the mesh the nodes report (PEERS peers, every directed link, the
// LEADER), that it updates live (a completion sent to the API shows up in the tokens served), and
// that the screenshot shows the topology with the leader drawn in the leader's colour. Prints a
// JSON summary; exit status 0 when every check passed, 1 otherwise.
import { check, checks, launch } from "./common.mjs";

const [url, key, leader, peersText, shot, apiUrl, model] = process.argv.slice(2);
const peers = Number(peersText);

const browser = await launch();
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 1400 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${url}/#key=${encodeURIComponent(key)}`);
  // The peers table fills in once /cluster answered: a header row plus one row per peer.
  await page.waitForFunction((n) => document.querySelectorAll("#peers tr").length === n + 1,
                             peers, { timeout: 30000 });
  const leaderShown = await page.textContent("#leader");
  check("the page names the leader the nodes report", leader.startsWith(leaderShown),
        `${leaderShown} vs ${leader}`);
  const linkRows = await page.locator("#links tr").count();
  check("every directed link is listed", linkRows - 1 === peers * (peers - 1), linkRows - 1);
  const planText = await page.textContent("#plan");
  check("the plan shows the model and its groups", planText.includes(model) &&
        planText.includes("group 0"), planText.slice(0, 80));
  // Layer ranges are shown as the layers they hold (a replica of the 8-layer model: 0–7).
  check("a replica's layers read 0–7, not the half-open 0–8", planText.includes("0–7") &&
        !planText.includes("0–8"), planText.slice(0, 120));
  const count = await page.textContent("#peer-count");
  check("the summary counts the live peers", count === `${peers} peers`, count);
  const circles = await page.locator("#graph circle").count();
  check("the topology graph draws every peer", circles === peers, circles);

  // Live: tokens served grows after a completion through the API.
  const served = async () => page.evaluate(() =>
    [...document.querySelectorAll("#peers tr")].slice(1)
      .map((r) => Number(r.lastElementChild.textContent) || 0).reduce((a, b) => a + b, 0));
  const before = await served();
  const r = await fetch(`${apiUrl}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, prompt: "Once upon a time", max_tokens: 8, temperature: 0 }),
  });
  check("a completion through the API succeeds", r.status === 200, r.status);
  // (A synchronous predicate: waitForFunction takes a returned promise as truthy at once.)
  await page.waitForFunction((b) => {
    const rows = [...document.querySelectorAll("#peers tr")].slice(1);
    return rows.map((x) => Number(x.lastElementChild.textContent) || 0).reduce((a, c) => a + c, 0) >= b + 8;
  }, before, { timeout: 15000 }).catch(() => {});
  const after = await served();
  check("the page updates live: tokens served grew by the completion's 8", after >= before + 8,
        `${before} -> ${after}`);
  const state = await page.textContent("#state");
  check("the page reports no error", state.startsWith("live"), state);

  // Screenshot: the whole page, then its pixels — the leader's circle (#2b6cb0) must be drawn and
  // the followers' (#8fb3d9) once per other peer.
  const png = await page.screenshot({ path: shot, fullPage: true });
  const px = await page.evaluate(async (b64) => {
    const img = new Image();
    img.src = `data:image/png;base64,${b64}`;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.width;
    c.height = img.height;
    const g = c.getContext("2d");
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let lead = 0, follow = 0;
    const colours = new Set();
    for (let i = 0; i < d.length; i += 4) {
      const k = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
      colours.add(k);
      if (k === 0x2b6cb0) lead++;
      if (k === 0x8fb3d9) follow++;
    }
    return { width: c.width, height: c.height, colours: colours.size, lead, follow };
  }, png.toString("base64"));
  // A circle of radius 22 is ~1500 pixels; its label covers some of them.
  check("the screenshot shows one leader circle", px.lead > 800 && px.lead < 2 * 1520, px.lead);
  check("the screenshot shows the follower circles", px.follow > 800 * (peers - 1) &&
        px.follow < 1520 * (peers - 1) + 100, px.follow);
  check("no script error on the page", errors.length === 0, errors.join("; "));
  console.log(JSON.stringify({ checks, screenshot: shot, pixels: px }));
} catch (e) {
  check("the dashboard loaded and drew the cluster", false, e.message.split("\n")[0]);
  failed = true;
} finally {
  await browser.close();
}
process.exit(failed || checks.some((c) => !c.ok) ? 1 : 0);
