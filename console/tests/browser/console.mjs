// The console in a real browser: Playwright driving Chromium against a
// running cluster. Run by the end-to-end test `console::in_a_browser`,
// which starts the cluster with its console, serves the sample agents and
// passes what this needs in the environment:
//   MUSTER_CONSOLE_URL   the console's address
//   OPERATOR_TOKEN       an operator's token
//   APPROVER_TOKEN       editor-agent's token (it decides the human step)
//   BYSTANDER_TOKEN      archive-agent's token (informed, not an approver)
//   SCREENSHOTS          folder for a screenshot of each page
//   CHROMIUM             the browser (default /usr/bin/chromium)
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const require = createRequire(import.meta.url);
const AXE = readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");
const base = process.env.MUSTER_CONSOLE_URL;
const screenshots = process.env.SCREENSHOTS;
const LIMIT = 30_000;

const PROCESS = `# The console's browser test: a draft, a person's decision, publishing.
name: console-review
lead: manager-agent
steps:
  - id: draft
    name: Draft
    type: agent_task
    message: Write <script>alert("owned")</script> a draft
  # This comment survives every edit of the role matrix.
  - id: decide
    name: Decide
    type: human_approval
    depends_on: [draft]
    roles:
      executor: editor-agent
  - id: publish
    name: Publish
    type: agent_task
    agent: writer-agent
    message: Publish it
    depends_on: [decide]
`;

function check(condition, what) {
  if (!condition) throw new Error(`failed: ${what}`);
  console.log(`ok: ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const problems = [];

// `refusals`: the page is expected to be refused (403) by the console.
async function signedIn(token, options = {}, refusals = false) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, ...options });
  const page = await context.newPage();
  page.setDefaultTimeout(LIMIT);
  page.on("console", (message) => {
    const expected = refusals && message.text().includes("status of 403");
    if (message.type() === "error" && !expected) problems.push(`${page.url()}: ${message.text()}`);
  });
  page.on("pageerror", (error) => problems.push(`${page.url()}: ${error.message}`));
  page.on("dialog", (dialog) => { problems.push(`a dialog opened: ${dialog.message()}`); dialog.dismiss(); });
  await page.goto(`${base}/signin`);
  await page.getByLabel("Token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(`${base}/executions`);
  return { context, page };
}

async function shoot(page, name) {
  if (!screenshots) return;
  mkdirSync(screenshots, { recursive: true });
  await page.screenshot({ path: `${screenshots}/${name}.png`, fullPage: false });
}

try {
  // Sign-in: a wrong token is refused, the page says so.
  {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await context.newPage();
    await page.goto(`${base}/executions`);
    check(page.url() === `${base}/signin`, "a visitor without a session is sent to sign in");
    await shoot(page, "signin");
    await page.getByLabel("Token").fill("not-a-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    check(await page.getByRole("alert").textContent() === "the cluster does not know this token", "a wrong token is refused");
    await context.close();
  }

  const operator = await signedIn(process.env.OPERATOR_TOKEN);
  const page = operator.page;
  check((await page.locator(".who").textContent()).includes("operator"), "the operator is signed in");

  // The role matrix edits the YAML's roles block; comments survive.
  await page.goto(`${base}/editor`);
  const source = page.locator("#source");
  await source.fill(PROCESS);
  const draftRow = page.locator('#matrix tr[data-step="draft"]');
  await draftRow.waitFor();
  await draftRow.locator('select[name="executor"]').selectOption("writer-agent");
  await page.waitForFunction(() => document.querySelector("#source").value.includes("      executor: writer-agent"));
  await draftRow.locator('select[name="monitors"]').selectOption(["editor-agent", "manager-agent"]);
  await page.waitForFunction(() => document.querySelector("#source").value.includes("monitors: [editor-agent, manager-agent]"));
  await draftRow.locator('select[name="informed"]').selectOption(["archive-agent"]);
  await page.waitForFunction(() => document.querySelector("#source").value.includes("informed: [archive-agent]"));
  const edited = await source.inputValue();
  check(edited.includes(`    message: Write <script>alert("owned")</script> a draft
    roles:
      executor: writer-agent
      monitors: [editor-agent, manager-agent]
      informed: [archive-agent]
  # This comment survives every edit of the role matrix.
`), "choosing an executor, two monitors and an informed agent writes the step's roles block");
  check(edited.startsWith("# The console's browser test"), "the document's other comments survive");
  await page.waitForSelector("#diagnostics li.ok");
  check(await page.locator("#diagnostics li.error").count() === 0, "the edited process is valid");

  // An error is marked at its line and column as one types.
  const broken = edited.replace("type: human_approval", "type: human_aproval");
  const line = broken.split("\n").findIndex((text) => text.includes("human_aproval")) + 1;
  await source.fill(broken);
  const marked = page.locator(`#diagnostics li.error[data-line="${line}"]`);
  await marked.waitFor();
  check((await marked.textContent()).includes(`Line ${line}, column`), `the error is listed at line ${line}`);
  check(await page.locator(`#gutter li.marked-error[data-line="${line}"]`).count() === 1, "the gutter marks the line");
  await shoot(page, "editor");

  // Fixed, published and started; the graph turns live.
  await source.fill(edited);
  await page.waitForSelector("#diagnostics li.ok");
  await page.getByRole("button", { name: "Publish and start" }).click();
  await page.waitForURL(/\/executions\/[^/]+$/);
  const executionUrl = page.url();
  const executionId = decodeURIComponent(executionUrl.split("/").pop());
  await page.waitForSelector('g.node[data-step="decide"][data-status="waiting_approval"]');
  check(await page.locator('g.node[data-step="draft"]').getAttribute("data-status") === "completed", "the draft step completed live");
  check(await page.getByRole("button", { name: "Approve decide" }).count() === 0, "an operator is not offered a decision only agents make");

  // An agent that is not entitled sees no approve button, and is refused anyway.
  const bystander = await signedIn(process.env.BYSTANDER_TOKEN, {}, true);
  await bystander.page.goto(executionUrl);
  await bystander.page.waitForSelector('g.node[data-step="decide"]');
  check(await bystander.page.getByRole("button", { name: /Approve/ }).count() === 0, "the informed agent sees no approve button");
  const forged = await bystander.page.evaluate(async (id) => {
    const csrf = document.querySelector(".execution").dataset.csrf;
    const answer = await fetch(`/executions/${encodeURIComponent(id)}/decide`, {
      method: "POST", body: new URLSearchParams({ csrf, step_id: "decide", approved: "true" }),
    });
    return { status: answer.status, text: await answer.text() };
  }, executionId);
  check(forged.status === 403 && forged.text.includes("PermissionDenied"), "posting the decision anyway is refused by the cluster");
  const noCsrf = await bystander.page.evaluate(async (id) => {
    const answer = await fetch(`/executions/${encodeURIComponent(id)}/decide`, {
      method: "POST", body: new URLSearchParams({ csrf: "forged", step_id: "decide", approved: "true" }),
    });
    return answer.status;
  }, executionId);
  check(noCsrf === 403, "a change without the session's CSRF token is refused");
  await bystander.context.close();

  // The approver decides; the operator's open page sees every step complete.
  const approver = await signedIn(process.env.APPROVER_TOKEN);
  await approver.page.goto(executionUrl);
  await approver.page.getByRole("button", { name: "Approve decide" }).click();
  await approver.page.waitForURL(executionUrl);
  const allCompleted = () => {
    const nodes = [...document.querySelectorAll("g.node")];
    return nodes.length === 3 && nodes.every((node) => node.dataset.status === "completed");
  };
  await page.waitForFunction(allCompleted);
  check(await page.evaluate(allCompleted), "every node turned completed live on the operator's page");
  await approver.context.close();

  // What an agent wrote is shown as text.
  await page.locator('g.node[data-step="draft"]').click();
  const output = await page.locator("#step pre.output").textContent();
  check(output.includes('<script>alert(\\"owned\\")</script>'), "an output containing <script> renders as text");
  check(await page.locator("#step script").count() === 0, "no element came of it");
  await shoot(page, "execution");

  await page.goto(`${base}/executions`);
  check(await page.locator(`a[href="/executions/${executionId}"]`).count() === 1, "the list shows the execution");
  await shoot(page, "executions");
  await page.goto(`${base}/roster`);
  check(await page.getByRole("cell", { name: "editor-agent", exact: true }).count() === 1, "the roster lists the agents");
  await page.getByLabel("Expertise needed").fill("");
  await page.getByLabel("Role").fill("writer");
  await page.getByRole("button", { name: "Ask the roster" }).click();
  await page.locator("#decision").waitFor();
  check((await page.locator("#decision").textContent()).length > 0, "the roster says who would take a task");
  await shoot(page, "roster");
  await page.goto(`${base}/team?execution=${encodeURIComponent(executionId)}`);
  await shoot(page, "team");

  // Readable at phone width: nothing wider than the screen on the list.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${base}/executions`);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `the executions list fits a phone's width (overflow ${overflow}px)`);
  await shoot(page, "executions-phone");
  await page.setViewportSize({ width: 1280, height: 800 });

  // Keyboard: the graph's nodes are reachable and open with Enter.
  await page.goto(executionUrl);
  await page.locator('g.node[data-step="publish"]').focus();
  await page.keyboard.press("Enter");
  check((await page.locator("#step").textContent()).includes("publish"), "a node opens from the keyboard");

  // Sign-out ends the session.
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(`${base}/signin`);
  await page.goto(`${base}/executions`);
  check(page.url() === `${base}/signin`, "after signing out the pages ask to sign in again");
  await operator.context.close();

  // Accessibility: axe-core on every page (its script needs the policy lifted, in this context only).
  const audit = await signedIn(process.env.OPERATOR_TOKEN, { bypassCSP: true });
  for (const path of ["/executions", "/editor", `/executions/${encodeURIComponent(executionId)}`, "/roster", `/team?execution=${encodeURIComponent(executionId)}`]) {
    await audit.page.goto(`${base}${path}`);
    await audit.page.waitForLoadState("networkidle").catch(() => {});
    await audit.page.addScriptTag({ content: AXE });
    const violations = await audit.page.evaluate(async () => {
      const results = await window.axe.run(document, { resultTypes: ["violations"] });
      return results.violations.filter((violation) => ["serious", "critical"].includes(violation.impact))
        .map((violation) => `${violation.id}: ${violation.help} (${violation.nodes.map((node) => node.target.join(" ")).slice(0, 3).join("; ")})`);
    });
    check(violations.length === 0, `no serious accessibility violations on ${path}${violations.length ? ": " + violations.join(" | ") : ""}`);
  }
  await audit.context.close();

  check(problems.length === 0, `no errors in the browser's console${problems.length ? ": " + problems.join(" | ") : ""}`);
} finally {
  await browser.close();
}
