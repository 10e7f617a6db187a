// What the browser checks share: the list of named checks they print, and Debian's Chromium
// launched headless through playwright-core (which downloads no browser of its own).
import { chromium } from "playwright-core";

export const checks = [];

/// Records one named check and prints it to stderr as it happens.
export const check = (what, ok, detail = "") => {
  checks.push({ what, ok: !!ok, detail: String(detail) });
  console.error(`  [${ok ? "ok" : "FAILED"}] ${what}${detail !== "" ? ` (${detail})` : ""}`);
};

export const launch = () => chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
