// The research page: speaks only the public protocol (/ws, /api/retrievers, /api/reports, /api/jobs,
// /api/documents, /reports/...). All strings come from strings.js; reports are Markdown rendered by
// marked and sanitized by DOMPurify before they touch the page.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_ITEM = "fedresearch.key";
  const USER_ITEM = "fedresearch.user";
  const LANG_ITEM = "fedresearch.lang";
  const PICKED_ITEM = "fedresearch.retrievers";
  const HISTORY_ITEM = "fedresearch.history";
  const RESEARCH_ITEM = "fedresearch.research"; // the running task, per tab: sessionStorage
  const BACKOFF_S = [0.5, 1, 2, 4, 8, 15];

  // ---- strings --------------------------------------------------------------------------------
  let lang = localStorage.getItem(LANG_ITEM) ||
    ((navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en");

  function t(name, values) {
    const table = window.STRINGS[lang] || window.STRINGS.en;
    let text = table[name] ?? window.STRINGS.en[name] ?? name;
    for (const [key, value] of Object.entries(values || {})) text = text.replaceAll(`{${key}}`, String(value));
    return text;
  }

  function applyStrings() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    for (const element of document.querySelectorAll("[data-i18n]")) element.textContent = t(element.dataset.i18n);
    for (const element of document.querySelectorAll("[data-i18n-placeholder]")) {
      element.placeholder = t(element.dataset.i18nPlaceholder);
    }
    renderReportTypes();
    renderRetrieverChoices();
    placeUserBox();
    renderProgress();
    renderReport();
    renderDownloads();
    renderHistory();
    renderUpload();
  }

  // ---- small helpers --------------------------------------------------------------------------
  function element(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  const apiKey = () => localStorage.getItem(KEY_ITEM) || "";
  // a user's key acts as its user only (the server says so): a user id kept from another key is not sent
  const userId = () => (caller && !caller.may_name_user ? "" : (localStorage.getItem(USER_ITEM) || "").trim());

  class PageError extends Error {}

  function notify(message) {
    if (!message) return;
    $("notice-text").textContent = message;
    $("notice").hidden = false;
  }

  function clearNotice() {
    $("notice").hidden = true;
    $("notice-text").textContent = "";
  }

  // ---- HTTP -----------------------------------------------------------------------------------
  async function explain(response) {
    let detail = "";
    try {
      const body = await response.clone().json();
      detail = body.error || body.message || body.detail || "";
    } catch {
      detail = (await response.text()).slice(0, 300);
    }
    const status = response.status;
    if (status === 401) {
      showKeyBox();
      return t("errKey");
    }
    if (status === 403) return t("errForbidden", { detail });
    if (status === 404) return t("errNotFound");
    if (status === 413) return t("errTooLarge", { detail });
    if (status === 429) return t("errBusy", { detail });
    if (status === 503) return t("errUnavailable", { detail });
    if (status >= 500) return t("errServer", { status });
    return t("errBadRequest", { detail: detail || status });
  }

  async function api(path, options) {
    const headers = new Headers((options && options.headers) || {});
    if (apiKey()) headers.set("Authorization", `Bearer ${apiKey()}`);
    let response;
    try {
      response = await fetch(new URL(path, document.baseURI), { ...options, headers });
    } catch {
      throw new PageError(t("errNetwork"));
    }
    if (!response.ok) {
      const error = new PageError(await explain(response));
      error.status = response.status;
      throw error;
    }
    return response;
  }

  function withUser(path) {
    const url = new URL(path, document.baseURI);
    if (userId()) url.searchParams.set("user_id", userId());
    return url.pathname.slice(1) + url.search;
  }

  // ---- access: API key and user ---------------------------------------------------------------
  function showKeyBox() {
    $("key-box").hidden = false;
    $("access").hidden = false;
    $("access").open = true;
  }

  // Where the user id is asked, from what GET /api/retrievers says of this key: beside the question
  // when no user is known (no default user, and the key names none), for research needs one; under
  // Access for an admin who may act as another user than the default; nowhere for a user's key.
  // Before the server has said (or when it could not), under Access, as a fallback.
  function placeUserBox() {
    const box = $("user-box");
    const needed = Boolean(caller && caller.user_id_required);
    box.hidden = caller ? !caller.may_name_user : !retrieversFailed;
    const place = needed ? $("user-slot") : $("access");
    if (box.parentElement !== place) place.append(box);
    box.classList.toggle("needed", needed); // as it is while typed in: the page does not shift under a click
    $("user-label").textContent = t(needed ? "yourLibrary" : "userId");
    $("user-hint").textContent = needed ? t("yourLibraryHint") :
      caller && caller.user_id ? t("userIdDefault", { user: caller.user_id }) : t("userIdHint");
    $("user-id").placeholder = !needed && caller && caller.user_id ? caller.user_id : "";
    $("access").hidden = $("key-box").hidden && (box.hidden || needed);
  }

  // the user id as typed, kept (also when a form is sent before the field lost focus)
  function keepUserId() {
    const typed = $("user-id").value.trim();
    if ($("user-box").hidden || typed === (localStorage.getItem(USER_ITEM) || "").trim()) return;
    localStorage.setItem(USER_ITEM, typed);
    placeUserBox();
    loadHistory();
  }

  function setUpAccess() {
    $("api-key").value = apiKey();
    $("user-id").value = userId();
    if (apiKey()) $("key-box").hidden = false;
    $("save-key").addEventListener("click", () => {
      localStorage.setItem(KEY_ITEM, $("api-key").value.trim());
      clearNotice();
      reconnectFresh();
      loadServerData();
    });
    $("forget-key").addEventListener("click", () => {
      localStorage.removeItem(KEY_ITEM);
      $("api-key").value = "";
      reconnectFresh();
      loadHistory();
    });
    $("user-id").addEventListener("change", keepUserId);
    $("user-id").addEventListener("input", () => $("user-box").classList.remove("missing"));
  }

  // ---- what a report can be: its types and formats (GET /api/report_forms) ----------------------
  let reportForms = null;

  async function loadReportForms() {
    try {
      reportForms = await (await api("api/report_forms")).json();
    } catch (error) {
      notify(error.message);
      return;
    }
    renderReportTypes();
  }

  function renderReportTypes() {
    if (!reportForms) return;
    const select = $("report-type");
    const chosen = select.value;
    select.replaceChildren(...reportForms.report_types.map((form) => {
      const key = `type_${form.name}`; // this page's own words for the types it knows, else the server's
      return element("option", { value: form.name, title: form.description, text: key in window.STRINGS.en ? t(key) : form.label });
    }));
    if (chosen) select.value = chosen;
  }

  // ---- retrievers, and what this key's tasks run as and within (GET /api/retrievers) -------------
  let retrievers = null;
  let caller = null; // {user_id, user_id_required, may_name_user, max_task_chars, default_retrievers}
  let retrieversFailed = false;

  async function loadRetrievers() {
    let body;
    try {
      body = await (await api("api/retrievers")).json();
    } catch (error) {
      retrievers = null;
      caller = null;
      retrieversFailed = error.status !== 401; // a key is asked for: the user box waits for it
      $("retriever-list").textContent = error.message;
      notify(error.message);
      placeUserBox();
      return;
    }
    retrievers = body.retrievers;
    const { user_id, user_id_required, may_name_user, max_task_chars, default_retrievers } = body;
    caller = { user_id, user_id_required, may_name_user, max_task_chars, default_retrievers: default_retrievers || {} };
    retrieversFailed = false;
    $("user-id").value = userId();
    placeUserBox();
    renderRetrieverChoices();
  }

  // the retrievers a task would run: those ticked, else the server's defaults for the chosen source
  function plannedRetrievers() {
    const picked = pickedRetrievers();
    const names = picked.length ? picked : caller.default_retrievers[$("report-source").value] || [];
    return (retrievers || []).filter((retriever) => names.includes(retriever.name));
  }

  const USER_ID = /^[\p{L}\p{N}_.@:+-]{1,128}$/u; // core/models.py checked_user_id, as the server checks it

  // what the server would refuse a task for that the page can tell before sending it, in words
  function whyNotSend(question) {
    $("user-box").classList.remove("missing");
    if (!caller) return null;
    const length = [...question].length; // characters as the server counts them (code points)
    if (length > caller.max_task_chars) {
      return t("errTooLong", { length: number(length), limit: number(caller.max_task_chars) });
    }
    if (userId() && !USER_ID.test(userId())) return missingUser("errUserShape");
    const needsUser = plannedRetrievers().some((retriever) => retriever.needs_user);
    if (needsUser && caller.user_id_required && !userId()) return missingUser("errNoUser");
    return null;
  }

  function whyNotUpload() {
    $("user-box").classList.remove("missing");
    if (!caller) return null;
    if (userId() && !USER_ID.test(userId())) return missingUser("errUserShape");
    return caller.user_id_required && !userId() ? missingUser("errNoUserUpload") : null;
  }

  function missingUser(message) {
    $("user-box").classList.add("missing");
    $("user-id").focus();
    return t(message);
  }

  const number = (value) => Number(value).toLocaleString(lang === "zh" ? "zh-CN" : "en");

  function pickedRetrievers() {
    return [...document.querySelectorAll("#retriever-list input:checked")].map((box) => box.value);
  }

  function renderRetrieverChoices() {
    if (!retrievers) return;
    const picked = new Set(JSON.parse(localStorage.getItem(PICKED_ITEM) || "[]"));
    const list = $("retriever-list");
    list.replaceChildren();
    for (const retriever of retrievers) {
      const box = element("input", {
        type: "checkbox", value: retriever.name, disabled: !retriever.configured,
        checked: retriever.configured && picked.has(retriever.name),
        onchange: () => localStorage.setItem(PICKED_ITEM, JSON.stringify(pickedRetrievers())),
      });
      const why = retriever.configured ? null :
        element("span", { class: "reason", text: t("notConfigured", { reason: retriever.reason || "" }) });
      list.append(element("label", { class: retriever.configured ? "choice" : "choice off", "data-name": retriever.name },
        box, element("span", { class: "name", text: retriever.name }),
        element("span", { class: "kind", text: retriever.kind }), why));
    }
  }

  // ---- one research run: the model the page renders -------------------------------------------
  let run = newRun();

  function newRun(question) {
    return {
      question: question || "", researchId: null, rows: new Map(), pages: new Map(), logs: [],
      markdown: "", files: null, status: "", finished: false, references: 0, resuming: false, reopened: null,
      chat: [], failed: null, questionOpen: false,
      scrolled: false, // its report was brought into view, or the reader scrolled themselves meanwhile
    };
  }

  function row(name) {
    if (!run.rows.has(name)) run.rows.set(name, { state: "waiting", count: null, elapsed: null, started: null, note: "" });
    return run.rows.get(name);
  }

  const STEPS = {
    starting_research(meta) {
      for (const name of meta.retrievers || []) row(name);
      if (meta.research_id) rememberResearch(meta.research_id);
    },
    retriever_started(meta) {
      Object.assign(row(meta.retriever || meta.name), { state: "searching", started: performance.now() });
    },
    retriever_done(meta) {
      Object.assign(row(meta.name), {
        state: "done", count: meta.count, elapsed: meta.elapsed_ms, cached: Boolean(meta.cached),
      });
    },
    retriever_failed(meta) {
      Object.assign(row(meta.name), { state: "failed", elapsed: meta.elapsed_ms, note: meta.error || "" });
    },
    retriever_skipped(meta) {
      Object.assign(row(meta.name), { state: "skipped", note: meta.error || "" });
    },
    fetching(meta) {
      if (meta.url) run.pages.set(meta.url, meta);
    },
    report_written(meta) {
      if (meta.files) run.files = meta.files;
    },
  };

  function onLog(frame) {
    const meta = frame.metadata || {};
    const step = STEPS[frame.content];
    if (step) step(meta);
    run.logs.push(frame.output || "");
    if (frame.output) run.status = frame.output;
    // the task could not run or failed: a short report saying why, then `path`, follow; the page
    // shows it as a failure, never as a report
    if (frame.content === "error" && meta.then === "report") {
      run.failed = { reason: frame.output || "", kind: meta.kind || "" };
      run.researchId ??= meta.research_id || null;
      notify(t("couldNotRun", { why: failureWords(run.failed) }));
    } else if (frame.content === "error" || (frame.content === "warning" && frame.output.startsWith("Task already running"))) {
      notify(frame.output);
    }
    // the task itself ended without a report (cancelled on the server): nothing more will come
    if (frame.content === "error" && meta.research_id && meta.research_id === run.researchId && !meta.then) {
      abandon(frame.output);
      return;
    }
    renderProgress();
  }

  function onFrame(text) {
    if (text === "pong") return;
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {
      return;
    }
    if (run.resuming && frame.type === "error") {
      abandon(frame.output);
      return;
    }
    if (frame.type !== "error") run.resuming = false;
    // an `error` frame always comes with its `logs` twin (content "error"), which says it
    if (frame.type === "logs") onLog(frame);
    else if (frame.type === "report") {
      run.markdown += frame.output;
      scheduleReport();
    } else if (frame.type === "path") finish(frame.output);
    else if (frame.type === "chat") answerChat(frame);
  }

  // why a task failed, in the page's words where its kind says enough, else the server's reason
  function failureWords(failed) {
    const key = `why_${failed.kind}`;
    return failed.kind && key in window.STRINGS.en ? t(key) : failed.reason;
  }

  function finish(files) {
    run.finished = true;
    run.files = run.failed ? null : files; // a task that could not run has no report to download
    forgetResearch();
    renderReport();
    run.status = run.failed ? t("failedStatus") : t("finished", { count: run.references });
    renderProgress();
    renderDownloads();
    resetRunButton();
    $("chat-card").hidden = Boolean(run.failed);
    bringReportIntoView();
    const entry = { id: reportId(files) || run.researchId, question: run.question, at: new Date().toISOString() };
    addToHistory(run.failed ? { ...entry, error: failureWords(run.failed) } : { ...entry, files });
  }

  function reportId(files) {
    const name = (files && (files.md || files.json)) || "";
    return name.split("/").pop().split(".")[0];
  }

  // ---- progress table -------------------------------------------------------------------------
  function elapsedText(entry) {
    if (entry.elapsed !== null && entry.elapsed !== undefined) return `${Math.round(entry.elapsed)} ms`;
    if (entry.state === "searching" && entry.started) return `${Math.round(performance.now() - entry.started)} ms…`;
    return "";
  }

  function renderProgress() {
    $("progress").hidden = run.rows.size === 0 && run.logs.length === 0;
    $("stop").hidden = !(run.researchId && !run.finished && $("run").disabled);
    $("status-line").textContent = run.status;
    showQuestion($("run-question"), run.question);
    $("retriever-table").hidden = run.rows.size === 0; // a task refused before it searched has no table
    $("pages-box").hidden = Boolean(run.failed) && run.pages.size === 0;
    const body = $("retriever-table").tBodies[0];
    body.replaceChildren(...[...run.rows].map(([name, entry]) => element("tr", { "data-name": name, "data-state": entry.state },
      element("td", { text: name }),
      element("td", { class: `state ${entry.state}` }, t(`state_${entry.state}`),
        entry.cached ? element("span", { class: "reason", text: ` (${t("cached")})` }) : null,
        entry.note ? element("span", { class: "reason", text: ` — ${entry.note}` }) : null),
      element("td", { class: "number", text: entry.count ?? "" }),
      element("td", { class: "number", text: elapsedText(entry) }))));
    renderPages();
    $("log").replaceChildren(...run.logs.map((line) => element("li", { text: line })));
  }

  function renderPages() {
    const pages = [...run.pages.values()];
    if (pages.length === 0) {
      $("pages").replaceChildren(element("li", { class: "hint", text: t("noPages") }));
      return;
    }
    $("pages").replaceChildren(...pages.map((page) => element("li", { "data-status": page.status },
      element("span", { class: `state ${page.status}`, text: t(`page_${page.status}`) }), " ",
      webLink(page.url),
      page.chars ? element("span", { class: "hint", text: ` ${t("pageChars", { chars: page.chars })}` }) : null,
      page.reason ? element("span", { class: "reason", text: ` — ${page.reason}` }) : null)));
  }

  // a URL the server reports is a link only when it is a web address (never javascript: or file:)
  function webLink(url) {
    if (!/^https?:\/\//i.test(url)) return element("span", { text: url });
    return element("a", { href: url, target: "_blank", rel: "noopener noreferrer", text: url });
  }

  setInterval(() => {
    if ([...run.rows.values()].some((entry) => entry.state === "searching")) renderProgress();
  }, 250);

  // ---- a question, however long, shown in a few lines with a way to see it whole ----------------
  function showQuestion(node, question) {
    if (node.offsetParent === null) return; // hidden: shown, and measured, once its card is
    if (node.shownRun === run && node.shownLang === lang) return;
    node.shownRun = run;
    node.shownLang = lang;
    node.replaceChildren(element("span", { class: "clamp", text: question }));
    clampable(node.firstChild, () => run.questionOpen, (open) => { run.questionOpen = open; });
  }

  // `text` (in the page) shows its first lines; a button after it opens it whole and closes it again,
  // there only when something is cut off
  function clampable(text, isOpen, setOpen, after = text) {
    text.classList.add("clamp");
    text.classList.toggle("open", isOpen());
    const toggle = element("button", {
      type: "button", class: "linkish clamp-toggle", text: t(isOpen() ? "showLess" : "showAll"),
      onclick: () => {
        setOpen(!isOpen());
        text.classList.toggle("open", isOpen());
        toggle.textContent = t(isOpen() ? "showLess" : "showAll");
      },
    });
    after.after(toggle);
    toggle.hidden = !isOpen() && text.scrollHeight <= text.clientHeight + 1;
    return toggle;
  }

  // ---- the report -----------------------------------------------------------------------------
  let reportPending = false;

  function scheduleReport() {
    if (reportPending) return;
    reportPending = true;
    requestAnimationFrame(() => {
      reportPending = false;
      renderReport();
    });
  }

  function renderReport() {
    const article = $("report");
    $("report-card").classList.toggle("failed", Boolean(run.failed));
    if (run.failed) {
      $("report-card").hidden = false;
      article.replaceChildren(element("h1", { text: run.question }),
        element("p", { class: "failure", text: t("couldNotRun", { why: failureWords(run.failed) }) }));
    } else {
      $("report-card").hidden = !run.markdown;
      const html = window.marked.parse(run.markdown, { gfm: true, async: false });
      article.innerHTML = window.DOMPurify.sanitize(html, { USE_PROFILES: { html: true } });
      run.references = linkReferences(article);
    }
    const title = article.firstElementChild;
    if (title && title.tagName === "H1") clampable(title, () => run.questionOpen, (open) => { run.questionOpen = open; });
  }

  // the finished report of a run started here: into view, once the page below it is laid out (else
  // the scroll stops short where the page ended), unless the reader has scrolled since they asked
  // (they are reading something else: the page does not move under them)
  function bringReportIntoView() {
    if (run.scrolled || run.reopened || $("report-card").hidden) return;
    run.scrolled = true;
    $("report-card").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  // what the reader does to scroll (not the page's own changes of height, which move it too)
  const SCROLL_KEYS = new Set(["PageDown", "PageUp", "Home", "End", "ArrowDown", "ArrowUp", " "]);

  function watchReaderScrolling() {
    const scrolled = () => {
      run.scrolled = true;
    };
    window.addEventListener("wheel", scrolled, { passive: true });
    window.addEventListener("touchmove", scrolled, { passive: true });
    window.addEventListener("keydown", (event) => {
      if (SCROLL_KEYS.has(event.key) && !event.target.closest("input, textarea, select, button")) scrolled();
    });
  }

  const REFERENCE_HEADINGS = new Set(["references", "参考文献"]);
  const CITATION = /\[(\d{1,4})\]/g;

  // References become a list with an anchor per entry; each [n] cited in the text becomes a link
  // to its entry (the writer links it to the source, which the entry still opens).
  function linkReferences(article) {
    const heading = [...article.querySelectorAll("h2")].reverse()
      .find((h) => REFERENCE_HEADINGS.has(h.textContent.trim().toLowerCase()));
    const known = new Set();
    if (heading) {
      const blocks = [];
      for (let node = heading.nextElementSibling; node && node.tagName === "P"; node = node.nextElementSibling) {
        blocks.push(node);
      }
      if (blocks.length) {
        const list = element("ol", { class: "references" }, ...referenceLines(blocks).map((line) => referenceItem(line, known)));
        blocks[0].before(list);
        for (const block of blocks) block.remove();
      }
    }
    for (const link of article.querySelectorAll("a[href]")) {
      if (link.getAttribute("href").startsWith(LIBRARY_LINK)) continue; // opened here (openPassage)
      link.target = "_blank";
      link.rel = "noopener noreferrer";
    }
    for (const child of article.children) {
      if (child === heading) break;
      citeIn(child, known);
    }
    return known.size;
  }

  // the nodes of each line of the References paragraphs (Markdown keeps their line breaks as "\n")
  function referenceLines(blocks) {
    const lines = [];
    for (const block of blocks) {
      let line = [];
      lines.push(line);
      for (const node of [...block.childNodes]) {
        if (node.nodeType !== Node.TEXT_NODE) {
          if (node.tagName === "BR") lines.push((line = []));
          else line.push(node);
          continue;
        }
        node.data.split("\n").forEach((piece, index) => {
          if (index > 0) lines.push((line = []));
          if (piece) line.push(document.createTextNode(piece));
        });
      }
    }
    return lines.filter((line) => line.some((node) => node.textContent.trim()));
  }

  function referenceItem(line, known) {
    const first = line[0];
    const match = first.nodeType === Node.TEXT_NODE ? /^\s*\[(\d{1,4})\]\s*/.exec(first.data) : null;
    if (!match) return element("li", {}, ...line);
    first.data = first.data.slice(match[0].length);
    known.add(match[1]);
    return element("li", { id: `ref-${match[1]}` }, element("span", { class: "ref-number", text: `[${match[1]}]` }), " ", ...line);
  }

  function citeIn(block, known) {
    for (const link of [...block.querySelectorAll("a")]) {
      const number = /^\[(\d{1,4})\]$/.exec(link.textContent.trim());
      if (number && known.has(number[1])) toCitation(link, number[1], link.getAttribute("href"));
    }
    const walker = document.createTreeWalker(block, NodeFilter.SHOW_TEXT);
    const texts = [];
    while (walker.nextNode()) {
      if (!walker.currentNode.parentElement.closest("a, code, pre")) texts.push(walker.currentNode);
    }
    for (const text of texts) {
      const parts = text.data.split(CITATION);
      if (parts.length === 1) continue;
      const pieces = parts.map((part, index) => {
        if (index % 2 === 0 || !known.has(part)) return index % 2 === 0 ? part : `[${part}]`;
        return toCitation(element("a"), part, null);
      });
      text.replaceWith(...pieces);
    }
  }

  function toCitation(link, number, source) {
    link.textContent = `[${number}]`;
    link.setAttribute("href", `#ref-${number}`);
    link.className = "cite";
    link.removeAttribute("target");
    if (source) link.title = source;
    return link;
  }

  // ---- downloads ------------------------------------------------------------------------------
  function renderDownloads() {
    const files = run.files || {};
    const kinds = Object.keys(files); // in the server's order (report/exports.py)
    $("downloads-row").hidden = kinds.length === 0;
    $("downloads").replaceChildren(...kinds.map((kind) => element("button", {
      type: "button", class: "download", "data-kind": kind, text: kind.toUpperCase(),
      onclick: (event) => download(event.currentTarget, files[kind], kind),
    })));
  }

  async function download(button, path, kind) {
    const label = button.textContent;
    button.disabled = true;
    button.textContent = t("preparing", { kind: kind.toUpperCase() });
    try {
      const response = await api(path);
      const blob = await response.blob();
      const link = element("a", { href: URL.createObjectURL(blob), download: savedName(response, path) });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
    } catch (error) {
      notify(error.message);
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }

  // the name the server gives the file (Content-Disposition: named after the question, by
  // report/store.py content_disposition), else the last part of its path
  function savedName(response, path) {
    const header = response.headers.get("Content-Disposition") || "";
    const encoded = /filename\*\s*=\s*UTF-8''([^;\s]+)/i.exec(header);
    if (encoded) {
      try {
        return decodeURIComponent(encoded[1]);
      } catch {
        // a malformed escape: the plain name below
      }
    }
    const plain = /filename\s*=\s*"([^"]+)"/i.exec(header) || /filename\s*=\s*([^;\s]+)/i.exec(header);
    return plain ? plain[1] : path.split("/").pop();
  }

  // ---- the research socket: start, resume after a drop ----------------------------------------
  let socket = null;
  let attempts = 0;
  let reconnectTimer = null;

  function socketUrl() {
    const url = new URL("ws", document.baseURI);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (apiKey()) url.searchParams.set("token", apiKey()); // a browser cannot set headers on a WebSocket
    return url.href;
  }

  function openSocket() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(socketUrl());
      let opened = false;
      ws.onopen = () => {
        opened = true;
        socket = ws;
        resolve(ws);
      };
      ws.onmessage = (event) => onFrame(event.data);
      ws.onclose = () => {
        if (!opened) reject(new PageError(t("errSocket")));
        else if (ws === socket) dropped();
      };
    });
  }

  async function readySocket() {
    if (socket && socket.readyState === WebSocket.OPEN) return socket;
    return openSocket();
  }

  function reconnectFresh() {
    const old = socket;
    socket = null;
    if (old) old.close();
  }

  function dropped() {
    socket = null;
    if (run.finished || (!run.researchId && run.rows.size === 0 && !run.markdown)) return;
    if (!run.researchId) {
      run.status = t("stopped");
      notify(t("stopped"));
      resetRunButton();
      renderProgress();
      return;
    }
    scheduleResume(run.researchId);
  }

  function scheduleResume(researchId) {
    const wait = BACKOFF_S[Math.min(attempts, BACKOFF_S.length - 1)];
    attempts += 1;
    run.status = t("reconnecting", { seconds: wait });
    renderProgress();
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(() => resume(researchId), wait * 1000);
  }

  async function resume(researchId) {
    let ws;
    try {
      ws = await openSocket();
    } catch {
      scheduleResume(researchId);
      return;
    }
    attempts = 0;
    const question = run.question;
    run = newRun(question); // the server replays every frame so far
    run.researchId = researchId;
    run.resuming = true;
    run.status = t("resumed");
    ws.send(`resume ${JSON.stringify({ research_id: researchId })}`);
    setRunning();
    renderProgress();
  }

  // the server no longer has the task (unknown, expired, cancelled): say so and stop waiting
  function abandon(message) {
    forgetResearch();
    for (const entry of run.rows.values()) {
      if (entry.state === "waiting" || entry.state === "searching") entry.state = "stopped";
    }
    run.researchId = null;
    run.resuming = false;
    run.status = message;
    notify(message);
    resetRunButton();
    renderProgress();
  }

  // stopping a detached task is deleting it: the server cancels it and keeps nothing
  async function stopResearch() {
    const researchId = run.researchId;
    if (!researchId) return;
    try {
      await api(`api/reports/${encodeURIComponent(researchId)}`, { method: "DELETE" });
      abandon(t("stoppedByYou"));
      loadHistory();
    } catch (error) {
      notify(error.message);
    }
  }

  async function deleteReport(entry) {
    if (!window.confirm(t("confirmDelete"))) return;
    try {
      await api(`api/reports/${encodeURIComponent(entry.id)}`, { method: "DELETE" });
    } catch (error) {
      if (error.status !== 404) notify(error.message);
    }
    localStorage.setItem(HISTORY_ITEM, JSON.stringify(localHistory().filter((old) => old.id !== entry.id)));
    loadHistory();
  }

  function rememberResearch(researchId) {
    run.researchId = researchId;
    sessionStorage.setItem(RESEARCH_ITEM, JSON.stringify({ id: researchId, question: run.question }));
  }

  function forgetResearch() {
    sessionStorage.removeItem(RESEARCH_ITEM);
  }

  function setRunning() {
    $("run").disabled = true;
    $("run").textContent = t("running");
  }

  function resetRunButton() {
    $("run").disabled = false;
    $("run").textContent = t("run");
  }

  function startPayload(question) {
    const headers = {};
    const picked = pickedRetrievers();
    if (picked.length) headers.retrievers = picked.join(",");
    if (userId()) headers.user_id = userId();
    return {
      task: question, report_type: $("report-type").value, report_source: $("report-source").value,
      detach: true, headers,
    };
  }

  async function startResearch(event) {
    event.preventDefault();
    clearNotice();
    keepUserId();
    const question = $("question").value.trim();
    if (!question) {
      notify(t("errQuestion"));
      return;
    }
    const refusal = whyNotSend(question); // said here, in words, rather than sent and refused
    if (refusal) {
      notify(refusal);
      return;
    }
    forgetResearch();
    run = newRun(question);
    run.status = t("connecting");
    $("chat-log").replaceChildren();
    $("chat-card").hidden = true;
    setRunning();
    renderProgress();
    renderReport();
    renderDownloads();
    try {
      const ws = await readySocket();
      ws.send(`start ${JSON.stringify(startPayload(question))}`);
    } catch (error) {
      notify(error.message);
      resetRunButton();
    }
  }

  // ---- chat -----------------------------------------------------------------------------------
  function chatEntry(role, markdown) {
    const body = element("div", { class: "chat-body" });
    body.innerHTML = window.DOMPurify.sanitize(window.marked.parse(markdown, { gfm: true, async: false }));
    for (const link of body.querySelectorAll("a[href]")) {
      link.target = "_blank";
      link.rel = "noopener noreferrer";
    }
    return element("div", { class: `chat ${role}` }, element("strong", { text: t(role === "user" ? "you" : "assistant") }), body);
  }

  async function askChat(event) {
    event.preventDefault();
    const message = $("chat-input").value.trim();
    if (!message) return;
    $("chat-input").value = "";
    $("chat-log").append(chatEntry("user", message), element("div", { class: "chat pending", text: t("thinking") }));
    run.chat.push({ role: "user", content: message });
    try {
      if (run.reopened) await askSavedReport(run.reopened);
      else (await readySocket()).send(`chat ${JSON.stringify({ message })}`);
    } catch (error) {
      document.querySelector("#chat-log .pending")?.remove();
      notify(error.message);
    }
  }

  // a reopened report has no live task on the socket: POST /api/chat answers from the saved report
  async function askSavedReport(researchId) {
    const body = JSON.stringify({ research_id: researchId, messages: run.chat });
    const headers = { "Content-Type": "application/json" };
    const answer = await (await api("api/chat", { method: "POST", headers, body })).json();
    answerChat(answer.response || {});
  }

  function answerChat(frame) {
    if (frame.content) run.chat.push({ role: "assistant", content: frame.content });
    document.querySelector("#chat-log .pending")?.remove();
    $("chat-log").append(chatEntry("assistant", frame.content || ""));
    $("chat-card").hidden = false;
  }

  // ---- past reports ---------------------------------------------------------------------------
  let history = [];
  let historyIsLocal = true;

  function localHistory() {
    try {
      return JSON.parse(localStorage.getItem(HISTORY_ITEM) || "[]");
    } catch {
      return [];
    }
  }

  // whose reports a local entry is: a hash of key and user, so switching keys switches lists (the
  // server still checks every read; this only keeps one person's list from showing another's)
  function ownerTag() {
    let hash = 0x811c9dc5;
    for (const char of `${apiKey()}|${userId()}`) hash = Math.imul(hash ^ char.codePointAt(0), 0x01000193) >>> 0;
    return hash.toString(16);
  }

  function addToHistory(entry) {
    if (!entry.id) return;
    const kept = localHistory().filter((old) => old.id !== entry.id);
    localStorage.setItem(HISTORY_ITEM, JSON.stringify([{ ...entry, owner: ownerTag() }, ...kept].slice(0, 50)));
    loadHistory();
  }

  // a saved report as GET /api/reports lists it (GPT-Researcher's shape), with its job's status and
  // error from GET /api/jobs: a task that could not run or failed is no report. Why, in the page's
  // words where this browser saw it fail on the socket (`seen`), else in the server's.
  function fromServer(report, job, seen) {
    const id = String(report.id ?? report.research_id ?? "");
    const formats = reportForms ? reportForms.formats : [];
    const files = report.files || Object.fromEntries(formats.map((kind) => [kind, `reports/${id}.${kind}`]));
    const question = report.question || report.task || id;
    const entry = { id, question, at: report.timestamp || report.created_at, files, answer: report.answer ?? null };
    const state = job ? job.status : null;
    if (state === "failed" || state === "cancelled") {
      return { ...entry, files: null, answer: null, failed: state, error: (seen && seen.error) || job.error || "" };
    }
    return { ...entry, state };
  }

  // each job's status and error by its id; none known when the server has no GET /api/jobs
  async function jobStates() {
    try {
      const body = await (await api(withUser("api/jobs"))).json();
      return new Map((body.jobs || []).map((job) => [job.research_id, job]));
    } catch {
      return new Map();
    }
  }

  async function loadHistory() {
    try {
      const [body, jobs] = await Promise.all([api(withUser("api/reports")).then((response) => response.json()), jobStates()]);
      const reports = Array.isArray(body) ? body : body.reports || [];
      const seen = new Map(localHistory().filter((entry) => entry.owner === ownerTag()).map((entry) => [entry.id, entry]));
      history = reports.map((report) => {
        const id = String(report.id ?? report.research_id ?? "");
        return fromServer(report, jobs.get(id), seen.get(id));
      });
      historyIsLocal = false;
    } catch (error) {
      if (error.status !== 404 && error.status !== 405) notify(error.message);
      history = localHistory().filter((entry) => entry.owner === ownerTag());
      historyIsLocal = true;
    }
    renderHistory();
  }

  function renderHistory() {
    $("history-note").hidden = !historyIsLocal;
    if (history.length === 0) {
      $("history-list").replaceChildren(element("li", { class: "hint", text: t("historyEmpty") }));
      return;
    }
    $("history-list").replaceChildren(...history.map(historyItem));
    for (const item of $("history-list").children) {
      const text = item.querySelector(".question-text");
      if (!text) continue;
      const id = item.dataset.id;
      const isOpen = () => openQuestions.has(id);
      const setOpen = (open) => (open ? openQuestions.add(id) : openQuestions.delete(id));
      clampable(text, isOpen, setOpen, text.closest("button") || text);
    }
  }

  const openQuestions = new Set(); // the history's questions shown whole

  // a report reopens; a task that could not run or failed says why, with nothing to open, download or ask
  function historyItem(entry) {
    const failed = entry.failed || (entry.error ? "failed" : null);
    const text = element("span", { class: "question-text", text: entry.question });
    const question = failed ? element("div", { class: "question" }, text) :
      element("button", { type: "button", class: "linkish question", onclick: () => reopen(entry) }, text);
    const why = failed ? element("span", {
      class: "failure", text: t(failed === "cancelled" ? "stoppedRun" : "couldNotRun", { why: entry.error || "" }),
    }) : null;
    const running = entry.state === "running" || entry.state === "queued";
    return element("li", { "data-id": entry.id, "data-state": failed || entry.state || "completed", class: failed ? "failed" : null },
      question, why,
      running ? element("span", { class: "hint", text: t("stillRunning") }) : null,
      entry.at ? element("span", { class: "hint", text: ` ${new Date(entry.at).toLocaleString(lang)}` }) : null,
      element("button", {
        type: "button", class: "quiet delete", text: t("deleteReport"), onclick: () => deleteReport(entry),
      }));
  }

  // a past report: its Markdown (from the list, or its file), its retriever table from its record;
  // a job still running is followed again instead
  async function reopen(entry) {
    clearNotice();
    try {
      let markdown = entry.answer;
      if (markdown === null && !historyIsLocal) {
        const job = await (await api(`api/jobs/${encodeURIComponent(entry.id)}`)).json();
        if (!job.status || job.status === "running" || job.status === "queued") {
          run = newRun(entry.question);
          resume(entry.id);
          return;
        }
        if (!job.report) throw new PageError(job.error || t("errNotFound"));
        markdown = job.report;
      }
      markdown ??= await (await api(entry.files.md)).text();
      run = newRun(entry.question);
      Object.assign(run, { markdown, files: entry.files, finished: true, reopened: entry.id });
      if (entry.files.json) await restoreOutcomes(entry.files.json);
      renderProgress();
      renderReport();
      renderDownloads();
      $("chat-log").replaceChildren();
      $("chat-card").hidden = historyIsLocal; // chat about a saved report needs the server's POST /api/chat
      $("report-card").scrollIntoView({ behavior: "smooth" });
    } catch (error) {
      notify(error.message);
    }
  }

  // the saved record says how each retriever fared: the reopened report shows its table again
  async function restoreOutcomes(path) {
    try {
      const record = await (await api(path)).json();
      for (const outcome of record.retrievers || []) {
        Object.assign(row(outcome.name), {
          state: outcome.status, count: outcome.status === "done" ? outcome.count : null,
          elapsed: outcome.status === "skipped" ? null : outcome.elapsed_ms, note: outcome.error || "",
        });
      }
    } catch {
      // the report itself opened; without its record the table stays empty
    }
  }

  // ---- uploads --------------------------------------------------------------------------------
  let uploaded = null;

  async function upload(event) {
    event.preventDefault();
    clearNotice();
    const files = [...$("upload-files").files];
    if (files.length === 0) {
      notify(t("uploadPick"));
      return;
    }
    keepUserId();
    const refusal = whyNotUpload();
    if (refusal) {
      notify(refusal);
      return;
    }
    const form = new FormData();
    for (const file of files) form.append("files", file, file.name);
    $("upload-send").disabled = true;
    $("upload-summary").textContent = t("uploading", { count: files.length });
    try {
      const path = withUser(`api/documents?kind=${encodeURIComponent($("upload-kind").value)}`);
      uploaded = await (await api(path, { method: "POST", body: form })).json();
      $("upload-files").value = "";
    } catch (error) {
      uploaded = null;
      $("upload-summary").textContent = "";
      notify(error.message);
    } finally {
      $("upload-send").disabled = false;
    }
    renderUpload();
  }

  function uploadDetail(file) {
    if (file.reason) return file.reason;
    return file.documents !== undefined ? t("documentsCount", { count: file.documents }) : "";
  }

  function renderUpload() {
    $("upload-result").hidden = !uploaded;
    if (!uploaded) return;
    $("upload-summary").textContent = t("uploadSummary", uploaded);
    $("upload-result").tBodies[0].replaceChildren(...uploaded.files.map((file) => element("tr", { "data-status": file.status },
      element("td", { text: file.file }),
      element("td", { class: `state ${file.status}`, text: t(`status_${file.status}`) }),
      element("td", { class: "reason", text: uploadDetail(file) }))));
  }

  // ---- start ----------------------------------------------------------------------------------
  async function loadServerData() {
    await loadReportForms(); // first: the history's downloads are its formats
    loadRetrievers();
    loadHistory();
  }

  // ---- a library passage a reference names ---------------------------------------------------
  // A reference to a note or a PDF page links to #library/<document>[/<passage>][?page=<n>]: its
  // document's passages are shown here, the cited one marked (the exports print the link as text).
  const LIBRARY_LINK = "#library/";

  async function openPassage(href) {
    const match = /^#library\/(\d+)(?:\/(\d+))?(?:\?page=(\d+))?$/.exec(href);
    if (!match) return;
    const [, documentId, passageId, page] = match;
    const view = $("passage-view");
    const body = $("passage-body");
    $("passage-title").textContent = t("libraryPassage");
    body.replaceChildren(element("p", { class: "status", text: t("loading") }));
    if (!view.open) view.showModal();
    let found;
    try {
      found = await (await api(withUser(`api/documents/${documentId}/passages`))).json();
    } catch (error) {
      body.replaceChildren(element("p", { class: "failure", text: error.status === 404 ? t("passageMissing") : error.message }));
      return;
    }
    $("passage-title").textContent = found.document.title || found.document.source;
    let cited = null;
    const items = found.passages.map((passage) => {
      const where = [passage.heading, passage.page !== null ? t("pageNumber", { page: passage.page }) : ""]
        .filter(Boolean).join(" · ");
      const item = element("section", { class: "passage" },
        where ? element("h3", { text: where }) : null, element("p", { text: passage.text }));
      const isCited = passageId ? passage.id === passageId : page && String(passage.page) === page;
      if (isCited && !cited) {
        item.classList.add("cited");
        cited = item;
      }
      return item;
    });
    body.replaceChildren(...items);
    if (cited) cited.scrollIntoView({ block: "center" });
  }

  function resumeAfterReload() {
    let saved = null;
    try {
      saved = JSON.parse(sessionStorage.getItem(RESEARCH_ITEM) || "null");
    } catch {
      saved = null;
    }
    if (!saved || !saved.id) return;
    run = newRun(saved.question);
    run.researchId = saved.id;
    $("question").value = saved.question || "";
    resume(saved.id);
  }

  function main() {
    setUpAccess();
    applyStrings();
    $("language").addEventListener("click", () => {
      lang = lang === "zh" ? "en" : "zh";
      localStorage.setItem(LANG_ITEM, lang);
      applyStrings();
    });
    $("notice-close").addEventListener("click", clearNotice);
    watchReaderScrolling();
    $("stop").addEventListener("click", stopResearch);
    $("ask-form").addEventListener("submit", startResearch);
    $("question").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("ask-form").requestSubmit();
    });
    $("chat-form").addEventListener("submit", askChat);
    document.addEventListener("click", (event) => {
      const link = event.target.closest && event.target.closest(`a[href^="${LIBRARY_LINK}"]`);
      if (!link) return;
      event.preventDefault();
      openPassage(link.getAttribute("href"));
    });
    $("passage-close").addEventListener("click", () => $("passage-view").close());
    $("upload-form").addEventListener("submit", upload);
    window.addEventListener("online", () => {
      if (!socket && run.researchId && !run.finished) resume(run.researchId);
    });
    loadServerData();
    resumeAfterReload();
  }

  main();
})();
