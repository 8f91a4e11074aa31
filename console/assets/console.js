// muster's console: the live execution graph and the process editor.
// Plain script, no build step; everything an agent wrote is set as text.
"use strict";

(function () {
  function $(selector, root) { return (root || document).querySelector(selector); }

  function element(tag, attributes, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svg(tag, attributes) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    return node;
  }

  function jsonData(id) {
    const block = document.getElementById(id);
    return block ? JSON.parse(block.textContent) : null;
  }

  function word(name) {
    const index = name.indexOf("STATUS_");
    return (index >= 0 ? name.slice(index + 7) : name).toLowerCase();
  }

  function seconds(duration) {
    return duration ? parseFloat(duration) || 0 : 0;
  }

  // ----- One execution, live -----

  function executionPage(root) {
    const id = root.dataset.execution;
    const csrf = root.dataset.csrf;
    let state = jsonData("execution-state");
    const nodes = new Map();
    let chosen = null;

    function layout(steps) {
      const byId = new Map(steps.map((step) => [step.step_id, step]));
      const depth = new Map();
      function depthOf(stepId, seen) {
        if (depth.has(stepId)) return depth.get(stepId);
        if (seen.has(stepId)) return 0;
        seen.add(stepId);
        const step = byId.get(stepId);
        let value = 0;
        for (const parent of (step && step.depends_on) || []) {
          if (byId.has(parent)) value = Math.max(value, depthOf(parent, seen) + 1);
        }
        depth.set(stepId, value);
        return value;
      }
      // A step's column is the longest path to it from a step with no dependencies.
      for (const step of steps) depthOf(step.step_id, new Set());
      const rows = new Map();
      const place = new Map();
      for (const step of steps) {
        const column = depth.get(step.step_id);
        const row = rows.get(column) || 0;
        rows.set(column, row + 1);
        place.set(step.step_id, { column, row });
      }
      return place;
    }

    function drawGraph() {
      const steps = state.execution.steps || [];
      const graph = $("#graph");
      const place = layout(steps);
      const width = 200, height = 56, gapX = 50, gapY = 22;
      let columns = 0, rows = 0;
      for (const spot of place.values()) {
        columns = Math.max(columns, spot.column + 1);
        rows = Math.max(rows, spot.row + 1);
      }
      const picture = svg("svg", {
        width: columns * (width + gapX), height: rows * (height + gapY),
        role: "group", "aria-label": "Steps of the execution and what each depends on",
      });
      const position = (stepId) => {
        const spot = place.get(stepId);
        return { x: spot.column * (width + gapX), y: spot.row * (height + gapY) };
      };
      for (const step of steps) {
        for (const parent of step.depends_on || []) {
          if (!place.has(parent)) continue;
          const from = position(parent), to = position(step.step_id);
          picture.appendChild(svg("path", {
            class: "edge",
            d: `M${from.x + width},${from.y + height / 2} C${from.x + width + gapX / 2},${from.y + height / 2} ${to.x - gapX / 2},${to.y + height / 2} ${to.x},${to.y + height / 2}`,
          }));
        }
      }
      for (const step of steps) {
        const at = position(step.step_id);
        const group = svg("g", { class: "node", tabindex: "0", role: "button", "data-step": step.step_id, transform: `translate(${at.x},${at.y})` });
        group.appendChild(svg("rect", { width, height, rx: 6 }));
        const title = svg("text", { x: 10, y: 22, class: "name" });
        title.textContent = (step.name || step.step_id).slice(0, 26);
        const status = svg("text", { x: 10, y: 42, class: "status" });
        group.appendChild(title);
        group.appendChild(status);
        group.addEventListener("click", () => choose(step.step_id));
        group.addEventListener("keydown", (event) => {
          if (event.key === "Enter" || event.key === " ") { event.preventDefault(); choose(step.step_id); }
        });
        picture.appendChild(group);
        nodes.set(step.step_id, { group, status });
      }
      graph.replaceChildren(picture);
    }

    function paint() {
      const execution = state.execution;
      $("#summary").textContent =
        `${execution.process_name} v${execution.process_version} · ${word(execution.status)}` +
        (execution.lead_agent_id ? ` · lead ${execution.lead_agent_id}` : "") +
        (execution.reason ? ` · ${execution.reason}` : "");
      const steps = execution.steps || [];
      if (steps.some((step) => !nodes.has(step.step_id)) || nodes.size !== steps.length) {
        nodes.clear();
        drawGraph();
      }
      for (const step of steps) {
        const node = nodes.get(step.step_id);
        const status = word(step.status);
        node.group.setAttribute("data-status", status);
        node.group.setAttribute("class", `node state-${status}`);
        node.group.setAttribute("aria-label", `${step.name || step.step_id}: ${status}, executor ${step.executor || "none"}`);
        node.status.textContent = `${status}${step.executor ? " · " + step.executor : ""}`.slice(0, 26);
      }
      if (chosen) choose(chosen);
      drawActions();
    }

    function choose(stepId) {
      chosen = stepId;
      const step = (state.execution.steps || []).find((candidate) => candidate.step_id === stepId);
      if (!step) return;
      const roles = step.roles || {};
      const started = step.started_at ? Date.parse(step.started_at) : null;
      const ended = step.ended_at ? Date.parse(step.ended_at) : null;
      const rows = [
        ["Step", `${step.name || step.step_id} (${step.step_id})`],
        ["Type", step.step_type],
        ["Status", word(step.status)],
        ["Executor", step.executor || roles.executor || ""],
        ["Monitors", (roles.monitors || []).join(", ")],
        ["Informed", (roles.informed || []).join(", ")],
        ["Attempts", String(step.attempt || 0)],
        ["Tokens", String(step.tokens_used || 0)],
        ["Cost", String(step.cost || 0)],
        ["Duration", started && ended ? `${((ended - started) / 1000).toFixed(3)} s` : ""],
        ["Waiting for", (step.waiting_for || []).join(", ")],
        ["Error", step.error ? `${step.error.code || ""} ${step.error.message || ""}` : ""],
      ];
      const list = element("dl");
      for (const [name, value] of rows) {
        list.appendChild(element("dt", {}, name));
        list.appendChild(element("dd", {}, value || "–"));
      }
      list.appendChild(element("dt", {}, "Output"));
      const output = element("dd");
      output.appendChild(element("pre", { class: "output" }, step.output === null || step.output === undefined ? "–" : JSON.stringify(step.output, null, 2)));
      list.appendChild(output);
      $("#step").replaceChildren(list);
      for (const [key, node] of nodes) node.group.classList.toggle("chosen", key === stepId);
    }

    function hidden(name, value) { return element("input", { type: "hidden", name, value }); }

    function drawActions() {
      const forms = $("#action-forms");
      forms.replaceChildren();
      for (const stepId of state.decide || []) {
        const form = element("form", { method: "post", action: `/executions/${encodeURIComponent(id)}/decide`, class: "decision" });
        form.appendChild(hidden("csrf", csrf));
        form.appendChild(hidden("step_id", stepId));
        const label = element("label", { for: `comment-${stepId}` }, `Decide step ${stepId}: comment`);
        form.appendChild(label);
        form.appendChild(element("input", { id: `comment-${stepId}`, name: "comment" }));
        form.appendChild(element("button", { type: "submit", name: "approved", value: "true" }, `Approve ${stepId}`));
        form.appendChild(element("button", { type: "submit", name: "approved", value: "false" }, `Reject ${stepId}`));
        forms.appendChild(form);
      }
      if (state.intervene) {
        const form = element("form", { method: "post", action: `/executions/${encodeURIComponent(id)}/intervene`, class: "intervene" });
        form.appendChild(hidden("csrf", csrf));
        form.appendChild(element("label", { for: "intervene-action" }, "Intervene"));
        const action = element("select", { id: "intervene-action", name: "action" });
        for (const [value, name] of [["INTERVENTION_ACTION_PAUSE", "Pause"], ["INTERVENTION_ACTION_RESUME", "Resume"],
          ["INTERVENTION_ACTION_RETRY", "Retry"], ["INTERVENTION_ACTION_REASSIGN", "Reassign"],
          ["INTERVENTION_ACTION_OVERRIDE_OUTPUT", "Override output"], ["INTERVENTION_ACTION_CANCEL", "Cancel"]]) {
          action.appendChild(element("option", { value }, name));
        }
        form.appendChild(action);
        form.appendChild(element("label", { for: "intervene-step" }, "step (empty: the whole execution)"));
        const step = element("select", { id: "intervene-step", name: "step_id" });
        step.appendChild(element("option", { value: "" }, "whole execution"));
        for (const candidate of state.execution.steps || []) step.appendChild(element("option", { value: candidate.step_id }, candidate.step_id));
        form.appendChild(step);
        form.appendChild(element("label", { for: "intervene-target" }, "new agent"));
        form.appendChild(element("input", { id: "intervene-target", name: "target_agent_id" }));
        form.appendChild(element("label", { for: "intervene-output" }, "output (JSON)"));
        form.appendChild(element("input", { id: "intervene-output", name: "output" }));
        form.appendChild(element("label", { for: "intervene-reason" }, "reason"));
        form.appendChild(element("input", { id: "intervene-reason", name: "reason" }));
        form.appendChild(element("button", { type: "submit" }, "Apply"));
        forms.appendChild(form);
      }
      if (!forms.children.length) forms.appendChild(element("p", {}, "Nothing for you to do here."));
    }

    let refreshing = null;
    function refresh() {
      if (refreshing) return;
      refreshing = setTimeout(async () => {
        try {
          const answer = await fetch(`/executions/${encodeURIComponent(id)}/state`, { credentials: "same-origin" });
          if (answer.ok) { state = await answer.json(); paint(); }
        } finally { refreshing = null; }
      }, 200);
    }

    function timeline(event) {
      const kind = (event.event_type || "").replace("EVENT_TYPE_", "").toLowerCase().replace(/_/g, " ");
      const item = element("li", {}, `${event.occurred_at || ""} ${event.step_id || "execution"}: ${kind}` +
        (event.agent_id ? ` by ${event.agent_id}` : "") + (event.error && event.error.message ? ` — ${event.error.message}` : ""));
      $("#timeline").appendChild(item);
    }

    // An ended execution changes no more: its events fill the timeline only.
    const ended = () => ["COMPLETED", "FAILED", "CANCELLED"].some((end) => state.execution.status.endsWith(end));
    paint();
    const source = new EventSource(`/executions/${encodeURIComponent(id)}/events`);
    source.addEventListener("step", (message) => { timeline(JSON.parse(message.data)); if (!ended()) refresh(); });
    source.addEventListener("end", () => { source.close(); if (!ended()) refresh(); });
    source.onerror = () => { source.close(); if (!ended()) refresh(); };
  }

  // ----- The process editor -----

  function editorPage(root) {
    const csrf = root.dataset.csrf;
    const agents = jsonData("agents") || [];
    const text = $("#source");
    const gutter = $("#gutter");
    let analysing = null;
    let marks = new Map();

    async function call(path, body) {
      const answer = await fetch(path, {
        method: "POST", credentials: "same-origin",
        headers: { "content-type": "application/json", "x-csrf-token": csrf },
        body: JSON.stringify(body),
      });
      const reply = await answer.json();
      if (!answer.ok) throw new Error(reply.error || answer.statusText);
      return reply;
    }

    function drawGutter() {
      const count = text.value.split("\n").length;
      const items = [];
      for (let line = 1; line <= count; line += 1) {
        const item = element("li", { "data-line": String(line) }, String(line));
        const mark = marks.get(line);
        if (mark) { item.classList.add(mark.severity === "error" ? "marked-error" : "marked-warning"); item.title = mark.message; }
        items.push(item);
      }
      gutter.replaceChildren(...items);
      gutter.scrollTop = text.scrollTop;
    }

    function goTo(line, column) {
      const lines = text.value.split("\n");
      let offset = 0;
      for (let index = 0; index < line - 1 && index < lines.length; index += 1) offset += lines[index].length + 1;
      offset += Math.max(0, column - 1);
      text.focus();
      text.setSelectionRange(offset, offset);
    }

    function drawDiagnostics(reply) {
      const list = $("#diagnostics");
      marks = new Map();
      list.replaceChildren();
      for (const diagnostic of reply.diagnostics) {
        if (!marks.has(diagnostic.line) || diagnostic.severity === "error") marks.set(diagnostic.line, diagnostic);
        const item = element("li", { class: diagnostic.severity, "data-line": String(diagnostic.line), "data-column": String(diagnostic.column) });
        const place = element("button", { type: "button" }, `Line ${diagnostic.line}, column ${diagnostic.column}`);
        place.addEventListener("click", () => goTo(diagnostic.line, diagnostic.column));
        item.appendChild(place);
        item.appendChild(document.createTextNode(` ${diagnostic.severity} ${diagnostic.code}: ${diagnostic.message}`));
        list.appendChild(item);
      }
      if (!reply.diagnostics.length) list.appendChild(element("li", { class: "ok" }, "No problems: the process is valid."));
      drawGutter();
    }

    function choice(name, stepId, chosen, multiple) {
      const select = element("select", { name, "data-step": stepId, "aria-label": `${name} of step ${stepId}` });
      if (multiple) { select.multiple = true; select.size = Math.min(4, Math.max(2, agents.length)); }
      else select.appendChild(element("option", { value: "" }, "(none)"));
      const known = new Set(agents);
      for (const agent of agents.concat(chosen.filter((name) => !known.has(name)))) {
        const option = element("option", { value: agent }, agent);
        option.selected = chosen.includes(agent);
        select.appendChild(option);
      }
      select.addEventListener("change", () => editRoles(stepId));
      return select;
    }

    function drawMatrix(reply) {
      const note = $("#matrix-note");
      if (!reply.rows) { note.textContent = `The matrix waits for readable YAML: ${reply.matrix_problem}`; return; }
      note.textContent = "";
      const body = $("#matrix tbody");
      const rows = reply.rows.map((row) => {
        const tr = element("tr", { "data-step": row.step_id });
        tr.appendChild(element("th", { scope: "row" }, row.name === row.step_id ? row.step_id : `${row.name} (${row.step_id})`));
        for (const [name, chosen, multiple] of [["executor", row.executor ? [row.executor] : [], false],
          ["monitors", row.monitors, true], ["informed", row.informed, true]]) {
          const cell = element("td");
          cell.appendChild(choice(name, row.step_id, chosen, multiple));
          tr.appendChild(cell);
        }
        return tr;
      });
      body.replaceChildren(...rows);
    }

    async function editRoles(stepId) {
      const row = $(`#matrix tr[data-step="${CSS.escape(stepId)}"]`);
      const picked = (name) => Array.from(row.querySelector(`select[name="${name}"]`).selectedOptions).map((option) => option.value).filter(Boolean);
      try {
        const reply = await call("/editor/roles", {
          source: text.value, step_id: stepId,
          executor: picked("executor")[0] || "", monitors: picked("monitors"), informed: picked("informed"),
        });
        text.value = reply.source;
        analyse();
      } catch (error) {
        $("#matrix-note").textContent = `The roles were not changed: ${error.message}`;
      }
    }

    async function analyse() {
      try {
        const reply = await call("/editor/analyse", { source: text.value });
        drawDiagnostics(reply);
        drawMatrix(reply);
      } catch (error) {
        $("#diagnostics").replaceChildren(element("li", { class: "error" }, `Not checked: ${error.message}`));
      }
    }

    text.addEventListener("input", () => {
      drawGutter();
      clearTimeout(analysing);
      analysing = setTimeout(analyse, 250);
    });
    text.addEventListener("scroll", () => { gutter.scrollTop = text.scrollTop; });
    drawGutter();
    analyse();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const execution = $(".execution");
    if (execution) executionPage(execution);
    const editor = $(".editor");
    if (editor) editorPage(editor);
  });
})();
