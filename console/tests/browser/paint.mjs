// Times the console's pages in Chromium: first contentful paint, and the
// moment the page shows everything (the list's rows; every node of the
// graph). Run by `cargo bench -p muster-tests --bench console`, which
// passes MUSTER_CONSOLE_URL, OPERATOR_TOKEN, EXECUTION_ID and STEPS.
import { chromium } from "playwright-core";

const base = process.env.MUSTER_CONSOLE_URL;
const steps = Number(process.env.STEPS);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const page = await context.newPage();
page.setDefaultTimeout(120_000);
await page.goto(`${base}/signin`);
await page.getByLabel("Token").fill(process.env.OPERATOR_TOKEN);
await page.getByRole("button", { name: "Sign in" }).click();
await page.waitForURL(`${base}/executions`);

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

async function time(name, path, complete) {
  const paints = [], completes = [];
  for (let run = 0; run < 5; run += 1) {
    const started = Date.now();
    await page.goto(`${base}${path}`);
    await page.waitForFunction(complete, steps);
    completes.push(Date.now() - started);
    paints.push(await page.evaluate(() => new Promise((resolve) => {
      new PerformanceObserver((list) => {
        const paint = list.getEntries().find((entry) => entry.name === "first-contentful-paint");
        if (paint) resolve(paint.startTime);
      }).observe({ type: "paint", buffered: true });
      setTimeout(() => resolve(NaN), 5000);
    })));
  }
  console.log(`${name.padEnd(34)} first paint ${median(paints).toFixed(0).padStart(5)} ms   complete ${median(completes).toFixed(0).padStart(5)} ms   (median of 5)`);
}

await time("executions list (1,000 executions)", "/executions", () => document.querySelectorAll("table.executions tbody tr").length > 0);
await time(`execution graph (${steps} steps)`, `/executions/${encodeURIComponent(process.env.EXECUTION_ID)}`,
  (count) => document.querySelectorAll('g.node[data-status="completed"]').length === count);
await browser.close();
